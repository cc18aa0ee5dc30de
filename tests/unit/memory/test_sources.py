"""helpers.memory.sources: one interface over every memory counter the kit reads."""

from __future__ import annotations

import sys

import pytest
import torch

from helpers.memory import sources
from helpers.memory.cuda_standin import SimulatedCuda
from helpers.memory.sources import (
    CudaSource,
    MemorySource,
    NvmlSource,
    ProcessRamSource,
    TensorFlowSource,
    VirtualGpuSource,
    memory_source,
)
from helpers.memory.virtual import VirtualGPU


def test_virtual_gpu_source_reads_the_virtual_gpu():
    gpu = VirtualGPU("1 GiB", rounding=True, context_bytes="100 MiB", device="cpu")
    with gpu:
        source = memory_source()
        assert isinstance(source, VirtualGpuSource)
        assert source.exact and source.total == 2**30
        assert source.name == "virtual GPU 1.00 GiB"
        x = torch.ones(1024, 1024)  # 4 MiB
        assert source.read() == gpu.allocated_bytes >= 4 * 2**20
        assert source.peak() == gpu.peak_allocated_bytes
        assert source.reserved() == gpu.reserved_bytes
        assert source.peak_reserved() == gpu.peak_reserved_bytes
        assert source.outside() == 100 * 2**20
        assert source.device_used() == 100 * 2**20 + gpu.reserved_bytes
        del x
        assert source.read() == 0
        assert source.peak() > 0
        source.reset()
        assert source.peak() == 0
        source.empty_cache()
        assert source.reserved() == 0


def test_memory_source_without_gpu_is_process_ram_or_cuda():
    source = memory_source()
    expected = CudaSource if torch.cuda.is_available() else ProcessRamSource
    assert isinstance(source, expected)
    assert isinstance(memory_source("cpu"), ProcessRamSource)


def test_process_ram_source():
    pytest.importorskip("psutil")
    source = ProcessRamSource()
    assert source.available and not source.exact
    assert source.read() > 0 and source.total > 0
    assert source.peak() is None and source.reserved() is None
    assert 0 < source.device_used() <= source.total
    assert 0 <= source.outside() <= source.device_used()
    source.reset()
    source.empty_cache()  # no-ops


def test_process_ram_source_without_psutil(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError
    source = ProcessRamSource()
    assert not source.available
    with pytest.raises(RuntimeError, match="psutil is not installed"):
        source.read()
    assert source.device_used() is None


def test_cuda_source_through_simulated_cuda():
    with SimulatedCuda("L40S", device_count=2) as cuda:
        cuda.set_memory(1, allocated=100, reserved=300, other=1000)
        source = CudaSource("cuda:1")
        assert source.name == "cuda:1" and source.exact
        assert source.total == cuda.devices[1].total_bytes
        assert (source.read(), source.reserved(), source.peak(), source.peak_reserved()) \
            == (100, 300, 100, 300)
        assert source.outside() == 1000
        assert source.device_used() == 1300
        free, total = source.free_and_total()
        assert total == source.total and free == total - 1300
        cuda.free(100, 1)
        source.reset()
        assert source.peak() == 0
        source.sync()
        source.empty_cache()
        assert isinstance(memory_source("cuda:1"), CudaSource)
        assert memory_source().name == "cuda:0"
    with pytest.raises(ValueError, match="CUDA device"):
        CudaSource("cpu")


def test_memory_source_rejects_a_missing_cuda_device():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="no usable CUDA"):
        memory_source("cuda")


class _Config:
    """A stand-in for tf.config.experimental."""

    def __init__(self, devices=("GPU:0",)):
        self.devices = {d: {"current": 0, "peak": 0} for d in devices}

    def get_memory_info(self, device):
        if device not in self.devices:
            raise ValueError(f"no statistics for {device}")
        return dict(self.devices[device])

    def reset_memory_stats(self, device):
        info = self.devices[device]
        info["peak"] = info["current"]


def test_tensorflow_source_with_statistics():
    config = _Config()
    source = TensorFlowSource(config, "GPU:0", total=10)
    assert source.available and not source.exact and source.total == 10
    assert source.name == "TensorFlow GPU:0"
    config.devices["GPU:0"].update(current=5, peak=9)
    assert (source.read(), source.peak()) == (5, 9)
    source.reset()
    assert source.peak() == 5


def test_tensorflow_source_without_statistics():
    source = TensorFlowSource(_Config(), "CPU:0")
    assert not source.available and source.peak() is None
    source.reset()  # nothing to reset
    with pytest.raises(RuntimeError, match="no memory statistics for CPU:0"):
        source.read()


def test_nvml_source(monkeypatch):
    from helpers.core import nvml

    memory = nvml.GpuMemory(0, total_bytes=100, used_bytes=40, free_bytes=60)
    monkeypatch.setattr(nvml, "gpu_memory", lambda index=0: memory)
    source = NvmlSource(0)
    assert source.available and source.total == 100 and source.read() == 40
    assert source.memory() is memory and source.device_used() == 40
    monkeypatch.setattr(nvml, "gpu_memory", lambda index=0: None)
    monkeypatch.setattr(nvml, "nvml_status", lambda: (False, "no driver"))
    source = NvmlSource(0)
    assert not source.available
    with pytest.raises(RuntimeError, match="no driver"):
        source.read()
    assert source.device_used() is None


def test_cuda_source_never_starts_cuda():
    """The gauges make a source per reading: making one must not initialise CUDA."""
    with SimulatedCuda("L40S") as cuda:
        source = CudaSource()
        assert source.name == "cuda:0" and not cuda.initialized
        assert source.read() == 0


def test_virtual_gpu_source_accepts_a_stand_in():
    class StandIn:
        capacity_bytes, allocated_bytes, reserved_bytes, context_bytes = 100, 10, 20, 5

    source = VirtualGpuSource(StandIn())
    assert source.name == "virtual GPU stand-in" and source.total == 100
    assert (source.read(), source.reserved(), source.outside(), source.device_used()) \
        == (10, 20, 5, 25)


def test_base_interface_defaults():
    class Counter(MemorySource):
        name = "counter"

        def read(self):
            return 7

    c = Counter()
    assert c.read() == 7 and c.peak() is None and c.reserved() is None
    assert c.peak_reserved() is None and c.outside() == 0 and c.total is None
    assert c.device_used() is None
    c.reset(), c.empty_cache(), c.sync()
    assert "counter" in repr(c)
    with pytest.raises(NotImplementedError):
        MemorySource().read()


def test_sources_imports_neither_torch_nor_tensorflow():
    """torch only inside the functions that need it; TensorFlow never (helpers.tf hands in
    tf.config.experimental)."""
    import ast

    tree = ast.parse(open(sources.__file__).read())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any(a.name.split(".")[0] in ("torch", "tensorflow")
                   for n in top if isinstance(n, ast.Import) for a in n.names)
    assert "tensorflow" not in {a.name.split(".")[0] for n in ast.walk(tree)
                                if isinstance(n, ast.Import) for a in n.names}
