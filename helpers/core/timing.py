"""Time workloads side by side: interleaved rounds, best of each (lessons 07 and later).

A laptop shared with a browser, or two engineers on one machine, makes any single timing
unreliable. :func:`compare_times` runs every workload once per round, in a rotating order,
for several rounds, and keeps each workload's best time: background load slows all of them
alike, and the best run is the one least disturbed. Results are measured numbers, so they
print with a tilde (``~12.3 ms``, ``~1.8x``)::

    times = helpers.compare_times({"fp32": step_fp32, "bf16": step_bf16}, rounds=5)
    times                      # a table: best time per call, speed-up over the first
    times.speedup("bf16")      # best fp32 time / best bf16 time

Times print in one fixed unit (milliseconds by default), so a table's layout does not change
from machine to machine, only its ``~`` numbers. No framework is imported unless ``sync``
names a device (then torch).

GPU work is asynchronous, so every timer in the kit (:func:`compare_times`,
``helpers.throughput.compare``, ``helpers.StepTimer``) waits through :func:`sync_function`
before each clock read: pass ``sync=device`` whenever the timed work runs on a GPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .checks import choice, device_arg, positive_int, real_number, text, whole_number
from .fmt import ShownAsTable, Table, _fixed, _significant, fmt_ratio

__all__ = ["compare_times", "interleaved_rounds", "sync_function", "TimeComparison",
           "fmt_in_unit", "UNITS"]

UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6}


def fmt_in_unit(seconds, unit: str = "ms") -> str:
    """A measured duration in a fixed unit, with a tilde and 3 significant digits:
    ``fmt_in_unit(1.0502) == "~1,050 ms"``, ``fmt_in_unit(4.2e-5) == "~0.0420 ms"``."""
    value = real_number(seconds, "seconds", 0, finite=False) / UNITS[choice(unit, "unit", UNITS)]
    if value >= 100:
        return f"~{_fixed(value, 0, ',')} {unit}"
    return f"~{_significant(value, 3, zero_decimals=2)} {unit}"


def sync_function(sync) -> Callable[[], object] | None:
    """The one way the kit's timers wait for a device: what to call before each clock read.

    GPU kernels run asynchronously: a clock read right after launching work measures how fast
    Python queued it, not how long the GPU took. :func:`compare_times`,
    ``helpers.throughput.compare`` and ``helpers.StepTimer`` call the function returned here
    before every clock read (and read ``time.perf_counter`` only after it returns), so a
    timing covers the device's work and none of it spills into the next timing. Wall-clock
    time after a sync is what a training loop actually waits for (data loading and Python
    included), which CUDA events, timing the GPU's stream alone, would leave out.

    Args:
        sync: None or ``"cpu"`` (nothing to wait for), a function without arguments, or a
            device: ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a ``torch.device``.

    Returns:
        None (no waiting needed) or a function without arguments that blocks until the
        device has finished all queued work.

    Raises:
        ValueError: an unknown or malformed device, ``"cuda"`` on a machine where
            ``torch.cuda.is_available()`` is False, or a GPU index this machine lacks.
        TypeError: anything else.
    """
    if sync is None or callable(sync):
        return sync
    device = device_arg(sync, "sync")
    if device.type == "cuda":
        import torch

        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        import torch

        return torch.mps.synchronize
    return None  # the CPU (or the meta device) has nothing to wait for


@dataclass(frozen=True, repr=False)
class TimeComparison(ShownAsTable):
    """Per-call times of workloads measured side by side (see :func:`compare_times`).

    ``samples[name]`` holds one per-call time per round (seconds); ``best_seconds`` the
    smallest of each; ``baseline`` is the workload the speed-ups are relative to; ``unit``
    the unit the table prints times in.
    """

    names: tuple[str, ...]
    samples: dict[str, list[float]]
    baseline: str
    rounds: int
    number: int
    unit: str = "ms"

    def __post_init__(self):
        for n in self.names:
            if not self.samples.get(n):
                raise ValueError(f"samples[{n!r}] must hold at least one time")

    @property
    def best_seconds(self) -> dict[str, float]:
        return {n: min(self.samples[n]) for n in self.names}

    def speedup(self, name: str, over: str | None = None) -> float:
        """How many times faster ``name`` ran than ``over`` (default: the baseline)."""
        over = self.baseline if over is None else over
        for n in (name, over):
            if n not in self.samples:
                raise KeyError(f"no workload named {n!r}; measured: {', '.join(self.names)}")
        best = self.best_seconds
        if best[name] == 0:  # too fast for the clock: infinitely faster, or as fast
            return math.inf if best[over] > 0 else 1.0
        return best[over] / best[name]

    def table(self) -> Table:
        """Best time per call and speed-up of each workload, in one column.

        Measured numbers vary in length from run to run (``~98.1 ms``, ``~1,050 ms``). They
        sit in the last column, under a header longer than any of them, so that the table's
        layout stays the same when the notebook tests mask them as ``~N``.
        """
        best = self.best_seconds
        rows = []
        for n in self.names:
            rel = "baseline" if n == self.baseline else fmt_ratio(self.speedup(n))
            rows.append([n, f"{fmt_in_unit(best[n], self.unit)} ({rel})"])
        title = (f"best of {self.rounds} interleaved rounds, {self.number} call"
                 f"{'s' if self.number > 1 else ''} each")
        header = f"time per call (speed-up over {self.baseline})"
        return Table(["workload", header], rows, title=title)

    def to_dict(self) -> dict:
        return {"baseline": self.baseline, "rounds": self.rounds, "number": self.number,
                "best_seconds": self.best_seconds,
                "speedup": {n: self.speedup(n) for n in self.names}}


def compare_times(workloads: Mapping[str, Callable[[], object]], *, rounds: int = 5,
                  number: int = 1, warmup: int = 1, sync=None,
                  baseline: str | None = None, unit: str = "ms") -> TimeComparison:
    """Time workloads side by side in one process: interleaved rounds, best of each.

    Args:
        workloads: ``{"name": function without arguments}``, e.g. one training step each.
            At least one; their order is the table's order.
        rounds: how many rounds; each round times every workload once, the order rotating
            from round to round so none always runs first.
        number: calls per timing (the time reported is per call).
        warmup: untimed calls of each workload first (allocation, caches, lazy state).
        sync: make asynchronous devices finish before each clock read: ``"cuda"`` (or a
            ``torch.device``), ``"mps"``, a function, or None for the CPU (see
            :func:`sync_function`). Pass ``sync=device`` whenever the work runs on a GPU.
        baseline: the workload speed-ups are relative to (default: the first).
        unit: the unit of the printed times, "s", "ms" (default) or "µs": fixed, so the
            table looks the same on a laptop and on a GPU node.

    Returns:
        A :class:`TimeComparison` (``best_seconds``, ``speedup(name)``, a table with ``~``
        numbers).
    """
    if not isinstance(workloads, Mapping):
        raise TypeError("workloads must be a dict of {name: function}, got "
                        f"{type(workloads).__name__}")
    if not workloads:
        raise ValueError("workloads must not be empty")
    for name, fn in workloads.items():
        text(name, "a workload name", longest=200)
        if not callable(fn):
            raise TypeError(f"workload {name!r} must be a function without arguments, got "
                            f"{type(fn).__name__}")
    rounds = positive_int(rounds, "rounds", 10**6)
    number = positive_int(number, "number", 10**9)
    warmup = whole_number(warmup, "warmup", 0, 10**9)
    names = tuple(workloads)
    baseline = names[0] if baseline is None else choice(baseline, "baseline", names)
    choice(unit, "unit", UNITS)
    wait = sync_function(sync)
    for fn in workloads.values():
        for _ in range(warmup):
            fn()
    if wait is not None:
        wait()
    samples, _ = interleaved_rounds(workloads, rounds=rounds, number=number, wait=wait)
    return TimeComparison(names, samples, baseline, rounds, number, unit)


def interleaved_rounds(workloads: Mapping[str, Callable[[], object]], *, rounds: int,
                       number: int = 1, wait: Callable[[], object] | None = None,
                       rotate: bool = True) -> tuple[dict[str, list[float]], dict[str, list]]:
    """The measuring loop shared by :func:`compare_times` and ``helpers.throughput.compare``.

    Each round calls every workload ``number`` times; with ``rotate`` the order shifts by one
    each round so none always runs first. ``wait`` (e.g. ``torch.cuda.synchronize``) runs
    before and after each timing. Returns, per workload, the seconds per call of each round
    and what its last call returned in each round. Arguments are validated by the callers.
    """
    names = tuple(workloads)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    returned: dict[str, list] = {n: [] for n in names}
    for r in range(rounds):
        shift = r % len(names) if rotate else 0
        for name in names[shift:] + names[:shift]:
            fn = workloads[name]
            if wait is not None:
                wait()
            start = time.perf_counter()
            for _ in range(number):
                value = fn()
            if wait is not None:
                wait()
            seconds[name].append((time.perf_counter() - start) / number)
            returned[name].append(value)
    return seconds, returned
