import importlib.util
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import helpers
from helpers.core.environment import pick_device, setup


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


def test_setup_seeds_everything_repeatably(torch_flags):
    import torch

    setup(seed=123)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    setup(seed=123)
    b = (random.random(), np.random.rand(), torch.rand(1).item())
    assert a == b


@pytest.fixture
def torch_flags(monkeypatch):
    """Restore torch's global determinism flags and CUBLAS_WORKSPACE_CONFIG after a test."""
    import torch

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    yield torch
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2:]


def test_setup_reports_and_sets_safe_flags(torch_flags):
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


def test_deterministic_mode_sets_cublas_config_and_says_so(torch_flags):
    torch = torch_flags
    report = setup(seed=0, deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert ("torch: deterministic algorithms on (warn_only), cuDNN benchmark off, "
            "CUBLAS_WORKSPACE_CONFIG=:4096:8") in report.text()


def test_fast_mode_sets_no_cublas_config_and_turns_determinism_off(torch_flags):
    torch = torch_flags
    torch.use_deterministic_algorithms(True, warn_only=True)  # as an earlier setup() left it
    torch.backends.cudnn.deterministic = True
    report = setup(seed=0, deterministic=False)
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    text = report.text()
    assert ("torch: deterministic algorithms off, cuDNN benchmark off, "
            "CUBLAS_WORKSPACE_CONFIG not set") in text
    assert "4096" not in text


def test_fast_mode_undoes_the_cublas_config_an_earlier_setup_set(torch_flags):
    setup(seed=0, deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    setup(seed=0, deterministic=False)
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_fast_mode_leaves_a_users_cublas_config_alone_and_says_so(torch_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    report = setup(seed=0, deterministic=False)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert "CUBLAS_WORKSPACE_CONFIG=:16:8 (set outside helpers, left as is)" in report.text()


def test_benchmark_mode_is_for_fixed_shapes_and_not_deterministic(torch_flags):
    torch = torch_flags
    report = setup(seed=0, deterministic=False, benchmark=True)
    assert torch.backends.cudnn.benchmark
    assert "cuDNN benchmark on" in report.text()
    with pytest.raises(ValueError, match="benchmark=True.*deterministic=False"):
        setup(seed=0, benchmark=True)


def test_setup_rejects_bad_flags():
    with pytest.raises(TypeError, match="tensorflow"):
        setup(tensorflow="yes")
    with pytest.raises(TypeError, match="deterministic"):
        setup(deterministic=1)
    with pytest.raises(TypeError, match="benchmark"):
        setup(deterministic=False, benchmark="yes")


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="TensorFlow is not installed (a PyTorch-only GPU node)")
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


def test_setup_without_torch_leaves_it_unimported_and_seeds_it_once_imported():
    """torch=False: a Keras-only notebook's kernel does not pay for PyTorch (~0.25 GiB)."""
    code = (
        "import sys, helpers\n"
        "r = helpers.setup(seed=3, torch=False)\n"
        "assert 'torch' not in sys.modules and 'torch' not in r.seeded, r.seeded\n"
        "import torch\n"
        "r = helpers.setup(seed=3, torch=False)\n"
        "assert 'torch' in r.seeded, r.seeded\n"
        "a = torch.rand(3)\n"
        "torch.manual_seed(3)\n"
        "assert torch.equal(a, torch.rand(3))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    with pytest.raises(TypeError, match="torch"):
        setup(torch="no")


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
    error = ValueError if isinstance(prefer, str) else TypeError
    with pytest.raises(error, match=r"prefer must be one of \['auto', 'cuda', 'mps', 'cpu'\]"):
        pick_device(prefer)
