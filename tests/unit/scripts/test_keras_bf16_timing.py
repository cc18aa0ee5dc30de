"""scripts/keras_bf16_timing.py: lesson 07's Keras bf16 timing with oneDNN at TF's default."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from helpers.launch import run_captured

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "keras_bf16_timing.py"


@pytest.fixture(scope="module")
def timing():
    spec = importlib.util.spec_from_file_location("keras_bf16_timing", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configure_unsets_or_turns_off_onednn_before_tensorflow_starts(timing):
    env = {"TF_ENABLE_ONEDNN_OPTS": "0"}
    timing.configure("default", env)
    assert "TF_ENABLE_ONEDNN_OPTS" not in env and env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    timing.configure("off", env)
    assert env["TF_ENABLE_ONEDNN_OPTS"] == "0"


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--rounds", "-1"], ["--onednn", "on"]])
def test_bad_arguments_are_rejected(timing, argv, capsys):
    with pytest.raises(SystemExit):
        timing.parse_args(argv)
    assert "--" in capsys.readouterr().err


def test_a_real_run_in_a_kernel_like_environment_measures_with_onednn_at_the_default():
    """The lesson kernel has TF_ENABLE_ONEDNN_OPTS=0 (helpers.setup): the child removes it."""
    pytest.importorskip("tensorflow")
    run = run_captured([sys.executable, str(SCRIPT), "--json", "--rounds", "1", "--batch", "32"],
                       env={"TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": ""},
                       timeout=240).check()
    result = json.loads(run.output.strip().splitlines()[-1])
    assert result["onednn"].startswith("TF_ENABLE_ONEDNN_OPTS unset")
    assert set(result["seconds"]) == {"float32", "mixed_bfloat16"} and result["batch"] == 32
    assert result["speedup"] == pytest.approx(
        result["seconds"]["float32"] / result["seconds"]["mixed_bfloat16"])
