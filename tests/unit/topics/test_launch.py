import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

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
