"""The CPU test suite, run as if this machine had a GPU wherever a test does not say the CPU.

On a machine with a usable GPU, ``helpers.pick_device()`` answers ``cuda``, and everything
that follows it by default (``VirtualGPU()`` without ``device=``, which then counts only CUDA
storages; ``check_training``, ``amp_settings()``, ``measure_step`` without a model) leaves the
CPU. A test that makes CPU tensors and relies on that default passes here and fails on the
first GPU node (turn-3 GPU review, C2). So, in every test outside ``tests/gpu``, wherever
``pick_device()`` would answer the CPU it answers ``meta`` instead: a device that is not the
CPU, as a GPU is not, on which such a test fails here too. A test that means the CPU says
``device="cpu"``; one that is about ``pick_device()``'s own answer is marked
``@pytest.mark.real_pick_device``. (``tests/unit/test_pick_device_standin.py`` checks that the
stand-in is in place.) Answers that are not the CPU (SimulatedCuda's ``cuda``, a real GPU's)
are left as they are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

GPU_TESTS = Path(__file__).resolve().parent / "gpu"
STAND_IN = "meta"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "real_pick_device: this test is about pick_device()'s own answer on this "
                   "machine (tests/conftest.py otherwise answers 'meta' for the CPU)")


@pytest.fixture(autouse=True)
def _pick_device_is_not_the_cpu(request, monkeypatch):
    if (Path(str(request.node.fspath)).resolve().is_relative_to(GPU_TESTS)
            or request.node.get_closest_marker("real_pick_device")):
        yield
        return
    import helpers
    from helpers.core import environment

    real = environment.pick_device

    def pick_device(prefer: str = "auto"):
        device = real(prefer)
        if device.type == "cpu" and prefer != "cpu":  # asking for the CPU means it
            import torch

            return torch.device(STAND_IN)
        return device

    assert helpers.pick_device is real  # the facade caches the name on first use
    monkeypatch.setattr(environment, "pick_device", pick_device)
    monkeypatch.setattr(helpers, "pick_device", pick_device)
    yield
