"""Where memory numbers come from: one small interface over every memory counter the kit reads.

Every "how much memory is in use" question in the kit (the measurement of a step, the
batch-size finder, the out-of-memory checker, the live gauges) is asked through a
:class:`MemorySource`; only this module calls the counters themselves
(``torch.cuda.memory_allocated`` and its relatives, TensorFlow's ``get_memory_info``,
psutil's ``memory_info``, NVML through :func:`helpers.core.nvml.gpu_memory`)::

    source = memory_source()          # the active VirtualGPU, else CUDA, else process RAM
    source.reset()
    run_step()
    print(source.name, source.peak(), source.total)

Nothing here imports torch or TensorFlow at import time; TensorFlow's
``tf.config.experimental`` module is handed in by :mod:`helpers.tf`.
"""

from __future__ import annotations

import sys

__all__ = ["MemorySource", "VirtualGpuSource", "CudaSource", "TensorFlowSource",
           "ProcessRamSource", "NvmlSource", "memory_source"]


class MemorySource:
    """Bytes in use on one device, as one counter reports them.

    Attributes: ``name`` (``"virtual GPU L40S"``, ``"cuda:0"``, ``"TensorFlow GPU:0"``,
    ``"process RAM"``), ``exact`` (``read()`` returns to its baseline once everything is
    released), ``total`` (capacity in bytes, None if unknown), ``available`` (False where the
    counter cannot be read here: then ``read()`` raises RuntimeError saying why).
    """

    name = "memory"
    exact = False
    total: int | None = None
    available = True
    why_not = ""

    def read(self) -> int:
        """Bytes in use now."""
        raise NotImplementedError

    def peak(self) -> int | None:
        """The most bytes in use since the last :meth:`reset`; None if not tracked."""
        return None

    def reset(self) -> None:
        """Start a new peak."""

    def empty_cache(self) -> None:
        """Give cached, unused blocks back (nothing where there is no cache)."""

    def reserved(self) -> int | None:
        """Bytes a caching allocator holds (cache included); None where there is none."""
        return None

    def peak_reserved(self) -> int | None:
        """The most bytes reserved since the last :meth:`reset`; None where not tracked."""
        return None

    def outside(self) -> int:
        """Bytes the device uses outside this counter (a CUDA context, other processes)."""
        return 0

    def device_used(self) -> int | None:
        """Bytes the whole device has in use, every process included; None if unknown."""
        return None

    def sync(self) -> None:
        """Wait for queued work, so the next reading includes it."""

    def _unavailable(self):
        return RuntimeError(f"{self.name} cannot be read here: {self.why_not}")

    def __repr__(self) -> str:
        total = "unknown" if self.total is None else f"{self.total:,} bytes"
        return f"<{type(self).__name__} {self.name!r}, total {total}>"


class VirtualGpuSource(MemorySource):
    """A :class:`helpers.VirtualGPU`'s exact (or CUDA-rounded) accounting.  ``gpu`` may be
    any object with ``capacity_bytes``, ``allocated_bytes``, ``reserved_bytes`` and
    ``context_bytes`` (the gauges accept such stand-ins); peaks need a real VirtualGPU."""

    exact = True

    def __init__(self, gpu):
        self.gpu = gpu
        self.name = f"virtual GPU {getattr(gpu, 'name', 'stand-in')}"
        self.total = int(gpu.capacity_bytes)

    def read(self) -> int:
        return self.gpu.allocated_bytes

    def peak(self) -> int:
        return self.gpu.peak_allocated_bytes

    def reset(self) -> None:
        self.gpu.reset_peak()

    def empty_cache(self) -> None:
        self.gpu.empty_cache()

    def reserved(self) -> int:
        return self.gpu.reserved_bytes

    def peak_reserved(self) -> int:
        return self.gpu.peak_reserved_bytes

    def outside(self) -> int:
        return self.gpu.context_bytes

    def device_used(self) -> int:
        return self.gpu.context_bytes + self.gpu.reserved_bytes


class CudaSource(MemorySource):
    """PyTorch's CUDA caching allocator on one device (default: the current one).

    Making one never starts a CUDA context (the gauges make one per reading): ``total`` is
    asked from the device on first use.
    """

    exact = True

    def __init__(self, device=None):
        import torch

        self.torch = torch
        index = None
        if device is not None:
            device = torch.device(device)
            if device.type != "cuda":
                raise ValueError(f"device must be a CUDA device, got {str(device)!r}")
            index = device.index
        if index is None:  # the current device, without starting CUDA to ask
            index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        self.index = index
        self.device = torch.device("cuda", index)
        self.name = f"cuda:{index}"

    @property
    def total(self) -> int:
        return int(self.torch.cuda.get_device_properties(self.index).total_memory)

    def read(self) -> int:
        return int(self.torch.cuda.memory_allocated(self.index))

    def peak(self) -> int:
        return int(self.torch.cuda.max_memory_allocated(self.index))

    def reset(self) -> None:
        self.torch.cuda.synchronize(self.index)
        self.torch.cuda.reset_peak_memory_stats(self.index)

    def empty_cache(self) -> None:
        self.torch.cuda.empty_cache()

    def reserved(self) -> int:
        return int(self.torch.cuda.memory_reserved(self.index))

    def peak_reserved(self) -> int:
        return int(self.torch.cuda.max_memory_reserved(self.index))

    def free_and_total(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the whole device, as the driver reports them."""
        free, total = self.torch.cuda.mem_get_info(self.index)
        return int(free), int(total)

    def outside(self) -> int:
        free, total = self.free_and_total()
        return max(0, total - free - self.reserved())

    def device_used(self) -> int:
        free, total = self.free_and_total()
        return total - free

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.index)


class TensorFlowSource(MemorySource):
    """TensorFlow's allocator on one device (``"GPU:0"``, ``"CPU:0"``): ``config`` is the
    ``tf.config.experimental`` module, handed in by :mod:`helpers.tf` (this module never
    imports TensorFlow).  Not exact: TensorFlow's own buffers come and go."""

    def __init__(self, config, device: str = "GPU:0", total: int | None = None):
        self.config = config
        self.device = device
        self.name = f"TensorFlow {device}"
        self.total = total
        try:
            config.get_memory_info(device)
        except ValueError as exc:  # CPU without oneDNN's allocator statistics, unknown device
            self.available = False
            self.why_not = f"TensorFlow keeps no memory statistics for {device} ({exc})"

    def _info(self) -> dict:
        if not self.available:
            raise self._unavailable()
        return self.config.get_memory_info(self.device)

    def read(self) -> int:
        return int(self._info()["current"])

    def peak(self) -> int | None:
        return int(self._info()["peak"]) if self.available else None

    def reset(self) -> None:
        if self.available:
            self.config.reset_memory_stats(self.device)


class ProcessRamSource(MemorySource):
    """This process's resident memory (RSS) through psutil; ``available`` is False without
    psutil (``read()`` then raises RuntimeError)."""

    name = "process RAM"

    def __init__(self):
        try:
            import psutil
        except ImportError:
            self.available = False
            self.why_not = "psutil is not installed (pip install psutil)"
            return
        self.psutil = psutil
        self.process = psutil.Process()
        self.total = int(psutil.virtual_memory().total)

    def read(self) -> int:
        if not self.available:
            raise self._unavailable()
        return int(self.process.memory_info().rss)

    def device_used(self) -> int | None:
        """RAM in use on the machine, every process included (total - available)."""
        if not self.available:
            return None
        vm = self.psutil.virtual_memory()
        return int(vm.total - vm.available)

    def outside(self) -> int:
        """RAM other processes and the kernel use (in use on the machine, less this RSS)."""
        used = self.device_used()
        return 0 if used is None else max(0, used - self.read())


class NvmlSource(MemorySource):
    """GPU ``index`` as NVML (nvidia-smi) sees it: used bytes of the whole device, every
    process and the driver's share included.  ``available`` is False without NVML."""

    def __init__(self, index: int = 0):
        from ..core.nvml import gpu_memory, nvml_status

        self.index = index
        self.name = f"GPU {index} (NVML)"
        self._query = gpu_memory
        mem = gpu_memory(index)
        if mem is None:
            self.available = False
            self.why_not = nvml_status()[1]
        else:
            self.total = mem.total_bytes

    def memory(self):
        """The full :class:`helpers.core.nvml.GpuMemory` reading (used, free, reserved)."""
        mem = self._query(self.index) if self.available else None
        if mem is None:
            raise self._unavailable()
        return mem

    def read(self) -> int:
        return self.memory().used_bytes

    def device_used(self) -> int | None:
        """total - free, as nvidia-smi shows "used" (the driver's reserved share included)."""
        if not self.available:
            return None
        mem = self.memory()
        return mem.total_bytes - mem.free_bytes


def memory_source(device=None) -> MemorySource:
    """The source to read for ``device``: the active :class:`helpers.VirtualGPU`, else the
    given (or, when ``device`` is None and CUDA works, the current) CUDA device, else this
    process's RAM."""
    from .state import current_virtual_gpu

    gpu = current_virtual_gpu()
    if gpu is not None:
        return VirtualGpuSource(gpu)
    if device is not None:
        from ..core.checks import device_arg

        device = device_arg(device, "device")
        return CudaSource(device) if device.type == "cuda" else ProcessRamSource()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return CudaSource()
    return ProcessRamSource()
