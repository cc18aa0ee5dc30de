"""``SimulatedCuda``: a ``torch.cuda`` stand-in, so CUDA-only code can be rehearsed on a CPU.

::

    with helpers.VirtualGPU("L40S") as gpu, helpers.SimulatedCuda(gpu) as cuda:
        torch.cuda.is_available()          # True
        torch.cuda.get_device_name()       # "NVIDIA L40S"
        torch.cuda.memory_allocated()      # gpu.allocated_bytes
        torch.cuda.synchronize()           # logged: ("synchronize", "cuda:0")
    cuda.log                               # every call, in order

Inside the block the module-level functions of ``torch.cuda`` (``is_available``,
``device_count``, ``current_device``, ``set_device``, ``get_device_name``,
``get_device_properties``, ``get_device_capability``, ``is_initialized``, the memory
statistics, ``mem_get_info``, ``empty_cache``, ``synchronize``, the per-process memory
fraction, ``Event``, ``is_bf16_supported``, the CUDA RNG functions), plus
``torch.backends.cudnn.version`` and ``torch.version.cuda``, answer as on a machine with
``device_count`` NVIDIA GPUs. On exit every one of them is restored exactly, also after an
exception. Memory figures of device ``gpu.index`` come from the :class:`~helpers.VirtualGPU`
``gpu`` when one is given (its allocated, reserved, peaks, ``mem_get_info``); every other
device keeps settable counters (:meth:`SimulatedCuda.set_memory`).

What it does **not** do: put tensors on a GPU. ``tensor.to("cuda")`` still fails on a CPU
build of torch, and fake *cuda* tensors with ``requires_grad`` abort the interpreter, so
rehearse the CUDA branches with CPU tensors (or ``VirtualGPU(..., fake=True)`` on the CPU).

Every call is appended to :attr:`SimulatedCuda.log` as a tuple, e.g. ``("synchronize",
"cuda:0")``, ``("Event.record", 1)`` or ``("memory_allocated", "cuda:0")``;
:meth:`SimulatedCuda.watch_clock` adds ``("clock", "perf_counter")`` entries whenever
``time.perf_counter``/``time.monotonic`` are read, so a rehearsal can check that a clock is
read only after a synchronisation. Used by ``tests/rehearsal`` and the lessons' planners.
"""

from __future__ import annotations

import itertools
import numbers
import threading
import time
import timeit
from dataclasses import dataclass, field

import torch

from ..core.checks import flag, text, whole_number
from ..core.fake_nvml import simulated_uuid
from .capacity import resolve_capacity

__all__ = ["SimulatedCuda", "SimulatedDevice", "SimulatedDeviceProperties", "simulated_uuid"]

_MISSING = object()
_perf_counter = time.perf_counter  # Event times: the real clock, never a watched one
_active_lock = threading.Lock()
_active: list[SimulatedCuda] = []


@dataclass(frozen=True)
class SimulatedDeviceProperties:
    """What ``torch.cuda.get_device_properties()`` returns, for a simulated GPU."""

    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    uuid: str
    is_integrated: bool = False
    is_multi_gpu_board: bool = False


@dataclass
class SimulatedDevice:
    """One simulated GPU: its properties and, without a VirtualGPU, its memory counters."""

    index: int
    name: str
    total_bytes: int
    major: int = 9
    minor: int = 0
    multi_processor_count: int = 132
    uuid: str = ""
    allocated_bytes: int = 0
    reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    other_bytes: int = 0  # used outside this process's allocator: context, other processes
    fraction: float = 1.0
    rng_state: torch.Tensor = field(default_factory=lambda: torch.zeros(16, dtype=torch.uint8))


def _card_name(card: str | None, fallback: str) -> str:
    if card is None:
        return fallback
    return f"NVIDIA {card.replace('-', ' ')}" if card else fallback


class SimulatedEvent:
    """``torch.cuda.Event`` on a simulated GPU: ``record``, ``synchronize``, ``query``,
    ``wait`` and ``elapsed_time`` (milliseconds between two recorded, timing events)."""

    def __init__(self, sim: SimulatedCuda, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False):
        for name, value in (("enable_timing", enable_timing), ("blocking", blocking),
                            ("interprocess", interprocess), ("external", external)):
            flag(value, name)
        self._sim = sim
        self.id = next(sim._event_ids)
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._time: float | None = None
        sim._note("Event", self.id, enable_timing)

    def record(self, stream=None) -> None:
        self._sim._initialise()
        self._time = self._sim._clock()
        self._sim._note("Event.record", self.id)

    def synchronize(self) -> None:
        self._sim._note("Event.synchronize", self.id)

    def wait(self, stream=None) -> None:
        self._sim._note("Event.wait", self.id)

    def query(self) -> bool:
        self._sim._note("Event.query", self.id)
        return True

    def elapsed_time(self, end_event: SimulatedEvent) -> float:
        if not isinstance(end_event, SimulatedEvent):
            raise TypeError(f"end_event must be a torch.cuda.Event, got "
                            f"{type(end_event).__name__}")
        self._sim._note("Event.elapsed_time", self.id, end_event.id)
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    def __repr__(self) -> str:
        return f"<simulated torch.cuda.Event {self.id}>"


MOST_DEVICES = 1024  # the most GPUs a SimulatedCuda simulates


class SimulatedCuda:
    """Make ``torch.cuda`` answer as on a machine with ``device_count`` NVIDIA GPUs.

    Args:
        gpu: None (counters only), a :class:`~helpers.VirtualGPU` (device ``gpu.index`` reads
            its memory figures) or a capacity (``"L40S"``, ``"80GB"``, bytes) for every device.
            Default: an H200's capacity.
        device_count: how many GPUs ``torch.cuda.device_count()`` reports (default 1).
        name: what ``get_device_name()`` answers (default from the card: ``"NVIDIA L40S"``).
        capability: ``(major, minor)`` compute capability (default ``(9, 0)``, Hopper);
            ``is_bf16_supported()`` is True from 8.0 on.
        cudnn_version: what ``torch.backends.cudnn.version()`` answers (default 92000).
        cuda_version: what ``torch.version.cuda`` says (default ``"13.0"``; None: a
            CPU-only build).
        available: False imitates a CUDA build that cannot use its GPUs (driver too old):
            ``is_available()`` is False and ``device_count()`` 0.

    Use it as a context manager; it cannot be nested (a second one raises RuntimeError).
    Lesson planners and ``tests/rehearsal`` use it; see CONTRIBUTING.md.
    """

    #: the ``torch.cuda`` names replaced inside the block
    PATCHED = (
        "is_available", "device_count", "current_device", "set_device", "get_device_name",
        "get_device_properties", "get_device_capability", "is_initialized", "init",
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
        "reset_peak_memory_stats", "mem_get_info", "empty_cache", "synchronize",
        "memory_stats", "memory_summary",
        "set_per_process_memory_fraction", "get_per_process_memory_fraction", "Event",
        "is_bf16_supported", "get_rng_state", "get_rng_state_all", "set_rng_state",
        "set_rng_state_all", "manual_seed", "manual_seed_all", "get_arch_list",
    )

    #: the architectures ``get_arch_list()`` reports by default (torch 2.13's CUDA 13 wheel)
    ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")

    def __init__(self, gpu=None, *, device_count: int = 1, name: str | None = None,
                 capability: tuple[int, int] = (9, 0), cudnn_version: int = 92000,
                 cuda_version: str | None = "13.0", available: bool = True):
        from .virtual import VirtualGPU

        # each simulated GPU is an object with its own state: a bound keeps 2**31 from
        # hanging the kernel (the largest real nodes have 8 to 16 GPUs)
        self.device_count = whole_number(device_count, "device_count", 1, MOST_DEVICES)
        if name is not None:
            text(name, "name")
        if (not isinstance(capability, tuple) or len(capability) != 2
                or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                           for c in capability)):
            raise ValueError(f"capability must be a (major, minor) tuple of ints, got "
                             f"{capability!r}")
        self.cudnn_version = whole_number(cudnn_version, "cudnn_version", 0)
        self.cuda_version = None if cuda_version is None else text(cuda_version, "cuda_version")
        self.available = flag(available, "available")
        self.gpu = None
        if isinstance(gpu, VirtualGPU):
            self.gpu = gpu
            if gpu.index >= self.device_count:
                raise ValueError(f"gpu has index {gpu.index}, but device_count is "
                                 f"{self.device_count}")
            card, total = (gpu.name if gpu.name in _known() else None), gpu.capacity_bytes
        elif gpu is None:
            card, total = resolve_capacity("H200")
        elif isinstance(gpu, (str, numbers.Real)) and not isinstance(gpu, bool):
            card, total = resolve_capacity(gpu, what="gpu")
        else:
            raise TypeError(f"gpu must be None, a helpers.VirtualGPU or a capacity such as "
                            f"'L40S', got {type(gpu).__name__}: {gpu!r}")
        label = name or _card_name(card, "NVIDIA simulated GPU")
        self.devices = [
            SimulatedDevice(i, label, total, capability[0], capability[1],
                            uuid=simulated_uuid(i))
            for i in range(self.device_count)
        ]
        self.log: list[tuple] = []
        self._threads: list[int] = []  # the thread of each log entry
        self.initialized = False
        self.current = 0
        self._saved: dict[tuple[object, str], object] = {}
        self._clock = _perf_counter
        self._event_ids = itertools.count(1)
        self._active = False

    # ------------------------------------------------------------------ helpers
    def _note(self, *entry) -> None:
        self._threads.append(threading.get_ident())  # before the entry: same length
        self.log.append(tuple(entry))

    def _initialise(self) -> None:
        self.initialized = True

    def _index(self, device, what: str = "device") -> int:
        """The device number of ``device`` (None: the current one)."""
        if device is None:
            return self.current
        if isinstance(device, bool):
            raise TypeError(f"{what} must be a device number, 'cuda', 'cuda:N' or a "
                            f"torch.device, got {device!r}")
        if isinstance(device, numbers.Integral):
            index = int(device)
        elif isinstance(device, (str, torch.device)):
            try:
                dev = torch.device(device)
            except RuntimeError as exc:
                raise ValueError(f"{what}: {exc}") from None
            if dev.type != "cuda":
                raise ValueError(f"{what} must be a cuda device, got {str(dev)!r}")
            index = self.current if dev.index is None else dev.index
        else:
            raise TypeError(f"{what} must be a device number, 'cuda', 'cuda:N' or a "
                            f"torch.device, got {type(device).__name__}: {device!r}")
        if not 0 <= index < self.device_count:
            raise ValueError(f"{what}: invalid device ordinal {index} (this simulated machine "
                             f"has {self.device_count} GPU(s))")
        return index

    def _device(self, device, call: str) -> tuple[int, SimulatedDevice]:
        index = self._index(device)
        self._note(call, f"cuda:{index}")
        return index, self.devices[index]

    def _backed(self, index: int) -> bool:
        return self.gpu is not None and index == self.gpu.index

    # ------------------------------------------------------------------ settable counters
    def set_memory(self, device=0, *, allocated=None, reserved=None, other=None) -> None:
        """Set the counters of ``device`` (bytes; not for the VirtualGPU's device).

        ``allocated``/``reserved`` raise the peaks when they exceed them; ``other`` is what
        ``mem_get_info`` counts as used outside this process's allocator.
        """
        index = self._index(device)
        if self._backed(index):
            raise ValueError(f"device {index} reads its memory from the VirtualGPU; "
                             "allocate tensors there instead")
        d = self.devices[index]
        for label, value in (("allocated", allocated), ("reserved", reserved),
                             ("other", other)):
            if value is not None:
                setattr(d, f"{label}_bytes", whole_number(value, label, 0))
        if d.reserved_bytes < d.allocated_bytes:
            d.reserved_bytes = d.allocated_bytes
        if d.reserved_bytes + d.other_bytes > d.total_bytes:
            raise ValueError("reserved + other must not exceed the device's total memory")
        d.peak_allocated_bytes = max(d.peak_allocated_bytes, d.allocated_bytes)
        d.peak_reserved_bytes = max(d.peak_reserved_bytes, d.reserved_bytes)

    def allocate(self, n_bytes: int, device=None) -> None:
        """Allocate ``n_bytes`` on a counter device as the caching allocator would: cached
        blocks are reused first, and a reserve beyond ``set_per_process_memory_fraction``'s
        share of the total (or beyond the free memory) raises ``torch.OutOfMemoryError``."""
        index = self._index(device)
        if self._backed(index):
            raise ValueError(f"device {index} reads its memory from the VirtualGPU; "
                             "allocate tensors there instead")
        n = whole_number(n_bytes, "n_bytes", 0)
        d = self.devices[index]
        allocated = d.allocated_bytes + n
        reserved = max(d.reserved_bytes, allocated)
        limit = min(int(d.fraction * d.total_bytes), d.total_bytes - d.other_bytes)
        if reserved > limit:
            from .virtual import oom_message

            raise torch.OutOfMemoryError(oom_message(
                tried=n, capacity=d.total_bytes, context=d.other_bytes,
                allocated=d.allocated_bytes, reserved=d.reserved_bytes, device_index=index)
                + " [simulated by helpers.SimulatedCuda]")
        d.allocated_bytes, d.reserved_bytes = allocated, reserved
        d.peak_allocated_bytes = max(d.peak_allocated_bytes, allocated)
        d.peak_reserved_bytes = max(d.peak_reserved_bytes, reserved)

    def free(self, n_bytes: int, device=None) -> None:
        """Free ``n_bytes`` on a counter device; they stay reserved (cached)."""
        index = self._index(device)
        d = self.devices[index]
        n = whole_number(n_bytes, "n_bytes", 0)
        if n > d.allocated_bytes:
            raise ValueError(f"n_bytes ({n}) is more than device {index} has allocated "
                             f"({d.allocated_bytes})")
        d.allocated_bytes -= n

    def clear_log(self) -> None:
        """Forget the calls logged so far."""
        self.log.clear()
        self._threads.clear()

    def calls(self, name: str) -> list[tuple]:
        """The log entries of one call, e.g. ``sim.calls("synchronize")``."""
        return [entry for entry in self.log if entry[0] == name]

    # ------------------------------------------------------------------ torch.cuda API
    def is_available(self) -> bool:
        self._note("is_available")
        return self.available

    def _device_count(self) -> int:
        self._note("device_count")
        return self.device_count if self.available else 0

    def get_arch_list(self) -> list[str]:
        self._note("get_arch_list")
        return list(self.ARCHS)

    def current_device(self) -> int:
        self._initialise()
        self._note("current_device")
        return self.current

    def set_device(self, device) -> None:
        index = self._index(device)
        self._initialise()
        self._note("set_device", f"cuda:{index}")
        self.current = index

    def init(self) -> None:
        self._initialise()
        self._note("init")

    def is_initialized(self) -> bool:
        self._note("is_initialized")
        return self.initialized

    def get_device_properties(self, device=None) -> SimulatedDeviceProperties:
        self._initialise()
        _, d = self._device(device, "get_device_properties")
        return SimulatedDeviceProperties(d.name, d.total_bytes, d.major, d.minor,
                                         d.multi_processor_count, d.uuid)

    def get_device_name(self, device=None) -> str:
        self._initialise()
        return self._device(device, "get_device_name")[1].name

    def get_device_capability(self, device=None) -> tuple[int, int]:
        self._initialise()
        d = self._device(device, "get_device_capability")[1]
        return d.major, d.minor

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        flag(including_emulation, "including_emulation")
        self._initialise()
        self._note("is_bf16_supported", including_emulation)
        return self.devices[self.current].major >= 8 or including_emulation

    def memory_allocated(self, device=None) -> int:
        index, d = self._device(device, "memory_allocated")
        return self.gpu.allocated_bytes if self._backed(index) else d.allocated_bytes

    def max_memory_allocated(self, device=None) -> int:
        index, d = self._device(device, "max_memory_allocated")
        return self.gpu.peak_allocated_bytes if self._backed(index) else d.peak_allocated_bytes

    def memory_reserved(self, device=None) -> int:
        index, d = self._device(device, "memory_reserved")
        return self.gpu.reserved_bytes if self._backed(index) else d.reserved_bytes

    def max_memory_reserved(self, device=None) -> int:
        index, d = self._device(device, "max_memory_reserved")
        return self.gpu.peak_reserved_bytes if self._backed(index) else d.peak_reserved_bytes

    def reset_peak_memory_stats(self, device=None) -> None:
        index, d = self._device(device, "reset_peak_memory_stats")
        if self._backed(index):
            self.gpu.reset_peak()
        else:
            d.peak_allocated_bytes, d.peak_reserved_bytes = d.allocated_bytes, d.reserved_bytes

    def memory_stats(self, device=None) -> dict:
        """The allocator's counters that the simulation knows, under PyTorch's key names
        (``allocated_bytes.all.current``, ``...peak``, ``reserved_bytes.all.*``,
        ``num_ooms``); the other keys of a real card's dict are absent."""
        index, d = self._device(device, "memory_stats")
        return self._counters(index, d)

    def _counters(self, index: int, d: SimulatedDevice) -> dict:
        if self._backed(index):
            g = self.gpu
            values = (g.allocated_bytes, g.peak_allocated_bytes, g.reserved_bytes,
                      g.peak_reserved_bytes, g.n_oom)
        else:
            values = (d.allocated_bytes, d.peak_allocated_bytes, d.reserved_bytes,
                      d.peak_reserved_bytes, 0)
        keys = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "reserved_bytes.all.peak", "num_ooms")
        return dict(zip(keys, values, strict=True))

    def memory_summary(self, device=None, abbreviated: bool = False) -> str:
        """A short table in the layout of ``torch.cuda.memory_summary()``: allocated and
        reserved memory, current and peak (a real card's table has more rows)."""
        index, d = self._device(device, "memory_summary")
        stats = self._counters(index, d)

        def mib(n):
            return f"{n / 2**20:,.0f} MiB"

        rule = "|" + "=" * 60 + "|"
        rows = [rule, f"|{'PyTorch CUDA memory summary (simulated), device ' + str(index):^60}|",
                rule, f"| {'Metric':<26}| {'Cur Usage':>14} | {'Peak Usage':>14} |", rule]
        for label, key in (("Allocated memory", "allocated_bytes"),
                           ("GPU reserved memory", "reserved_bytes")):
            rows.append(f"| {label:<26}| {mib(stats[key + '.all.current']):>14} | "
                        f"{mib(stats[key + '.all.peak']):>14} |")
        rows += [rule, f"| {'Out-of-memory errors: ' + str(stats['num_ooms']):<59}|", rule]
        return "\n".join(rows)

    def mem_get_info(self, device=None) -> tuple[int, int]:
        self._initialise()
        index, d = self._device(device, "mem_get_info")
        if self._backed(index):
            return self.gpu.free_bytes, self.gpu.capacity_bytes
        return d.total_bytes - d.reserved_bytes - d.other_bytes, d.total_bytes

    def empty_cache(self) -> None:
        index = self.current
        self._note("empty_cache", f"cuda:{index}")
        if self._backed(index):
            self.gpu.empty_cache()
        else:
            d = self.devices[index]
            d.reserved_bytes = d.allocated_bytes

    def synchronize(self, device=None) -> None:
        self._initialise()
        self._device(device, "synchronize")

    def set_per_process_memory_fraction(self, fraction, device=None) -> None:
        if not isinstance(fraction, float):
            raise TypeError(f"fraction must be a float, got {type(fraction).__name__}: "
                            f"{fraction!r}")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
        self._initialise()
        index, d = self._device(device, "set_per_process_memory_fraction")
        self.log[-1] = ("set_per_process_memory_fraction", f"cuda:{index}", fraction)
        d.fraction = fraction

    def get_per_process_memory_fraction(self, device=None) -> float:
        return self._device(device, "get_per_process_memory_fraction")[1].fraction

    def Event(self, enable_timing: bool = False, blocking: bool = False,  # noqa: N802
              interprocess: bool = False, external: bool = False) -> SimulatedEvent:
        return SimulatedEvent(self, enable_timing, blocking, interprocess, external)

    # RNG: one state per device, kept as CPU byte tensors
    def get_rng_state(self, device="cuda") -> torch.Tensor:
        return self._device(device, "get_rng_state")[1].rng_state.clone()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        self._note("get_rng_state_all")
        return [d.rng_state.clone() for d in self.devices]

    def set_rng_state(self, new_state, device="cuda") -> None:
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
            raise TypeError(f"new_state must be a torch.ByteTensor, got {new_state!r}")
        if new_state.device.type != "cpu":
            raise ValueError("new_state must be a CPU tensor (torch.cuda.set_rng_state wants "
                             f"a CPU ByteTensor), got one on {new_state.device}")
        self._device(device, "set_rng_state")[1].rng_state = new_state.clone()

    def set_rng_state_all(self, new_states) -> None:
        for i, s in enumerate(new_states):
            self.set_rng_state(s, i)

    def manual_seed(self, seed) -> None:
        d = self._device(None, "manual_seed")[1]
        d.rng_state = torch.full((16,), int(seed) % 256, dtype=torch.uint8)

    def manual_seed_all(self, seed) -> None:
        self._note("manual_seed_all", int(seed))
        for d in self.devices:
            d.rng_state = torch.full((16,), int(seed) % 256, dtype=torch.uint8)

    # ------------------------------------------------------------------ clock
    def watch_clock(self, *, all_threads: bool = False) -> _ClockWatch:
        """A context manager that logs ``("clock", name)`` each time ``time.perf_counter``,
        ``time.perf_counter_ns``, ``time.monotonic``, ``time.monotonic_ns`` or
        ``timeit.default_timer`` is read inside it: by the thread that entered it, or by any
        thread with ``all_threads=True``."""
        return _ClockWatch(self, flag(all_threads, "all_threads"))

    def clock_reads_after(self, call: str = "synchronize") -> list[bool]:
        """For each ``clock`` entry the calling thread logged: was ``call`` the CUDA call this
        thread logged last before it (ignoring other clock reads)? ``all(...)`` means every
        read followed ``call``. Entries of other threads (a gauge's poller) are ignored."""
        me = threading.get_ident()
        out, last = [], None
        threads = self._threads[len(self._threads) - len(self.log):]  # log may be cleared
        for entry, thread in zip(self.log, threads, strict=True):
            if thread != me:
                continue
            if entry[0] == "clock":
                out.append(last == call)
            else:
                last = entry[0]
        return out

    # ------------------------------------------------------------------ patching
    def _targets(self):
        cuda = torch.cuda
        for name in self.PATCHED:
            attr = "_device_count" if name == "device_count" else name
            yield cuda, name, getattr(self, attr)
        yield torch.backends.cudnn, "version", self._cudnn_version
        yield torch.version, "cuda", self.cuda_version

    def _cudnn_version(self) -> int:
        self._note("cudnn.version")
        return self.cudnn_version

    def __enter__(self) -> SimulatedCuda:
        with _active_lock:
            if self._active or _active:
                raise RuntimeError("a SimulatedCuda is already active: do not nest them")
            _active.append(self)
            self._active = True
        try:
            for module, name, value in self._targets():
                self._saved[(module, name)] = module.__dict__.get(name, _MISSING)
                setattr(module, name, value)
        except BaseException:
            self._restore()
            raise
        return self

    def _restore(self) -> None:
        for (module, name), value in reversed(list(self._saved.items())):
            if value is _MISSING:
                module.__dict__.pop(name, None)
            else:
                setattr(module, name, value)
        self._saved.clear()
        with _active_lock:
            if self in _active:
                _active.remove(self)
            self._active = False

    def __exit__(self, *exc) -> bool:
        self._restore()
        return False

    def __repr__(self) -> str:
        d = self.devices[0]
        backing = f", memory from {self.gpu!r}" if self.gpu is not None else ""
        return (f"SimulatedCuda({self.device_count} x {d.name}, {d.total_bytes} bytes"
                f"{backing}, {'active' if self._active else 'inactive'})")


def _known():
    from .capacity import KNOWN_GPUS

    return KNOWN_GPUS


_CLOCKS = ((time, "perf_counter"), (time, "perf_counter_ns"), (time, "monotonic"),
           (time, "monotonic_ns"), (timeit, "default_timer"))


class _ClockWatch:
    def __init__(self, sim: SimulatedCuda, all_threads: bool):
        self.sim = sim
        self.all_threads = all_threads
        self._thread = None
        self._saved: list[tuple[object, str, object]] = []

    def __enter__(self) -> SimulatedCuda:
        if self._saved:
            raise RuntimeError("this clock watch is already active")
        self._thread = threading.get_ident()
        for module, name in _CLOCKS:
            original = getattr(module, name)
            self._saved.append((module, name, original))
            setattr(module, name, self._wrap(name, original))
        return self.sim

    def _wrap(self, name, original):
        label = "perf_counter" if name == "default_timer" else name
        note, everyone, owner = self.sim._note, self.all_threads, self._thread

        def clock():
            if everyone or threading.get_ident() == owner:
                note("clock", label)
            return original()

        clock.__wrapped__ = original
        return clock

    def __exit__(self, *exc) -> bool:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()
        return False
