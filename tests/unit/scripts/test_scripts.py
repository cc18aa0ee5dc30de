"""scripts/: syntax, --help, the commands the SLURM scripts build, and real runs.

The SLURM scripts run under a fake ``srun``/``scontrol`` (written to a temp folder and put
first on PATH): in "record" mode srun only records its arguments; in "run" mode it starts
the command once per node on this machine, so a 2-node job really rendezvouses locally.
"""

import json
import os
import py_compile
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import lean_env
import pytest

from helpers.launch import free_port, run_captured, tf_config, torchrun_command

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "scripts"
SHELL_SCRIPTS = sorted(SCRIPTS.glob("*.sbatch")) + sorted(SCRIPTS.glob("*.sh"))
PY_SCRIPTS = sorted(SCRIPTS.glob("*.py"))
# Every child these tests start sees no GPU: they test launching, resuming and SLURM logic,
# and on a 1-GPU machine two ranks would collide (tests/gpu/test_ddp_nccl_gpu.py runs NCCL).
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}

FAKE_SRUN = r"""#!/bin/bash
# fake srun: record the arguments, then (FAKE_SRUN_MODE) do nothing, sleep, or run the
# command once per node of the fake job, as srun --ntasks-per-node=1 would.
printf '%s\n' "$@" > "$FAKE_SLURM_LOG/srun.args"
printf 'CUDA_VISIBLE_DEVICES=%s\n' "${CUDA_VISIBLE_DEVICES-<unset>}" > "$FAKE_SLURM_LOG/srun.env"
while [[ "${1:-}" == --* ]]; do shift; done
case "${FAKE_SRUN_MODE:-record}" in
  record) exit 0 ;;
  sleep) sleep "${FAKE_SRUN_SLEEP:-5}"; exit 0 ;;
  run)
    pids=()
    for ((n = 0; n < SLURM_NNODES; n++)); do
      SLURM_NODEID=$n SLURM_PROCID=$n "$@" > "$FAKE_SLURM_LOG/node$n.out" 2>&1 &
      pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    exit $rc ;;
esac
"""

FAKE_SCONTROL = r"""#!/bin/bash
echo "$*" >> "$FAKE_SLURM_LOG/scontrol.log"
if [ "$1 $2" = "show hostnames" ]; then tr ',' '\n' <<< "$FAKE_HOSTS"; fi
"""


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        exe = bin_dir / name
        exe.write_text(text)
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)

    # then this test environment's bin/ (python, torchrun): the scripts activate .venv only
    # where it exists (not in .venv-site, or a worktree run with another checkout's venv)
    def env(hosts, **extra):
        return {
            **os.environ,
            "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                     os.environ["PATH"]]),
            "FAKE_SLURM_LOG": str(log), "FAKE_HOSTS": ",".join(hosts),
            "SLURM_JOB_ID": "4242", "SLURM_NNODES": str(len(hosts)),
            "SLURM_JOB_NODELIST": "fake[01-02]", "SLURM_CPUS_PER_TASK": "2",
            **CPU_ONLY, **extra,
        }

    env.log = log
    return env


def srun_args(log) -> list[str]:
    return (log / "srun.args").read_text().splitlines()


@pytest.mark.parametrize("path", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_parse(path):
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert path.read_text().startswith("#!/bin/bash\n")


@pytest.mark.parametrize("path", PY_SCRIPTS, ids=lambda p: p.name)
def test_python_scripts_compile_and_have_help(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "x.pyc"), doraise=True)
    result = run_captured(["python", str(path), "--help"], env=CPU_ONLY, timeout=120).check()
    assert result.output.startswith("usage:")


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("ddp_train.py", ["--epochs", "0"], "--epochs must be positive"),
        ("ddp_train.py", ["--stop-after-steps", "3"], "--checkpoint"),
        ("tf_multiworker.py", ["--workers", "nohost"], "host:port"),
        ("tf_multiworker.py", ["--workers", "a:1,b:2", "--index", "2"], "index"),
        ("stress_ddp.py", ["--runs", "0"], "--runs"),
    ],
)
def test_scripts_reject_bad_arguments(script, args, message):
    result = run_captured(["python", str(SCRIPTS / script), *args], env=CPU_ONLY, timeout=120)
    assert result.returncode != 0 and message in result.output


def test_slurm_ddp_builds_the_torchrun_command(fake_slurm):
    subprocess.run(["bash", "scripts/slurm_ddp.sbatch"], cwd=ROOT, check=True,
                   env=fake_slurm(["gpu-a01", "gpu-a02"]))
    expected = torchrun_command(
        "scripts/ddp_train.py", ["--checkpoint", "checkpoints/ddp-4242.pt", "--epochs", "10"],
        nproc_per_node=4, nnodes=2, rdzv_endpoint="gpu-a01:29500", rdzv_id=4242,
    )
    assert srun_args(fake_slurm.log) == ["--kill-on-bad-exit=1", *expected]


def test_slurm_ddp_takes_gpus_per_node_from_slurm(fake_slurm):
    env = fake_slurm(["n1"], SLURM_GPUS_ON_NODE="8", TRAIN_ARGS="--epochs 1")
    subprocess.run(["bash", "scripts/slurm_ddp.sbatch"], cwd=ROOT, check=True, env=env)
    args = srun_args(fake_slurm.log)
    assert "--nproc_per_node=8" in args and "--nnodes=1" in args
    assert args[-2:] == ["--epochs", "1"]


def test_slurm_ddp_requeues_when_the_time_limit_is_near(fake_slurm):
    env = fake_slurm(["n1"], FAKE_SRUN_MODE="sleep", FAKE_SRUN_SLEEP="3")
    job = subprocess.Popen(["bash", "scripts/slurm_ddp.sbatch"], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while not (fake_slurm.log / "srun.args").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 sends
    out, _ = job.communicate(timeout=20)
    assert job.returncode == 0  # waited for the job step to end after the trap
    assert "requeueing job 4242" in out
    assert "requeue 4242" in (fake_slurm.log / "scontrol.log").read_text().splitlines()


@pytest.mark.parametrize("script", ["slurm_ddp.sbatch", "slurm_tf_multiworker.sbatch"])
def test_script_children_see_no_gpu(fake_slurm, script):
    """These tests check launching, resuming and SLURM logic, not GPUs: on a 1-GPU machine
    two ranks would pick cuda:1 (invalid ordinal) or share cuda:0 (NCCL duplicate GPU), so
    every child runs with CUDA_VISIBLE_DEVICES="" (tests/gpu covers the real NCCL path)."""
    subprocess.run(["bash", f"scripts/{script}"], cwd=ROOT, check=True,
                   env=fake_slurm(["gpu-a01", "gpu-a02"]))
    assert (fake_slurm.log / "srun.env").read_text() == "CUDA_VISIBLE_DEVICES=\n"


def test_slurm_tf_builds_the_worker_list(fake_slurm):
    subprocess.run(["bash", "scripts/slurm_tf_multiworker.sbatch"], cwd=ROOT, check=True,
                   env=fake_slurm(["gpu-a01", "gpu-a02"]))
    args = srun_args(fake_slurm.log)
    assert args == ["--kill-on-bad-exit=1", "python", "scripts/tf_multiworker.py", "--workers",
                    "gpu-a01:23456,gpu-a02:23457", "--epochs", "10", "--checkpoint-dir",
                    "checkpoints/tf-4242"]
    workers = args[4].split(",")
    assert tf_config(workers, 1)["task"] == {"type": "worker", "index": 1}


@pytest.mark.slow
def test_slurm_ddp_really_runs_two_nodes_on_this_machine(fake_slurm, tmp_path):
    env = fake_slurm(["127.0.0.1", "127.0.0.1"], FAKE_SRUN_MODE="run", GPUS_PER_NODE="1",
                     RDZV_PORT=str(free_port()), CHECKPOINT=str(tmp_path / "ddp.pt"),
                     TRAIN_ARGS="--epochs 1 --samples 256")
    subprocess.run(["bash", "scripts/slurm_ddp.sbatch"], cwd=ROOT, check=True, env=env,
                   timeout=240)
    node0 = (fake_slurm.log / "node0.out").read_text()
    assert "world size 2 on cpu (gloo)" in node0  # 2 nodes x 1 process met via c10d
    assert "rank 0 saved" in node0 and (tmp_path / "ddp.pt").is_file()
    assert "terminate called" not in node0 + (fake_slurm.log / "node1.out").read_text()


@pytest.mark.slow
def test_slurm_tf_really_runs_two_workers_on_this_machine(fake_slurm, tmp_path):
    lean_env.require("tensorflow", "the job trains with tf.distribute on two workers")
    port = free_port()
    env = fake_slurm(["127.0.0.1", "127.0.0.1"], FAKE_SRUN_MODE="run", TF_PORT=str(port),
                     TRAIN_ARGS=f"--epochs 2 --samples 256 --checkpoint-dir {tmp_path / 'ck'}")
    subprocess.run(["bash", "scripts/slurm_tf_multiworker.sbatch"], cwd=ROOT, check=True,
                   env=env, timeout=300)
    chief = (fake_slurm.log / "node0.out").read_text()
    assert "2 worker(s), 2 replica(s) in sync: global batch 64 = 2 x 32" in chief, chief
    assert "epoch 2/2" in chief
    assert (tmp_path / "ck" / "checkpoint").is_file()
    assert not list((tmp_path / "ck").glob(".worker*"))  # non-chief scratch copies removed


@pytest.mark.slow
def test_ddp_train_saves_on_a_real_sigterm_and_resumes(tmp_path):
    ckpt, summary = tmp_path / "ddp.pt", tmp_path / "summary.json"
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--standalone",
           "--nproc_per_node=2", str(SCRIPTS / "ddp_train.py"), "--epochs", "500",
           "--checkpoint", str(ckpt), "--summary", str(summary)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **CPU_ONLY}
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env, start_new_session=True)
    seen = []
    try:
        for line in run.stdout:
            seen.append(line)
            if line.startswith("epoch 1/500"):
                run.send_signal(signal.SIGTERM)  # to torchrun, as slurmstepd does
                break
        seen.append(run.stdout.read())
        run.wait(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    output = "".join(seen)
    assert "SIGTERM after step" in output, output
    stopped = json.loads(summary.read_text())
    assert stopped["finished"] is False and stopped["stopped_by"] == "SIGTERM"
    assert (stopped["device"], stopped["backend"]) == ("cpu", "gloo")
    assert "terminate called" not in output

    done = run_captured(["torchrun", "--standalone", "--nproc_per_node=2",
                         str(SCRIPTS / "ddp_train.py"), "--epochs", "2",
                         "--checkpoint", str(ckpt), "--summary", str(summary)],
                        env={"OMP_NUM_THREADS": "1", **CPU_ONLY}, timeout=240).check()
    assert "resumed from" in done.output or "nothing to do" in done.output
    assert json.loads(summary.read_text())["finished"] is True


def _load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), SCRIPTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ddp_train_refuses_more_ranks_than_gpus(monkeypatch):
    """Rank 1 on a 1-GPU node exits with what to do, before cuda:1 fails (CUDA simulated)."""
    ddp_train = _load_script("ddp_train.py")
    monkeypatch.setattr(ddp_train.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ddp_train.torch.cuda, "device_count", lambda: 1)

    def no_cuda(*args, **kwargs):
        raise AssertionError("touched CUDA before checking the rank")

    monkeypatch.setattr(ddp_train.torch.cuda, "set_device", no_cuda)
    monkeypatch.setattr(ddp_train.dist, "init_process_group", no_cuda)
    for key, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exc:
        ddp_train.setup_distributed()
    message = str(exc.value.code)
    assert "local rank 1 needs GPU 1" in message and "sees 1 GPU(s)" in message
    assert "--nproc_per_node=1" in message
