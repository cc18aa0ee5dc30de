import os
import random
import subprocess
import sys

import numpy as np
import pytest

import helpers
from helpers.environment import pick_device, setup


def test_import_helpers_loads_no_framework():
    code = (
        "import sys, helpers\n"
        "helpers.fmt_bytes(1); helpers.Table\n"
        "bad = [m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lazy_attribute_errors_name_the_attribute():
    with pytest.raises(AttributeError, match="no_such_thing"):
        helpers.no_such_thing  # noqa: B018


def test_setup_seeds_everything_repeatably():
    import torch

    setup(seed=123)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    setup(seed=123)
    b = (random.random(), np.random.rand(), torch.rand(1).item())
    assert a == b


def test_setup_reports_and_sets_safe_flags():
    import torch

    report = setup(seed=0)
    assert report.seeded[:3] == ["python", "numpy", "torch"]
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert "seed 0" in repr(report)


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, "0", True, None])
def test_setup_rejects_bad_seeds(seed):
    with pytest.raises((TypeError, ValueError), match="seed"):
        setup(seed=seed)


def test_setup_rejects_bad_flags():
    with pytest.raises(TypeError, match="tensorflow"):
        setup(tensorflow="yes")
    with pytest.raises(TypeError, match="deterministic"):
        setup(deterministic=1)


def test_setup_with_tensorflow_is_quiet_and_seeded():
    code = (
        "import helpers, sys\n"
        "r = helpers.setup(seed=1, tensorflow=True)\n"
        "assert 'tensorflow' in r.seeded, r\n"
        "import tensorflow as tf\n"
        "print(r.settings['tensorflow GPU memory'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert "no GPU" in out.stdout or "GPU" in out.stdout
    # TF's C++ banners and oneDNN notice are silenced before import
    assert "oneDNN" not in out.stderr
    assert "cpu_feature_guard" not in out.stderr


def test_pick_device_on_this_machine():
    import torch

    dev = pick_device()
    assert isinstance(dev, torch.device)
    expected = "cuda" if torch.cuda.is_available() else dev.type
    assert dev.type == expected
    assert pick_device("cpu").type == "cpu"


def test_pick_device_falls_back_when_kind_missing():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert pick_device("cuda").type in ("mps", "cpu")


@pytest.mark.parametrize("prefer", ["gpu", "CUDA", 0, None])
def test_pick_device_rejects_unknown_kinds(prefer):
    with pytest.raises(ValueError, match="auto, cuda, mps, cpu"):
        pick_device(prefer)
