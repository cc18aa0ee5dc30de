"""helpers.rehearse_batch_job: an sbatch script run with bash and stand-ins for nvidia-smi and
srun (lesson 04's batch-job challenge)."""

from __future__ import annotations

import pytest

from helpers.core.batch_job import STANDIN_FIELDS, rehearse_batch_job

TRAIN = "import sys, time; time.sleep(0.4); sys.exit(int(open('exit').read()))"
LOGGED = """#!/bin/bash
#SBATCH --gpus=1
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv -l 5 > gpu.csv &
pid=$!
srun python train.py
status=$?
kill $pid
exit $status
"""


@pytest.mark.parametrize("code", [0, 3])
def test_the_job_logs_while_training_and_keeps_the_exit_code(code):
    result = rehearse_batch_job(LOGGED, {"train.py": TRAIN, "exit": str(code)}, job_id=7)
    assert result.returncode == code
    assert result.left_running == 0
    lines = result.files["gpu.csv"].splitlines()
    assert lines[0] == "index, memory.used [MiB], utilization.gpu [%]"
    assert len(lines) >= 3  # -l 5 at 50x: a row every 0.1 s while training sleeps 0.4 s
    assert lines[1] == "0, 31012 MiB, 97 %"
    assert set(result.files) == {"gpu.csv"}  # the inputs are not reported back


def test_a_logger_left_running_is_counted_and_stopped():
    script = LOGGED.replace("kill $pid\n", "")
    result = rehearse_batch_job(script, {"train.py": TRAIN, "exit": "0"})
    assert result.left_running == 1 and result.returncode == 0


def test_slurm_variables_and_formats():
    script = ("#!/bin/bash\necho job $SLURM_JOB_ID\n"
              "nvidia-smi --query-gpu=memory.total,name --format=csv,noheader,nounits\n"
              "nvidia-smi --query-gpu=memory.totl --format=csv || echo exit $?\n"
              "nvidia-smi --query-gpu=name || echo exit $?\n"
              "nvidia-smi topo -m || echo exit $?\n")
    result = rehearse_batch_job(script, job_id=99)
    lines = result.output.splitlines()
    assert lines[:2] == ["job 99", f"46068, {STANDIN_FIELDS['name'][1]}"]
    assert 'Field "memory.totl" is not a valid field to query.' in lines
    assert "Missing --format argument." in result.output
    assert "is not rehearsed here" in result.output
    assert lines.count("exit 2") == 3


def test_the_loop_writes_to_a_file_with_f():
    script = ("#!/bin/bash\nnvidia-smi --query-gpu=name --format=csv,noheader -lms 100 "
              "-f smi.log &\nsleep 0.3\nkill %1\nwait\n")
    result = rehearse_batch_job(script, speedup=1)
    assert result.files["smi.log"].splitlines()[0] == STANDIN_FIELDS["name"][1]
    assert result.left_running == 0


def test_srun_needs_a_command():
    result = rehearse_batch_job("#!/bin/bash\nsrun\n")
    assert result.returncode != 0 and "give the command to run" in result.output


def test_timeout_stops_the_script():
    with pytest.raises(TimeoutError, match="timeout=0.5"):
        rehearse_batch_job("#!/bin/bash\nsleep 30\n", timeout=0.5)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"script": 3}, TypeError, "script must be"),
    ({"script": "echo hi"}, ValueError, "#! line"),
    ({"script": "#!/bin/bash", "files": ["train.py"]}, TypeError, "files must be a mapping"),
    ({"script": "#!/bin/bash", "files": {"a/b.py": ""}}, ValueError, "plain file names"),
    ({"script": "#!/bin/bash", "files": {"job.sh": ""}}, ValueError, "not job.sh"),
    ({"script": "#!/bin/bash", "files": {"t.py": 1}}, TypeError, r"files\['t.py'\]"),
    ({"script": "#!/bin/bash", "job_id": 0}, ValueError, "job_id"),
    ({"script": "#!/bin/bash", "job_id": True}, TypeError, "job_id"),
    ({"script": "#!/bin/bash", "speedup": 0.5}, ValueError, "speedup"),
    ({"script": "#!/bin/bash", "timeout": "5"}, TypeError, "timeout"),
])
def test_bad_input_names_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        rehearse_batch_job(**kwargs)
