"""Fixtures for the CPU rehearsal of the CUDA branches: the kit's GPU code paths, run on a
CPU machine against stand-ins for torch.cuda, NVML and TensorFlow.

``cuda`` patches ``torch.cuda`` with a :class:`helpers.SimulatedCuda` (one H200) for the
test; ``fake_nvml`` installs a :class:`helpers.FakeNvml` (same GPU, same UUID). Both are
restored after the test. ``scripts/cuda_coverage.py`` runs this folder under coverage.
"""

from __future__ import annotations

import sys
import types

import pytest

import helpers.tf.runtime  # noqa: F401  installs the TensorFlow side of setup()/device_report()
from helpers.core.fake_nvml import FakeGpu, FakeNvml
from helpers.memory.cuda_standin import SimulatedCuda


@pytest.fixture
def cuda():
    with SimulatedCuda() as sim:
        yield sim


@pytest.fixture
def fake_nvml():
    with FakeNvml([FakeGpu("NVIDIA H200", used_bytes=3 * 1024**3)]) as nv:
        yield nv


class FakeTensorFlow(types.ModuleType):
    """Enough of TensorFlow for the kit's GPU branches: one GPU, memory statistics."""

    def __init__(self, n_gpus: int = 1, current_bytes: int = 0):
        super().__init__("tensorflow")
        self.__version__ = "2.21.0"
        self.growth: list[str] = []
        gpus = [types.SimpleNamespace(name=f"/physical_device:GPU:{i}", device_type="GPU")
                for i in range(n_gpus)]
        cpu = types.SimpleNamespace(name="/physical_device:CPU:0", device_type="CPU")

        def devices(kind=None):
            return {None: [cpu, *gpus], "GPU": gpus, "CPU": [cpu]}[kind]

        def set_memory_growth(device, enable):
            self.growth.append(device.name)

        def get_memory_info(device):
            if not device.startswith(("GPU:", "CPU:")):
                raise ValueError(f"bad device {device}")
            return {"current": current_bytes, "peak": current_bytes}

        self.config = types.SimpleNamespace(
            list_physical_devices=devices, list_logical_devices=devices,
            experimental=types.SimpleNamespace(set_memory_growth=set_memory_growth,
                                               get_memory_info=get_memory_info))
        self.test = types.SimpleNamespace(is_built_with_cuda=lambda: True)
        self.context_handle = object()  # TF's runtime has started


@pytest.fixture
def fake_tf(monkeypatch):
    """A stand-in TensorFlow with one GPU, in sys.modules for the test (the real one, imported
    or not, is untouched and comes back afterwards)."""
    tf = FakeTensorFlow(current_bytes=256 * 1024**2)
    eager = types.ModuleType("tensorflow.python.eager")
    eager.context = types.SimpleNamespace(
        context=lambda: types.SimpleNamespace(_context_handle=tf.context_handle))
    python = types.ModuleType("tensorflow.python")
    python.eager = eager
    tf.python = python
    for name, module in (("tensorflow", tf), ("tensorflow.python", python),
                         ("tensorflow.python.eager", eager),
                         ("tensorflow.python.eager.context", eager.context)):
        monkeypatch.setitem(sys.modules, name, module)
    return tf
