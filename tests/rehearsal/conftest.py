"""Fixtures for the CPU rehearsal of the CUDA branches (issue 14, section 4).

``cuda`` patches ``torch.cuda`` with a :class:`helpers.SimulatedCuda` (one H200) for the
test; ``fake_nvml`` installs a :class:`helpers.FakeNvml` (same GPU, same UUID). Both are
restored after the test. ``scripts/cuda_coverage.py`` runs this folder under coverage.
"""

from __future__ import annotations

import sys
import types

import pytest

from helpers.fake_nvml import FakeGpu, FakeNvml
from helpers.memory.cuda_standin import SimulatedCuda


@pytest.fixture
def cuda():
    with SimulatedCuda() as sim:
        yield sim


@pytest.fixture
def fake_nvml():
    with FakeNvml([FakeGpu("NVIDIA H200", used_bytes=3 * 1024**3)]) as nv:
        yield nv


@pytest.fixture
def tf_gpu(monkeypatch):
    """TensorFlow's ``list_physical_devices("GPU")`` answers one GPU (TF is not imported if
    it was not imported already: a stand-in module takes its place for the test)."""
    gpu = types.SimpleNamespace(name="/physical_device:GPU:0", device_type="GPU")

    def list_physical_devices(kind=None):
        return [gpu] if kind in (None, "GPU") else []

    tf = sys.modules.get("tensorflow")
    if tf is not None:
        monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)
    else:
        tf = types.ModuleType("tensorflow")
        tf.config = types.SimpleNamespace(list_physical_devices=list_physical_devices)
        monkeypatch.setitem(sys.modules, "tensorflow", tf)
    return tf
