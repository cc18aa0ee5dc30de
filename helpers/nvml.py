"""NVML (the library behind nvidia-smi) through NVIDIA's own binding, ``nvidia-ml-py``.

Used by the device report (lesson 00) and the memory gauges (lesson 04).  Every function
degrades to "not available" with the reason instead of raising: no driver, no library, no
permission are normal situations on laptops and CI runners.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["GpuMemory", "GpuInfo", "nvml_status", "list_gpus", "gpu_memory", "gpu_utilization"]

_lock = threading.Lock()
_state: dict[str, object] = {"initialised": False, "error": None}


def _init():
    """Initialise NVML once; return the pynvml module or None (reason kept in _state)."""
    with _lock:
        if _state["initialised"]:
            import pynvml

            return pynvml
        if _state["error"] is not None:
            return None
        try:
            import pynvml
        except ImportError:
            _state["error"] = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:  # NVMLError_LibraryNotFound without a driver
            _state["error"] = f"NVML could not start ({exc}); is an NVIDIA driver installed?"
            return None
        _state["initialised"] = True
        return pynvml


def nvml_status() -> tuple[bool, str]:
    """(True, driver version) when NVML works, else (False, why not)."""
    nv = _init()
    if nv is None:
        return False, str(_state["error"])
    return True, f"driver {nv.nvmlSystemGetDriverVersion()}"


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as NVML reports it (v2 info: ``reserved`` is the driver's share)."""

    index: int
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int = 0


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    total_bytes: int
    uuid: str = ""


def _memory_info(nv, handle):
    try:
        info = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
        reserved = int(getattr(info, "reserved", 0))
    except (nv.NVMLError, TypeError, AttributeError):  # old driver: v1 only
        info = nv.nvmlDeviceGetMemoryInfo(handle)
        reserved = 0
    return int(info.total), int(info.used), int(info.free), reserved


def list_gpus() -> list[GpuInfo]:
    """Every GPU NVML can see, with its name and total memory; [] without NVML."""
    nv = _init()
    if nv is None:
        return []
    gpus = []
    for i in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        name = nv.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):
            name = name.decode()
        total, _, _, _ = _memory_info(nv, handle)
        try:
            uuid = nv.nvmlDeviceGetUUID(handle)
        except nv.NVMLError:
            uuid = ""
        gpus.append(GpuInfo(index=i, name=name, total_bytes=total, uuid=str(uuid)))
    return gpus


def gpu_memory(index: int = 0) -> GpuMemory | None:
    """Memory of GPU ``index`` (v2 info, matches nvidia-smi); None without NVML."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be a GPU number >= 0, got {index!r}")
    nv = _init()
    if nv is None:
        return None
    count = nv.nvmlDeviceGetCount()
    if index >= count:
        raise ValueError(f"there is no GPU {index}: NVML sees {count} GPU(s)")
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    total, used, free, reserved = _memory_info(nv, handle)
    return GpuMemory(index, total, used, free, reserved)


def gpu_utilization(index: int = 0) -> tuple[int, int] | None:
    """(GPU-Util %, memory-controller %) over NVML's last sample period; None without NVML."""
    nv = _init()
    if nv is None:
        return None
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    rates = nv.nvmlDeviceGetUtilizationRates(handle)
    return int(rates.gpu), int(rates.memory)
