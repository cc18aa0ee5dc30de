import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.launch import (
    DDPPlan,
    command_text,
    ddp_plan,
    free_port,
    run_captured,
    script_path,
    tf_config,
    torchrun_command,
)


def test_plan_one_process_per_gpu_or_two_cpu_processes():
    assert ddp_plan(4) == DDPPlan(4, "cuda", "nccl")
    assert ddp_plan(0) == DDPPlan(2, "cpu", "gloo")
    assert ddp_plan(0, cpu_processes=3).nproc_per_node == 3
    assert "gloo" in repr(ddp_plan(0)) and "one per GPU" in repr(ddp_plan(2))


def test_plan_asks_torch_by_default():
    import torch

    assert ddp_plan().nproc_per_node == (torch.cuda.device_count() or 2)


@pytest.mark.parametrize("kwargs", [{"n_gpus": -1}, {"n_gpus": 1.5}, {"n_gpus": True},
                                    {"n_gpus": 0, "cpu_processes": 0}])
def test_plan_rejects_bad_input(kwargs):
    error = TypeError if kwargs.get("n_gpus") in (1.5, True) else ValueError
    with pytest.raises(error, match="n_gpus|cpu_processes"):
        ddp_plan(**kwargs)


def test_single_node_command_is_standalone():
    cmd = torchrun_command("scripts/ddp_train.py", ["--epochs", 2], nproc_per_node=2)
    assert cmd == ["torchrun", "--standalone", "--nproc_per_node=2", "scripts/ddp_train.py",
                   "--epochs", "2"]
    assert command_text(cmd) == (
        "torchrun --standalone --nproc_per_node=2 scripts/ddp_train.py --epochs 2")


def test_multi_node_command_uses_c10d_rendezvous():
    cmd = torchrun_command(Path("train.py"), nproc_per_node=4, nnodes=2,
                           rdzv_endpoint="node001:29500", rdzv_id=12345)
    assert cmd == ["torchrun", "--nnodes=2", "--nproc_per_node=4", "--rdzv_id=12345",
                   "--rdzv_backend=c10d", "--rdzv_endpoint=node001:29500", "train.py"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"script": "train.sh"}, "script"),
        ({"script": 3}, "script"),
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"nproc_per_node": "2"}, "nproc_per_node"),
        ({"nnodes": 2}, "rdzv_endpoint"),
        ({"nnodes": 0}, "nnodes"),
        ({"rdzv_endpoint": "node001"}, "rdzv_endpoint"),
        ({"rdzv_endpoint": "node001:99999", "rdzv_id": 1}, "rdzv_endpoint"),
        ({"rdzv_endpoint": "node001:29500"}, "rdzv_id"),
        ({"rdzv_endpoint": "n:1", "rdzv_id": 1, "rdzv_backend": "tcp"}, "rdzv_backend"),
    ],
)
def test_command_rejects_bad_input(kwargs, match):
    args = {"script": "train.py", "nproc_per_node": 2, **kwargs}
    wrong_kind = kwargs.get("script") == 3 or kwargs.get("nproc_per_node") == "2"
    with pytest.raises(TypeError if wrong_kind else ValueError, match=match):
        torchrun_command(args.pop("script"), **args)


def test_command_rejects_a_string_as_script_args():
    with pytest.raises(TypeError, match="script_args"):
        torchrun_command("train.py", "--epochs 2", nproc_per_node=1)
    with pytest.raises(TypeError, match="script_args"):
        torchrun_command("train.py", [None], nproc_per_node=1)


def test_script_path_is_relative_and_checked(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[3] / "solutions")
    assert script_path("ddp_train.py") == os.path.join("..", "scripts", "ddp_train.py")
    with pytest.raises(FileNotFoundError, match="ddp_train.py"):
        script_path("nope.py")
    with pytest.raises(ValueError, match="file name"):
        script_path("../etc/passwd")


def test_run_captured_merges_output_and_keeps_failures():
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    result = run_captured(["python", "-c", code])
    assert result.returncode == 3 and not result.ok
    assert "out" in result.output and "err" in result.output
    assert result.command[0] == "python"  # printed as typed, run with this environment
    assert "(exit code 3)" in repr(result)
    with pytest.raises(RuntimeError, match="exited with code 3"):
        result.check()


def test_run_captured_adds_env_and_cwd(tmp_path):
    code = "import os; print(os.environ['GREETING'], os.getcwd())"
    result = run_captured(["python", "-c", code], env={"GREETING": "hi"}, cwd=tmp_path).check()
    assert result.output.split() == ["hi", str(tmp_path)]


def _running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status  # a zombie has exited


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
def test_run_captured_kills_the_whole_group_on_timeout():
    # the child starts a grandchild (as torchrun starts workers) that a plain kill would miss
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); print('grandchild', p.pid, flush=True); "
            "time.sleep(60)")
    with pytest.raises(TimeoutError, match="grandchild") as info:
        run_captured(["python", "-c", code], timeout=3)
    pid = int(re.search(r"grandchild (\d+)", str(info.value)).group(1))
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(pid)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"command": []}, ValueError),
        ({"command": "ls -l"}, TypeError),
        ({"command": ["ls"], "timeout": 0}, ValueError),
        ({"command": ["ls"], "env": {"A": 1}}, TypeError),
        ({"command": ["ls"], "env": ["A=1"]}, TypeError),
        ({"command": ["ls"], "cwd": "/no/such/folder"}, FileNotFoundError),
    ],
)
def test_run_captured_rejects_bad_input(kwargs, error):
    with pytest.raises(error):
        run_captured(kwargs.pop("command"), **kwargs)


def test_torchrun_resolves_to_this_environment():
    result = run_captured(["torchrun", "--help"]).check()
    assert "--nproc_per_node" in result.output or "--nproc-per-node" in result.output
    assert Path(sys.executable).with_name("torchrun").is_file()


def test_free_port_is_a_port():
    assert 1024 <= free_port() <= 65535


def test_tf_config():
    config = tf_config(["node001:23456", "node002:23457"], 1)
    assert config == {"cluster": {"worker": ["node001:23456", "node002:23457"]},
                      "task": {"type": "worker", "index": 1}}
    assert json.loads(json.dumps(config)) == config


@pytest.mark.parametrize(
    ("workers", "index", "match"),
    [
        ([], 0, "must not be empty"),
        ("node001:23456", 0, "list of 'host:port'"),
        (["node001"], 0, "host:port|node001:23456"),
        (["a:1", "a:1"], 0, "distinct"),
        (["a:1", "A:1"], 0, "distinct"),
        (["a:1", "b:2"], 2, "index"),
        (["a:1"], -1, "index"),
        (["a:1"], True, "index"),
    ],
)
def test_tf_config_rejects_bad_input(workers, index, match):
    wrong_kind = isinstance(workers, str) or index is True
    with pytest.raises(TypeError if wrong_kind else ValueError, match=match):
        tf_config(workers, index)
    with pytest.raises(ValueError, match="task_type"):
        tf_config(["a:1"], 0, task_type="chief")


# ------------------------------------------------------------------- cases from the fuzz report
@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 1e300, 10**400, -1, "5", True])
def test_case_5_a_bad_timeout_is_refused_before_the_child_starts(monkeypatch, timeout):
    """Case 5: run_captured(cmd, timeout=inf/nan/1e300) started the command, then failed in
    communicate() and left the child (for torchrun: every worker) running."""

    def must_not_start(*args, **kwargs):
        raise AssertionError("the command was started")

    monkeypatch.setattr(subprocess, "Popen", must_not_start)
    with pytest.raises((TypeError, ValueError), match="timeout"):
        run_captured(["sleep", "2"], timeout=timeout)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
def test_case_5_any_error_after_the_start_kills_the_process_group(tmp_path, monkeypatch):
    """Case 5: an error while waiting (here a KeyboardInterrupt, as from Ctrl-C) kills the
    child's whole process group, grandchildren included, and is raised as it was."""
    pids = tmp_path / "pids"
    code = ("import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); "
            f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}'); time.sleep(60)")
    real = subprocess.Popen.communicate
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            deadline = time.monotonic() + 20
            while not (pids.exists() and " " in pids.read_text()) and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_captured(["python", "-c", code], timeout=30)
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 5
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(pid)


def test_case_11_a_very_long_script_name_is_a_clear_error():
    """Case 11 (script_path): 'x' * 5000 gave OSError: File name too long."""
    with pytest.raises(ValueError, match="name is too long"):
        script_path("x" * 5000)
    with pytest.raises(TypeError, match="name must be a string"):
        script_path(5)


def test_rdzv_id_must_be_an_id():
    """torchrun_command(rdzv_id=['a b']) wrote --rdzv_id=['a b'] into the command."""
    with pytest.raises(TypeError, match="rdzv_id"):
        torchrun_command("t.py", nproc_per_node=2, rdzv_endpoint="h:1", rdzv_id=["a b"])
    with pytest.raises(ValueError, match="rdzv_id"):
        torchrun_command("t.py", nproc_per_node=2, rdzv_endpoint="h:1", rdzv_id="a b")
    cmd = torchrun_command("t.py", nproc_per_node=2, rdzv_endpoint="h:1", rdzv_id=12345)
    assert "--rdzv_id=12345" in cmd


# ----------------------------------------------------------------------------------- properties
ANYTHING = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                     st.binary(max_size=4), st.lists(st.text(max_size=3), max_size=2),
                     st.just(object()))
HOST = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
ENDPOINT = st.builds(lambda h, p: f"{h}:{p}", HOST, st.integers(1, 65535))


def _only_named_errors(name, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        assert name in str(exc), (name, str(exc))
        return None


@given(st.one_of(st.none(), st.integers(0, 4096)), st.integers(1, 4096))
def test_ddp_plan_for_any_machine(n_gpus, cpu_processes):
    plan = ddp_plan(n_gpus if n_gpus is not None else 0, cpu_processes=cpu_processes)
    assert plan.nproc_per_node >= 1 and plan.backend in ("nccl", "gloo")
    assert repr(plan) == plan.text()


@given(ANYTHING, ANYTHING)
def test_ddp_plan_names_bad_arguments(n_gpus, cpu_processes):
    try:
        ddp_plan(n_gpus, cpu_processes=cpu_processes)
    except (TypeError, ValueError) as exc:
        assert "n_gpus" in str(exc) or "cpu_processes" in str(exc)


@given(st.integers(1, 64), st.integers(1, 16), ENDPOINT,
       st.one_of(st.integers(0, 10**12), st.from_regex(r"[\w.-]{1,20}", fullmatch=True)),
       st.lists(st.one_of(st.text(max_size=8), st.integers()), max_size=4))
def test_torchrun_command_for_any_valid_job(nproc, nnodes, endpoint, rdzv_id, args):
    cmd = torchrun_command("train.py", args, nproc_per_node=nproc, nnodes=nnodes,
                           rdzv_endpoint=endpoint, rdzv_id=rdzv_id)
    assert cmd[0] == "torchrun" and f"--rdzv_endpoint={endpoint}" in cmd
    assert cmd[-len(args) - 1:] == ["train.py", *map(str, args)]
    assert command_text(cmd).startswith("torchrun ")


@given(st.sampled_from(["script", "script_args", "nproc_per_node", "nnodes", "rdzv_endpoint",
                        "rdzv_id", "rdzv_backend"]), ANYTHING)
def test_torchrun_command_names_bad_arguments(name, value):
    args = {"script": "t.py", "nproc_per_node": 2, "rdzv_endpoint": "h:1", "rdzv_id": 1,
            name: value}
    _only_named_errors(name, torchrun_command, **args)


@given(ANYTHING)
def test_command_text_names_its_argument(value):
    _only_named_errors("command", command_text, value)


@given(st.lists(ENDPOINT, min_size=1, max_size=5, unique_by=str.lower), st.data())
def test_tf_config_for_any_cluster(workers, data):
    index = data.draw(st.integers(0, len(workers) - 1))
    config = tf_config(workers, index)
    assert config["cluster"]["worker"] == workers and config["task"]["index"] == index
    assert json.loads(json.dumps(config)) == config


@given(ANYTHING, ANYTHING)
def test_tf_config_names_bad_arguments(workers, index):
    try:
        tf_config(workers, index)
    except (TypeError, ValueError) as exc:
        assert any(w in str(exc) for w in ("worker", "index")), str(exc)


@given(st.sampled_from(["command", "timeout", "env"]), ANYTHING)
def test_run_captured_names_bad_arguments_before_starting(name, value):
    if name == "command" and isinstance(value, list):
        return  # a valid command would run
    args = {"command": [], "timeout": 1.0, "env": None, name: value}
    if name != "command":
        args["command"] = ["definitely-not-a-command-xyz"]
    try:
        run_captured(args.pop("command"), **args)
    except (TypeError, ValueError) as exc:
        assert name in str(exc) or "env entries" in str(exc), str(exc)
    except FileNotFoundError:  # valid arguments: the (missing) command was looked for
        pass


def test_free_port_is_free():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_case_11_a_huge_integer_argument_is_named_not_printed():
    """Case 11: Python refuses to print an integer of more than 4,300 digits; the error must
    name the argument instead of quoting that limit."""
    with pytest.raises(ValueError, match="command holds an integer too large"):
        command_text(["echo", 10**5000])
    with pytest.raises(ValueError, match="script_args"):
        torchrun_command("t.py", [10**5000], nproc_per_node=1)


def test_an_empty_program_name_is_refused():
    """Fuzz report: run_captured(['']) raised PermissionError from the operating system."""
    with pytest.raises(ValueError, match="command must start with the program"):
        run_captured([""])
    with pytest.raises(ValueError, match="command must start with the program"):
        run_captured(["  ", "x"])


def test_nul_characters_and_a_non_path_cwd_are_named():
    """Fuzz report: run_captured(['a\\x00b']) gave 'embedded null byte', cwd=0 os's TypeError."""
    with pytest.raises(ValueError, match="command holds a string with a NUL"):
        run_captured(["a\x00b"])
    with pytest.raises(TypeError, match="cwd must be a folder path"):
        run_captured(["true"], cwd=0)


# torchrun's report of gloo's abort at exit (recorded here, pids and times shortened)
GLOO_ABORT = """epoch 2/2: last loss 0.793
terminate called without an active exception
W1206 03:25:11.276000 19292 api.py:1028] Sending process 19331 closing signal SIGTERM
E1206 03:25:11.340000 19292 api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: 19330)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 19331)  (SIGTERM)
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 19330)  (SIGABRT)
"""


def test_gloo_abort_at_exit_is_forgiven_and_cut_from_the_output():
    from helpers.launch import RunResult, forgive_gloo_exit_abort

    result = forgive_gloo_exit_abort(RunResult(["torchrun"], 1, GLOO_ABORT, 1.0))
    assert result.ok and result.output == "epoch 2/2: last loss 0.793\n"


@pytest.mark.parametrize("output", [
    GLOO_ABORT.replace("exitcode  : -15", "exitcode  : 1"),  # a Python error in a worker
    GLOO_ABORT.replace("terminate called without an active exception\n", ""),
    "Traceback ...\nValueError: bad\n  exitcode  : 1 (pid: 5)\n",
])
def test_other_failures_are_not_forgiven(output):
    from helpers.launch import RunResult, forgive_gloo_exit_abort

    failed = RunResult(["torchrun"], 1, output, 1.0)
    assert forgive_gloo_exit_abort(failed) is failed


def test_run_command_splits_like_a_shell_and_uses_this_python():
    from helpers.launch import run_command

    result = run_command("python -c 'import os, sys; print(sys.argv[1:], "
                         "os.environ[\"OMP_NUM_THREADS\"])' 'a b' c")
    assert result.ok and result.output == "['a b', 'c'] 1\n"
    assert run_command("python -c 'raise SystemExit(3)'").returncode == 3
