"""scripts/tf_memory_modes.py on a CPU: its arguments (one mode per process, never growth and
a limit both), its checks, and a real run without a GPU. The GPU branch is rehearsed in
tests/rehearsal/test_tf_memory_modes_gpu.py."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import lean_env
import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "tf_memory_modes.py"


modes = load_script("tf_memory_modes")


class CpuOnlyTensorFlow(types.ModuleType):
    """TensorFlow on a machine without a GPU; records any setting or operation."""

    def __init__(self):
        super().__init__("tensorflow")
        cpu = types.SimpleNamespace(name="/physical_device:CPU:0", device_type="CPU")
        self.calls = []
        self.config = types.SimpleNamespace(
            list_physical_devices=lambda kind=None: [] if kind == "GPU" else [cpu],
            set_logical_device_configuration=lambda *a: self.calls.append("limit"),
            experimental=types.SimpleNamespace(
                set_memory_growth=lambda *a: self.calls.append("growth")))
        self.device = lambda name: self.calls.append(name)


# --- arguments -------------------------------------------------------------------------------

def test_each_mode_is_its_own_argument():
    assert modes.parse_args(["growth"]).mode == "growth"
    assert modes.parse_args(["limit"]).mib == modes.DEFAULT_MIB == 1024
    assert modes.parse_args(["limit", "--mib", "512"]).mib == 512
    assert modes.parse_args(["default"]).mib is None


@pytest.mark.parametrize("argv, message", [
    (["growth", "limit"], "unrecognized arguments: limit"),  # both in one process: refused
    ([], "the following arguments are required: mode"),
    (["both"], "invalid choice: 'both'"),
    (["growth", "--mib", "1024"], "--mib applies to mode limit only, not to growth"),
    (["limit", "--mib", "0"], "--mib must be at least 1, got 0"),
    (["limit", "--mib", "1.5"], "--mib must be a whole number, got '1.5'"),
])
def test_bad_arguments_are_refused_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        modes.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_check_names_every_contradiction():
    both = [("GPU:0", True, [1024])]  # what applying growth and a limit would read back
    assert modes.check("growth", None, both) == [
        "GPU:0: logical devices [1024], mode growth wants None"]
    assert modes.check("limit", 1024, both) == [
        "GPU:0: memory growth is True, mode limit wants False"]
    assert modes.check("limit", 1024, [("GPU:0", False, [1024])]) == []


def test_nvml_checks_read_the_card():
    used = {"before import tensorflow": 500 * 2**20, "after the first operation": 0}
    used["after the first operation"] = used["before import tensorflow"] + 1500 * 2**20
    assert modes.nvml_checks("limit", 1024, used, 140 * 2**30) == []
    assert modes.nvml_checks("growth", None, used, 140 * 2**30) == []
    used["after the first operation"] = used["before import tensorflow"] + 600 * 2**20
    assert "only 600 MiB taken" in modes.nvml_checks("limit", 1024, used, 140 * 2**30)[0]
    used["after the first operation"] = 100 * 2**30
    assert "more than half" in modes.nvml_checks("growth", None, used, 140 * 2**30)[0]


def test_without_a_gpu_nothing_is_configured(monkeypatch, capsys):
    tf = CpuOnlyTensorFlow()
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    monkeypatch.setattr(modes, "_nvml_used", lambda: None)
    assert modes.main(["limit"]) == 0
    assert tf.calls == []
    assert capsys.readouterr().out.splitlines() == [
        "mode limit: each GPU becomes one logical GPU of at most 1024 MiB; memory growth is "
        "not set",
        "no GPU: nothing to configure (TensorFlow sees CPU:0 only)",
    ]


@pytest.mark.slow
def test_the_real_script_on_this_cpu_configures_nothing():
    lean_env.require("tensorflow", "the script configures TensorFlow's GPUs")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    result = subprocess.run([sys.executable, str(SCRIPT), "growth"], capture_output=True,
                            text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "no GPU: nothing to configure (TensorFlow sees CPU:0 only)")
