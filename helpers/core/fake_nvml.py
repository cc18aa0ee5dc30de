"""``FakeNvml``: a stand-in for ``pynvml`` (nvidia-ml-py 13), to rehearse NVML code on a CPU.

::

    with helpers.FakeNvml([FakeGpu("NVIDIA H200", used_bytes=2 * GiB)]) as nv:
        helpers.device_report(tensorflow=False)     # lists the H200, driver 580.95.05
    nv.log                                          # every pynvml call, in order

    with helpers.FakeNvml(fail="driver_not_loaded"):
        helpers.core.nvml.nvml_status()                  # (False, "NVML could not start (...)")

Inside the block ``import pynvml`` returns the fake module, and :mod:`helpers.core.nvml` starts
afresh (its cached initialisation is reset on entry and restored on exit; the gauge's
caches are emptied on entry and exit, to be recomputed on the next reading). It implements
the pynvml functions the kit calls, with nvidia-ml-py 13's signatures and return types (names
as ``str``; memory info v1 and v2 structs; process objects with ``pid`` and
``usedGpuMemory``; ``NVMLError`` subclasses chosen by error code),
and these failures (``fail=`` one name or several):

* ``"library_not_found"``: ``nvmlInit`` raises ``NVMLError_LibraryNotFound`` (no driver);
* ``"driver_not_loaded"``: ``nvmlInit`` raises ``NVMLError_DriverNotLoaded``;
* ``"memory_v2_unsupported"``: ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`` raises
  ``NVMLError_FunctionNotFound`` (drivers before the v2 entry point);
* ``"process_list_mismatch"``: ``nvmlDeviceGetComputeRunningProcesses`` raises
  ``NVMLLibraryMismatchError`` (not an ``NVMLError``!), as pynvml does on drivers without the
  ``_v3`` entry point;
* ``"process_list_no_permission"``: the process list raises ``NVMLError_NoPermission``;
* ``"not_supported"``: utilisation, temperature and power raise ``NVMLError_NotSupported``;
* ``"uuid_unsupported"``: ``nvmlDeviceGetUUID`` raises ``NVMLError_NotSupported``.

Per GPU (arguments of :class:`FakeGpu`):

* ``cgroup_hidden=True``: ``nvmlDeviceGetHandleByIndex`` raises ``NVMLError_NoPermission`` for
  that GPU, while ``nvmlDeviceGetCount`` still counts it (a SLURM job's cgroup hides the
  GPUs of other jobs on the node).
* ``mig=True``: the GPU is in MIG mode; ``nvmlDeviceGetUtilizationRates`` raises
  ``NVMLError_NotSupported`` for it, as NVML does (memory, temperature and power still answer).

Used by ``tests/rehearsal`` together with :class:`helpers.SimulatedCuda` (the default UUIDs
match: ``"GPU-" + simulated_uuid(i)``). Importing this module does not import torch.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field

from .checks import flag, real_number, text, whole_number

__all__ = ["FakeNvml", "FakeGpu", "FAILURES", "NVMLError", "NVMLLibraryMismatchError",
           "simulated_uuid"]

GiB = 1024**3


def simulated_uuid(index: int) -> str:
    """The UUID of simulated GPU ``index`` in torch's spelling (no ``GPU-`` prefix):
    :class:`helpers.SimulatedCuda` reports it, the fake NVML ``"GPU-" + simulated_uuid(i)``."""
    return f"5e1a7ed0-0000-4000-8000-{index:012x}"

FAILURES = frozenset({
    "library_not_found", "driver_not_loaded", "memory_v2_unsupported", "process_list_mismatch",
    "process_list_no_permission", "not_supported", "uuid_unsupported",
})

# error codes and texts as in nvidia-ml-py 13's pynvml.py
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
nvmlMemory_v2 = 0x02000028

_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLLibraryMismatchError(Exception):
    """pynvml's error for a function missing from the loaded driver (not an NVMLError)."""


class NVMLError(Exception):
    """pynvml's NVMLError: ``NVMLError(code)`` makes the subclass for that code."""

    _valClassMapping: dict[int, type] = {}  # noqa: N815 - pynvml's name

    def __new__(cls, value=NVML_ERROR_UNKNOWN):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, *args):
        Exception.__init__(self, self.value)

    def __str__(self) -> str:
        return _TEXT.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, code: int) -> type:
    def new(cls, *args):
        return NVMLError.__new__(cls, code)

    klass = type(f"NVMLError_{name}", (NVMLError,), {"__new__": new, "__module__": __name__})
    NVMLError._valClassMapping[code] = klass
    return klass


NVMLError_Uninitialized = _error_class("Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_DriverNotLoaded = _error_class("DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _error_class("LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class("FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_Unknown = _error_class("Unknown", NVML_ERROR_UNKNOWN)

_ERRORS = {k: v for k, v in globals().items() if k.startswith("NVMLError")}
_CONSTANTS = {k: v for k, v in globals().items() if k.startswith("NVML_")}


@dataclass
class FakeGpu:
    """One GPU as the fake NVML reports it (bytes, percent, milliwatts, degrees C).

    ``processes`` holds ``(pid, used_bytes)`` pairs; ``used_bytes`` None means the driver
    hides it (containers, WDDM). ``uuid`` defaults to ``"GPU-" + simulated_uuid(index)``.
    ``mig``: MIG mode is on (``nvmlDeviceGetMigMode`` says so, and utilisation raises
    ``NVMLError_NotSupported``). ``cgroup_hidden``: this process may not open the GPU
    (``nvmlDeviceGetHandleByIndex`` raises ``NVMLError_NoPermission``), as under a SLURM
    job's cgroup; NVML still counts it.
    """

    name: str = "NVIDIA H200"
    total_bytes: int = 143771 * 1024**2
    used_bytes: int = 0
    reserved_bytes: int = 0
    uuid: str | None = None
    gpu_util_pct: int = 0
    memory_util_pct: int = 0
    temperature_c: int = 35
    power_mw: int = 75_000
    power_limit_mw: int = 700_000
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    compute_capability: tuple[int, int] = (9, 0)
    mig: bool = False
    cgroup_hidden: bool = False

    def __post_init__(self):
        text(self.name, "name", longest=200)
        flag(self.mig, "mig")
        flag(self.cgroup_hidden, "cgroup_hidden")
        for label in ("total_bytes", "used_bytes", "reserved_bytes"):
            whole_number(getattr(self, label), label)
        if self.used_bytes + self.reserved_bytes > self.total_bytes:
            raise ValueError("used_bytes + reserved_bytes must not exceed total_bytes")


class _Struct:
    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__})"


class _Handle:
    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t {self.index}>"


class FakeNvml(types.ModuleType):
    """A fake ``pynvml`` module; ``with FakeNvml(...)`` installs it as ``sys.modules["pynvml"]``.

    Args:
        gpus: the GPUs (:class:`FakeGpu`, or a list of them); default one H200.
        driver: ``nvmlSystemGetDriverVersion()``'s answer (default ``"580.95.05"``).
        cuda_driver: ``nvmlSystemGetCudaDriverVersion()``'s answer (default 13000).
        fail: a failure name or several (see :data:`FAILURES` and the module docstring).
        this_process_bytes: if given, a process with this process's pid and that memory is
            added to GPU 0's process list.
        bytes_names: answer names as ``bytes``, as nvidia-ml-py before 11.515 did.
    """

    def __init__(self, gpus=None, *, driver: str = "580.95.05", cuda_driver: int = 13000,
                 fail=(), this_process_bytes: int | None = None, bytes_names: bool = False):
        super().__init__("pynvml", "fake pynvml (helpers.core.fake_nvml)")
        if gpus is None:
            gpus = [FakeGpu()]
        elif isinstance(gpus, FakeGpu):
            gpus = [gpus]
        gpus = list(gpus)
        if not all(isinstance(g, FakeGpu) for g in gpus):
            raise TypeError("gpus must be a FakeGpu or a list of FakeGpu")
        text(driver, "driver (a version such as '580.95.05')", longest=100)
        cuda_driver = whole_number(cuda_driver, "cuda_driver", 0, 10**6)
        if isinstance(fail, str):
            failures = {fail}
        elif isinstance(fail, (list, tuple, set, frozenset)):
            failures = set(fail)
        else:
            raise TypeError(f"fail must be a failure name or a list of them, got "
                            f"{type(fail).__name__}")
        if not all(isinstance(f, str) for f in failures):
            raise TypeError("fail must hold failure names (strings), got "
                            f"{sorted(map(repr, failures))}")
        unknown = failures - FAILURES
        if unknown:
            raise ValueError(f"fail: unknown failure(s) {sorted(unknown)}; choose from "
                             f"{sorted(FAILURES)}")
        if this_process_bytes is not None:  # checked before any GPU is changed
            if isinstance(this_process_bytes, float):  # 2e9 as before; inf and NaN refused
                number = real_number(this_process_bytes, "this_process_bytes", 0)
                if not number.is_integer():
                    raise ValueError(f"this_process_bytes must be a whole number of bytes, "
                                     f"got {number!r}")
                this_process_bytes = int(number)
            this_process_bytes = whole_number(this_process_bytes, "this_process_bytes", 0,
                                              2**63 - 1)
        bytes_names = flag(bytes_names, "bytes_names")
        self.gpus = gpus
        for i, g in enumerate(gpus):
            if g.uuid is None:
                g.uuid = "GPU-" + simulated_uuid(i)
        if this_process_bytes is not None and gpus:
            gpus[0].processes = [*gpus[0].processes, (os.getpid(), this_process_bytes)]
        self.driver = driver
        self.cuda_driver = cuda_driver
        self.failures = failures
        self.bytes_names = bytes_names
        self.log: list[tuple] = []
        self.initialised = 0
        self.__dict__.update(_ERRORS)
        self.__dict__.update(_CONSTANTS)
        self.NVMLError = NVMLError
        self.NVMLLibraryMismatchError = NVMLLibraryMismatchError
        self.nvmlMemory_v2 = nvmlMemory_v2
        self._saved: dict[str, object] = {}

    # ------------------------------------------------------------------ helpers
    def _note(self, *entry) -> None:
        self.log.append(tuple(entry))

    def calls(self, name: str) -> list[tuple]:
        """The log entries of one function, e.g. ``nv.calls("nvmlInit")``."""
        return [entry for entry in self.log if entry[0] == name]

    def _check(self) -> None:
        if self.initialised <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle) -> FakeGpu:
        self._check()
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[handle.index]

    def _query(self, call: str, handle, *args, failure: str = "not_supported") -> FakeGpu:
        """Log ``call``, check the handle, and raise NotSupported under ``failure``."""
        self._note(call, getattr(handle, "index", None), *args)
        gpu = self._gpu(handle)
        if failure in self.failures:
            raise NVMLError_NotSupported()
        return gpu

    def _system(self, *entry) -> None:
        self._note(*entry)
        self._check()

    # ------------------------------------------------------------------ pynvml API
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._note("nvmlInit")
        if "library_not_found" in self.failures:
            raise NVMLError_LibraryNotFound()
        if "driver_not_loaded" in self.failures:
            raise NVMLError_DriverNotLoaded()
        self.initialised += 1

    def nvmlInitWithFlags(self, flags: int) -> None:  # noqa: N802
        self.nvmlInit()

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._note("nvmlShutdown")
        self._check()
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._system("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._system("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._system("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        self._system("nvmlDeviceGetHandleByIndex", index)
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].cgroup_hidden:
            raise NVMLError_NoPermission()
        return _Handle(index)

    def nvmlDeviceGetIndex(self, handle) -> int:  # noqa: N802
        self._gpu(handle)
        return handle.index

    def nvmlDeviceGetCudaComputeCapability(self, handle) -> tuple[int, int]:  # noqa: N802
        return tuple(self._query("nvmlDeviceGetCudaComputeCapability", handle,
                                 failure="").compute_capability)

    def nvmlDeviceGetMigMode(self, handle) -> list[int]:  # noqa: N802
        mode = int(self._query("nvmlDeviceGetMigMode", handle, failure="").mig)
        return [mode, mode]  # (current, pending)

    def nvmlDeviceGetName(self, handle) -> str:  # noqa: N802
        name = self._query("nvmlDeviceGetName", handle, failure="").name
        return name.encode() if self.bytes_names else name

    def nvmlDeviceGetUUID(self, handle) -> str:  # noqa: N802
        return self._query("nvmlDeviceGetUUID", handle, failure="uuid_unsupported").uuid

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):  # noqa: N802
        self._note("nvmlDeviceGetMemoryInfo", getattr(handle, "index", None), version)
        g = self._gpu(handle)
        free = g.total_bytes - g.used_bytes - g.reserved_bytes
        if not version:  # v1: the driver's reserve counts as used
            return _Struct(total=g.total_bytes, free=free, used=g.used_bytes + g.reserved_bytes)
        if "memory_v2_unsupported" in self.failures:
            raise NVMLError_FunctionNotFound()
        return _Struct(version=version, total=g.total_bytes, reserved=g.reserved_bytes,
                       free=free, used=g.used_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        g = self._query("nvmlDeviceGetUtilizationRates", handle)
        if g.mig:  # NVML has no utilisation counters for a GPU in MIG mode
            raise NVMLError_NotSupported()
        return _Struct(gpu=g.gpu_util_pct, memory=g.memory_util_pct)

    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:  # noqa: N802
        g = self._query("nvmlDeviceGetTemperature", handle, sensor, failure="")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if "not_supported" in self.failures:
            raise NVMLError_NotSupported()
        return g.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle) -> int:  # noqa: N802
        return self._query("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle) -> int:  # noqa: N802
        return self._query("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def _processes(self, handle, call: str) -> list:
        g = self._query(call, handle, failure="")
        if "process_list_no_permission" in self.failures:
            raise NVMLError_NoPermission()
        return [_Struct(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                        computeInstanceId=0xFFFFFFFF) for pid, used in g.processes]

    def nvmlDeviceGetComputeRunningProcesses(self, handle) -> list:  # noqa: N802
        if "process_list_mismatch" in self.failures:
            self._note("nvmlDeviceGetComputeRunningProcesses", getattr(handle, "index", None))
            raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML "
                                           "version does not match the NVML lib version. "
                                           "Either use matching pyNVML and NVML lib "
                                           "versions or use a versioned function such as "
                                           "nvmlDeviceGetComputeRunningProcesses_v2")
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle) -> list:  # noqa: N802
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v2")

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle) -> list:  # noqa: N802
        if "process_list_mismatch" in self.failures:  # the _v3 entry point is missing
            self._note("nvmlDeviceGetComputeRunningProcesses_v3", getattr(handle, "index", None))
            raise NVMLError_FunctionNotFound()
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v3")

    # ------------------------------------------------------------------ installing
    def __enter__(self) -> FakeNvml:
        if self._saved:
            raise RuntimeError("this FakeNvml is already installed")
        self._saved["module"] = sys.modules.get("pynvml")
        sys.modules["pynvml"] = self
        nvml = sys.modules.get("helpers.core.nvml")
        if nvml is not None:
            for name, value in list(vars(nvml).items()):
                if isinstance(value, dict) and (name == "_state" or "cache" in name):
                    self._saved[f"helpers.core.nvml|{name}"] = dict(value)
                    value.clear()
                    if name == "_state":
                        value.update({"initialised": False, "error": None})
            if isinstance(getattr(nvml, "pynvml", None), types.ModuleType):
                self._saved["attr"] = nvml.pynvml  # a module-level `import pynvml`
                nvml.pynvml = self
        _reset_gauge_caches()
        return self

    def __exit__(self, *exc) -> bool:
        saved, self._saved = self._saved, {}
        module = saved.pop("module", None)
        if module is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = module
        if "attr" in saved:
            sys.modules["helpers.core.nvml"].pynvml = saved.pop("attr")
        for key, value in saved.items():
            owner, name = key.split("|", 1)
            target = getattr(sys.modules.get(owner), name, None)
            if isinstance(target, dict):
                target.clear()
                target.update(value)
        _reset_gauge_caches()
        return False

    def __repr__(self) -> str:
        names = ", ".join(g.name for g in self.gpus) or "no GPUs"
        fails = f", fail={sorted(self.failures)}" if self.failures else ""
        return f"<fake pynvml: {names}, driver {self.driver}{fails}>"


def _reset_gauge_caches() -> None:
    """Empty the gauge's GPU caches if the gauge is loaded (core never imports it)."""
    gauge = sys.modules.get("helpers.watch.gauge")
    if gauge is not None and hasattr(gauge, "reset_caches"):
        gauge.reset_caches()
