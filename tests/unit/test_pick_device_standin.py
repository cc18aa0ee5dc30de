"""tests/conftest.py runs the CPU suite as a GPU machine would for code that follows
``pick_device()``: this checks that the stand-in is in place, and that it catches the class of
bug it is there for (a test that means the CPU but leaves the device to the default)."""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers.core import environment


def test_pick_device_does_not_answer_the_cpu():
    assert helpers.pick_device().type != "cpu"
    assert environment.pick_device().type != "cpu"
    assert helpers.pick_device("cpu").type == "cpu"  # asked for by name: the CPU


def test_a_virtual_gpu_left_to_the_default_misses_cpu_tensors():
    """What the first GPU run would have met (review C2): VirtualGPU() follows pick_device(),
    so on a GPU it counts CUDA storages only; a test's CPU tensor is not counted."""
    with helpers.VirtualGPU("1 GiB") as default, torch.no_grad():
        x = torch.empty(1024, 1024)
        missed = default.allocated_bytes
    with helpers.VirtualGPU("1 GiB", device="cpu") as cpu:
        y = torch.empty(1024, 1024)
        counted = cpu.allocated_bytes
    del x, y
    assert missed == 0 and counted == 4 * 1024**2


@pytest.mark.real_pick_device
def test_the_marker_gives_the_real_answer():
    assert helpers.pick_device() == environment.pick_device()
    assert helpers.pick_device is environment.pick_device
    if not torch.cuda.is_available():
        assert helpers.pick_device().type in ("cpu", "mps")
