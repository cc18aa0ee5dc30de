"""NVML (the library behind nvidia-smi) through NVIDIA's own binding, ``nvidia-ml-py``.

Used by the device report (lesson 00), the memory gauges (lesson 04) and the step timer
(lesson 09).  Every function degrades to "not available" with the reason instead of raising:
no driver, no library, no permission are normal situations on laptops and CI runners, and so
are a GPU in MIG mode (no utilisation: ``NOT_SUPPORTED``) and, on a node shared by SLURM jobs,
the GPUs the job's cgroup hides (NVML counts them but refuses their handles:
``NO_PERMISSION``).  Only a bad GPU number raises (ValueError).  NVML numbers GPUs as
nvidia-smi does, ignoring ``CUDA_VISIBLE_DEVICES``: NVML's GPU 0 need not be torch's cuda:0.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

from .checks import whole_number

__all__ = [
    "GpuMemory", "GpuInfo", "GpuProcess", "GpuStatus", "nvml_status", "list_gpus", "gpu_count",
    "gpu_memory", "gpu_utilization", "gpu_utilization_or_why", "gpu_status", "gpu_processes",
    "plain_uuid", "cuda_started",
]

_lock = threading.Lock()
_state: dict[str, object] = {"initialised": False, "error": None}


def plain_uuid(uuid) -> str:
    """A GPU's UUID as both sides can compare it: NVML says 'GPU-1a2b...' (or 'MIG-...'),
    torch '1a2b...'; without the prefix, lowercase (bytes decoded)."""
    uuid = (uuid.decode() if isinstance(uuid, bytes) else str(uuid or "")).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if uuid.startswith(prefix):
            return uuid[len(prefix):]
    return uuid


def cuda_started() -> bool:
    """True when this process already uses CUDA. Reading a torch device's UUID would start a
    CUDA context, so the gauges and the StepTimer ask torch which GPU it uses only then."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken CUDA install: as good as not started
        return False


def _init():
    """Initialise NVML once; return the pynvml module or None (reason kept in _state)."""
    with _lock:
        if _state["error"] is not None:
            return None
        try:
            import pynvml
        except ImportError:
            _state["error"] = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return None
        if not _state["initialised"]:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:  # NVMLError_LibraryNotFound without a driver
                _state["error"] = (f"NVML could not start ({exc}); is an NVIDIA driver "
                                   "installed?")
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


def _name(nv, handle) -> str:
    name = nv.nvmlDeviceGetName(handle)
    return name.decode() if isinstance(name, bytes) else str(name)


def list_gpus() -> list[GpuInfo]:
    """Every GPU NVML can read, with its name and total memory; [] without NVML.

    A GPU NVML counts but cannot open is left out (``NO_PERMISSION`` for the GPUs a SLURM
    job's cgroup hides): ``index`` stays NVML's number, so indices may have gaps."""
    nv = _init()
    if nv is None:
        return []
    try:
        count = int(nv.nvmlDeviceGetCount())
    except nv.NVMLError:
        return []
    gpus = []
    for i in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            name = _name(nv, handle)
            total, _, _, _ = _memory_info(nv, handle)
        except nv.NVMLError:
            continue
        try:
            uuid = nv.nvmlDeviceGetUUID(handle)
        except nv.NVMLError:
            uuid = ""
        gpus.append(GpuInfo(index=i, name=name, total_bytes=total, uuid=str(uuid)))
    return gpus


def gpu_memory(index: int = 0) -> GpuMemory | None:
    """Memory of GPU ``index`` (v2 info, matches nvidia-smi); None without NVML or when NVML
    cannot read it (a GPU this job's cgroup hides)."""
    opened, _ = _open_or_why(index)
    if opened is None:
        return None
    try:
        return GpuMemory(index, *_memory_info(*opened))
    except opened[0].NVMLError:
        return None


def gpu_utilization(index: int = 0) -> tuple[int, int] | None:
    """(GPU-Util %, memory-controller %) over NVML's last sample period; None without NVML
    or when NVML cannot read it (MIG mode, a GPU this job's cgroup hides):
    :func:`gpu_utilization_or_why` says why."""
    return gpu_utilization_or_why(index)[0]


def gpu_utilization_or_why(index: int = 0) -> tuple[tuple[int, int] | None, str]:
    """``((GPU-Util %, memory-controller %), "")``, or ``(None, why not)``: no NVML, a GPU
    NVML may not open (``NO_PERMISSION``: hidden by this job's cgroup), a GPU in MIG mode
    (``NOT_SUPPORTED``).  Only a bad ``index`` raises (ValueError/TypeError)."""
    opened, why = _open_or_why(index)
    if opened is None:
        return None, why
    nv, handle = opened
    try:
        rates = nv.nvmlDeviceGetUtilizationRates(handle)
        return (int(rates.gpu), int(rates.memory)), ""
    except nv.NVMLError as exc:
        why = f"NVML cannot read the utilisation of GPU {index} ({_error(exc)})"
        mig = _optional(nv, nv.nvmlDeviceGetMigMode, handle) if hasattr(
            nv, "nvmlDeviceGetMigMode") else None
        try:
            in_mig = bool(mig) and int(mig[0]) == 1
        except (TypeError, ValueError, IndexError):
            in_mig = False
        if in_mig:
            why += ": it is in MIG mode, where NVML has no GPU-Util"
        return None, why


def gpu_count() -> int:
    """How many GPUs NVML sees (those this job's cgroup hides included); 0 without NVML."""
    nv = _init()
    if nv is None:
        return 0
    try:
        return int(nv.nvmlDeviceGetCount())
    except nv.NVMLError:
        return 0


@dataclass(frozen=True)
class GpuStatus:
    """One row of ``nvidia-smi``: memory, utilisation, temperature and power of one GPU.

    Fields the driver does not report (fans on passive cards, power on some boards) are None.
    """

    index: int
    name: str
    memory: GpuMemory
    gpu_util_pct: int | None = None
    memory_util_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None


def _optional(nv, fn, *args):
    try:
        return fn(*args)
    except nv.NVMLError:  # NOT_SUPPORTED, NO_PERMISSION, ...
        return None


def _error(exc) -> str:
    return f"{type(exc).__name__}: {exc}"


def _open(index):
    """(pynvml, handle of GPU ``index``), or None without NVML or when NVML refuses the GPU;
    a bad index is an error."""
    return _open_or_why(index)[0]


def _open_or_why(index):
    """``((pynvml, handle of GPU index), "")`` or ``(None, why not)``; ValueError for a GPU
    number NVML does not have (TypeError for a non-number).  NVML errors never escape: NVML
    counts the GPUs a SLURM job's cgroup hides, but refuses their handles (NO_PERMISSION)."""
    whole_number(index, "index (a GPU number)")
    nv = _init()
    if nv is None:
        return None, str(_state["error"])
    try:
        count = int(nv.nvmlDeviceGetCount())
    except nv.NVMLError as exc:
        return None, f"NVML cannot count the GPUs ({_error(exc)})"
    if index >= count:
        raise ValueError(f"index is {index}, but there is no GPU {index}: NVML sees {count} "
                         "GPU(s)")
    try:
        return (nv, nv.nvmlDeviceGetHandleByIndex(index)), ""
    except nv.NVMLError as exc:
        why = f"NVML cannot open GPU {index} ({_error(exc)})"
        if getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_NO_PERMISSION", 4):
            why += ": a GPU another job holds, hidden by this job's cgroup"
        return None, why


def gpu_status(index: int = 0) -> GpuStatus | None:
    """Memory, utilisation, temperature and power of GPU ``index`` in one call (lesson 04's
    watch view); None without NVML or when NVML cannot read the GPU (hidden by this job's
    cgroup).  Never lists processes (that query is slow)."""
    opened = _open(index)
    if opened is None:
        return None
    nv, handle = opened
    try:
        name, memory = _name(nv, handle), GpuMemory(index, *_memory_info(nv, handle))
    except nv.NVMLError:  # a GPU that fell off the bus
        return None
    rates = _optional(nv, nv.nvmlDeviceGetUtilizationRates, handle)
    temp = _optional(nv, nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
    power = _optional(nv, nv.nvmlDeviceGetPowerUsage, handle)  # milliwatts
    limit = _optional(nv, nv.nvmlDeviceGetEnforcedPowerLimit, handle)
    return GpuStatus(
        index=index,
        name=name,
        memory=memory,
        gpu_util_pct=None if rates is None else int(rates.gpu),
        memory_util_pct=None if rates is None else int(rates.memory),
        temperature_c=None if temp is None else int(temp),
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
    )


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU; ``used_bytes`` is None where the driver hides it
    (containers without the host PID namespace, Windows WDDM)."""

    pid: int
    used_bytes: int | None


def gpu_processes(index: int = 0) -> list[GpuProcess] | None:
    """The compute processes on GPU ``index`` and their memory; None without NVML or when
    the driver refuses.  Slow-ish (milliseconds): callers throttle it, never poll it per tick."""
    opened = _open(index)
    if opened is None:
        return None
    nv, handle = opened
    try:
        procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # noqa: BLE001
        # NVMLError, or pynvml's NVMLLibraryMismatchError (not an NVMLError) on drivers
        # without the _v3 entry point; the _v2 query still works there
        query = getattr(nv, "nvmlDeviceGetComputeRunningProcesses_v2", None)
        try:
            procs = query(handle) if query is not None else None
        except Exception:  # noqa: BLE001
            procs = None
        if procs is None:
            return None
    return [GpuProcess(int(p.pid), None if getattr(p, "usedGpuMemory", None) is None
                       else int(p.usedGpuMemory)) for p in procs]
