"""Find what limits a training loop's throughput: data, host syncs or compute (lesson 09).

Three tools, none of which imports torch or TensorFlow until it is used:

* :class:`SlowDataset`: a synthetic data set whose samples take time to load, as if each
  were read from a network file system and decoded.  The wait is simulated with
  ``time.sleep`` (it releases the GIL and uses no CPU), so loader workers overlap it even
  on a busy two-core laptop; the decoding is real NumPy work.  It is a plain class in an
  importable module, so PyTorch ``DataLoader`` workers can load it under both ``fork``
  (Linux) and ``spawn`` (macOS, Windows), and ``tf.data`` can call :meth:`SlowDataset.load_batch`.
* :class:`StepTimer`: splits each training step into *data wait* (time spent in the
  loader's ``next()``) and *compute* (everything else), samples NVML's GPU-Util of the GPU
  the process uses when NVML can read it, shows the split live in a notebook and draws it
  per step at the end::

      timer = helpers.StepTimer(sync=device)      # syncs CUDA so GPU time lands in its step
      for xb, yb in timer.wrap(loader):
          ...                                     # the training step
          timer.step(samples=len(xb))
      print(timer.close())                        # one line: samples/s, wait vs compute

* :func:`compare`: runs workloads side by side in one process, interleaved over rounds
  (best of each), and returns samples/s and speed-ups as a :class:`Comparison`.

:func:`throughput_gpu_results` loads the numbers ``tests/gpu/throughput_gpu.py`` recorded on a
real GPU, if the kit has them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .core.checks import LARGEST, flag, positive_int, real_number, shown, whole_number
from .core.fmt import ShownAsTable, Table, fmt_rate, fmt_ratio
from .core.timing import interleaved_rounds, sync_function
from .watch.base import LiveView, new_figure, png_bytes

__all__ = [
    "SlowDataset", "StepTimer", "StepTimes", "compare", "Comparison", "RungResult",
    "throughput_gpu_results", "RecordedResults", "RESULTS_DIR", "RESULTS_NAME",
]

RESULTS_DIR = Path(__file__).resolve().parent.parent / "tests" / "gpu" / "results"
RESULTS_NAME = "09_throughput"
_WAIT_COLOUR, _COMPUTE_COLOUR, _UTIL_COLOUR = "#E69F00", "#0072B2", "#009E73"
_THIS_GPU = "this process's GPU"  # StepTimer's default GPU, found when it first samples


# ------------------------------------------------------------------------------ data set
class IndexOutOfRange(IndexError, ValueError):
    """An index outside a data set: an IndexError (the Dataset protocol, which ends plain
    iteration) that is also the ValueError a bad argument gets."""


class SlowDataset:
    """A map-style data set whose samples cost time to load (lesson 09).

    Each sample is stored "raw" as ``uint8`` and decoded to ``float32`` on access (real,
    cheap CPU work); loading also waits ``latency_s`` per sample, as reading a small file
    from a network disk would.  Samples depend only on their index, so any number of
    loader workers, in any order, produce the same batches.

    Args:
        n_samples, n_features, n_classes: the size of the Gaussian-blob classification
            problem (see :func:`helpers.classification_data`).
        latency_s: simulated I/O wait per sample in seconds (0 to 10; default 0.5 ms).
        noise: spread of each class around its centre (default 12: a model needs a few
            epochs to learn it, so loss curves fall visibly).
        seed: the data's seed.

    PyTorch's ``DataLoader`` fetches a whole batch through :meth:`__getitems__` (one wait of
    ``latency_s * batch`` instead of one sleep per sample, so the simulated cost is exact);
    :meth:`load_batch` is the same for ``tf.data`` (through ``tf.numpy_function``).
    """

    def __init__(self, n_samples: int = 2048, n_features: int = 256, n_classes: int = 10, *,
                 latency_s: float = 5e-4, noise: float = 12.0, seed: int = 0):
        from .core.data import classification_data

        self.latency_s = real_number(latency_s, "latency_s", 0.0, 10.0)
        x, y = classification_data(n_samples, n_features, n_classes, seed=seed, noise=noise)
        self.scale = 127.0 / max(float(np.abs(x).max()), 1e-6)  # floats -> bytes around 128
        self.raw = np.clip(np.rint(x * self.scale + 128.0), 0, 255).astype(np.uint8)
        self.labels = y
        self.n_features = int(n_features)
        self.n_classes = int(n_classes)

    def __len__(self) -> int:
        return len(self.labels)

    def _index(self, i) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"index must be an int, got {type(i).__name__}: {i!r}")
        n = len(self)
        if not -n <= i < n:
            raise IndexOutOfRange(f"index {i} is out of range for a data set of {n} samples")
        return int(i)

    def decode(self, i: int) -> tuple[np.ndarray, np.int64]:
        """Sample ``i`` without the simulated wait: the decoding work alone."""
        i = self._index(i)
        return (self.raw[i].astype(np.float32) - 128.0) / np.float32(self.scale), self.labels[i]

    def __getitem__(self, i):
        time.sleep(self.latency_s)
        return self.decode(i)

    def __getitems__(self, indices) -> list:
        """A batch of samples in one call (PyTorch's DataLoader uses it when it exists)."""
        indices = list(indices)
        time.sleep(self.latency_s * len(indices))
        return [self.decode(i) for i in indices]

    def load_batch(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Stacked ``(x float32 (b, n_features), y int64 (b,))`` for the indices, after the
        same simulated wait as :meth:`__getitems__` (for ``tf.numpy_function``)."""
        samples = self.__getitems__(np.asarray(indices).reshape(-1).tolist())
        return (np.stack([s[0] for s in samples]), np.array([s[1] for s in samples],
                                                             dtype=np.int64))

    def __repr__(self) -> str:
        return (f"SlowDataset({len(self)} samples x {self.n_features} features, "
                f"{self.n_classes} classes, {self.latency_s * 1e3:g} ms I/O wait per sample)")


# ------------------------------------------------------------------------------ timing
@dataclass(frozen=True, repr=False)
class StepTimes(ShownAsTable):
    """What a :class:`StepTimer` measured; prints as one line whose only changing parts
    are the measured (``~``) numbers."""

    steps: int
    samples: int
    wait_seconds: float
    compute_seconds: float
    gpu_util_pct: float | None  # mean NVML GPU-Util over the samples taken, if any
    gpu_util_note: str

    @property
    def seconds(self) -> float:
        return self.wait_seconds + self.compute_seconds

    @property
    def wait_share(self) -> float:
        """Share of the step time spent waiting for data (0..1)."""
        return self.wait_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def samples_per_second(self) -> float | None:
        return self.samples / self.seconds if self.samples and self.seconds > 0 else None

    @property
    def bound(self) -> str:
        """``"input-bound"`` (waits for data >= 50% of the time), ``"partly input-bound"``
        (>= 15%) or ``"compute-bound"``."""
        share = self.wait_share
        if share >= 0.5:
            return "input-bound"
        return "partly input-bound" if share >= 0.15 else "compute-bound"

    def text(self) -> str:
        parts = [f"StepTimer: {self.steps} steps"]
        if self.samples:
            parts.append(f"{self.samples} samples")
        if self.samples_per_second is not None:
            parts.append(fmt_rate(self.samples_per_second))
        parts.append(f"data wait ~{100 * self.wait_share:.0f}% of step time, "
                     f"compute ~{100 * (1 - self.wait_share):.0f}%")
        if self.gpu_util_pct is not None:
            parts.append(f"GPU-Util ~{self.gpu_util_pct:.0f}%")
        return ", ".join(parts)


class StepTimer(LiveView):
    """Time how long each training step waits for data and how long it computes (lesson 09).

    Wrap the loader with :meth:`wrap` and call :meth:`step` at the end of each step.  The
    wait is the time spent inside the loader's ``next()`` (including starting its workers);
    compute is the rest of the step.  On a GPU, pass ``sync=device``: kernels run
    asynchronously, so without a sync the GPU's work would be counted in whichever later
    call happens to wait for it (a diagnosis tool, not for every run: a sync per step
    costs a little throughput itself).

    Args:
        sync: None (default), a function to call before each step's clock is read, or a
            device (``"cuda"``, ``torch.device("cuda:0")``, ``"mps"``; ``"cpu"`` = None).
        gpu_util: sample NVML's GPU-Util of this GPU during the loop (at most every 0.2 s):
            NVML's number, as in nvidia-smi, which ignores ``CUDA_VISIBLE_DEVICES``.
            ``None`` (default): the GPU this process's torch uses (its current device, or
            the one ``sync`` names), matched by UUID once the process has started CUDA (the
            timer never starts it), or the only GPU of a machine with one;
            ``False``: never.  Where NVML cannot read it (a GPU in MIG mode, one this job's
            cgroup hides) the steps are still timed and ``gpu_util_note`` says why.
        show: show a live bar of data wait vs compute per step (JupyterLab only).
        min_interval: seconds between live redraws (>= 0.1).
    """

    kind = "steptimer"
    png_when_live = True  # the per-step figure follows the live bar

    def __init__(self, sync=None, *, gpu_util=None, show: bool = True,
                 min_interval: float = 0.25):
        self._sync = sync_function(sync)
        self._cuda_index = _cuda_index(sync)
        show = flag(show, "show")
        self._init_view(real_number(min_interval, "min_interval", 0.1, 3600.0), budget=0.01)
        self._gpu, self.gpu_util_note = self._pick_gpu(gpu_util)
        self.wait_s: list[float] = []
        self.compute_s: list[float] = []
        self.samples: list[int] = []
        self.util: list[tuple[int, int]] = []  # (step, GPU-Util %)
        self._pending_wait = 0.0
        self._last_end: float | None = None
        self._next_util = 0.0
        if show:
            self.show()

    @staticmethod
    def _pick_gpu(gpu_util):
        from .core import nvml

        if gpu_util is False:
            return None, "GPU-Util not sampled (gpu_util=False)"
        if gpu_util is not None:
            whole_number(gpu_util, "gpu_util (None, False or a GPU index)")
        ok, why = nvml.nvml_status()
        if not ok:
            return None, f"no GPU-Util: {why}"
        count = nvml.gpu_count()
        index = 0 if gpu_util is None else gpu_util
        if index >= count:
            return None, f"no GPU-Util: NVML sees {count} GPU(s), so there is no GPU {index}"
        if gpu_util is None:
            return _THIS_GPU, "GPU-Util from NVML of the GPU this process uses (not sampled yet)"
        return index, f"GPU-Util of GPU {index} from NVML"

    def _sample_util(self) -> None:
        """Read GPU-Util once; on the first read find the GPU, and stop (with the reason in
        ``gpu_util_note``) where NVML cannot read it."""
        from .core import nvml

        if self._gpu is _THIS_GPU:
            self._gpu, self.gpu_util_note = _process_gpu(self._cuda_index)
            if self._gpu is None or self._gpu is _THIS_GPU:
                return
        rates = nvml.gpu_utilization(self._gpu)
        if rates is not None:
            self.util.append((len(self.wait_s) - 1, rates[0]))
            return
        _, why = nvml.gpu_utilization_or_why(self._gpu)
        self._gpu, self.gpu_util_note = None, f"no GPU-Util: {why or 'NVML did not say why'}"

    # ------------------------------------------------------------------ recording
    def wrap(self, iterable: Iterable):
        """Iterate over ``iterable`` (a DataLoader, a tf.data.Dataset, any iterable),
        timing every ``next()`` as data wait.  Call :meth:`step` once per item."""
        if self.closed:
            raise RuntimeError("this StepTimer is closed; create a new one for a new run")
        self._last_end = time.perf_counter()  # gaps between epochs are not counted
        t0 = time.perf_counter()
        iterator = iter(iterable)  # starts non-persistent workers: part of the first wait
        self._pending_wait += time.perf_counter() - t0
        while True:
            t0 = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                self._pending_wait = 0.0
                return
            self._pending_wait += time.perf_counter() - t0
            yield item

    def step(self, samples: int | None = None) -> None:
        """Mark the end of one training step (after the optimizer step)."""
        if self.closed:
            raise RuntimeError("this StepTimer is closed; create a new one for a new run")
        samples = 0 if samples is None else whole_number(samples, "samples")
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        start = self._last_end if self._last_end is not None else now
        total = now - start
        wait = min(self._pending_wait, total)
        self.wait_s.append(wait)
        self.compute_s.append(total - wait)
        self.samples.append(samples)
        self._pending_wait = 0.0
        if self._gpu is not None and now >= self._next_util:
            self._sample_util()
            self._next_util = now + 0.2
        if self._live and now >= self._next:
            self._tick()
        self._last_end = time.perf_counter()

    # ------------------------------------------------------------------ results
    def summary(self) -> StepTimes:
        util = round(sum(u for _, u in self.util) / len(self.util), 1) if self.util else None
        return StepTimes(steps=len(self.wait_s), samples=sum(self.samples),
                         wait_seconds=sum(self.wait_s), compute_seconds=sum(self.compute_s),
                         gpu_util_pct=util, gpu_util_note=self.gpu_util_note)

    _value = summary

    def close(self) -> StepTimes:
        """Finish: draw the per-step figure (in a notebook) and return the summary."""
        return super().close()

    def text(self) -> str:
        return self.summary().text()

    def _frame(self) -> str:
        return self.html()

    def _figure_caption(self) -> str:
        n = len(self.wait_s)
        return f"[figure: data wait and compute per step, {n} steps]" if n else ""

    def html(self, last: int = 120) -> str:
        """The live view: the last ``last`` steps as stacked columns (wait over compute)
        and the shares so far."""
        last = positive_int(last, "last")
        waits, comps = self.wait_s[-last:], self.compute_s[-last:]
        totals = sorted(w + c for w, c in zip(waits, comps, strict=True))
        # scale to 3x the median step, so one slow first step (workers starting) does not
        # flatten all the others; taller steps are clipped
        tallest = min(totals[-1], 3 * totals[len(totals) // 2]) if totals else 0.0
        tallest = tallest or 1.0
        cols = []
        for w, c in zip(waits, comps, strict=True):
            wait_px = min(60.0, 60 * w / tallest)
            comp_px = min(60.0 - wait_px, 60 * c / tallest)
            cols.append(
                f'<div style="display:flex;flex-direction:column;justify-content:flex-end;'
                f'width:4px;height:60px;margin-right:1px">'
                f'<div style="height:{wait_px:.1f}px;background:{_WAIT_COLOUR}"></div>'
                f'<div style="height:{comp_px:.1f}px;background:{_COMPUTE_COLOUR}"></div>'
                f"</div>")
        cols = "".join(cols)
        s = self.summary()
        line = (f'<span style="color:{_WAIT_COLOUR}">&#9632;</span> data wait '
                f"{100 * s.wait_share:.0f}% &nbsp;"
                f'<span style="color:{_COMPUTE_COLOUR}">&#9632;</span> compute '
                f"{100 * (1 - s.wait_share):.0f}% &nbsp;· {s.steps} steps")
        if s.samples_per_second is not None:
            line += f" · {fmt_rate(s.samples_per_second).lstrip('~')}"
        if self.util:
            line += f" · GPU-Util {self.util[-1][1]}% (NVML)"
        return (f'<div class="gl-steptimer" style="font-family:var(--jp-ui-font-family,'
                f'sans-serif);font-size:12px"><div style="display:flex;align-items:flex-end;'
                f'height:62px">{cols}</div><div>{line}</div></div>')

    def figure(self):
        """A matplotlib Figure: data wait and compute per step (ms), stacked, with NVML's
        GPU-Util on a second axis when it was sampled."""
        fig = new_figure(7.0, 2.6)
        ax = fig.subplots()
        steps = np.arange(len(self.wait_s))
        wait_ms = 1e3 * np.asarray(self.wait_s)
        comp_ms = 1e3 * np.asarray(self.compute_s)
        ax.bar(steps, wait_ms, width=1.0, color=_WAIT_COLOUR, label="data wait")
        ax.bar(steps, comp_ms, width=1.0, bottom=wait_ms, color=_COMPUTE_COLOUR,
               label="compute")
        ax.set_xlabel("step", fontsize=9)
        ax.set_ylabel("ms per step", fontsize=9)
        ax.set_facecolor("white")
        ax.tick_params(labelsize=8)
        share = self.summary().wait_share
        ax.set_title(f"data wait {100 * share:.0f}% of step time", fontsize=9, loc="left")
        handles, labels = ax.get_legend_handles_labels()
        if self.util:
            ax2 = ax.twinx()
            xs, ys = zip(*self.util, strict=True)
            line, = ax2.plot(xs, ys, color=_UTIL_COLOUR, marker=".", label="GPU-Util (NVML)")
            ax2.set_ylim(0, 105)
            ax2.set_ylabel("GPU-Util %", fontsize=9)
            ax2.tick_params(labelsize=8)
            handles.append(line)
            labels.append("GPU-Util (NVML)")
        ax.legend(handles, labels, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3,
                  fontsize=7, frameon=False, borderaxespad=0.2)
        fig.tight_layout()
        return fig

    def png(self) -> bytes:
        return png_bytes(self.figure())


def _cuda_index(sync) -> int | None:
    """The CUDA device number a ``sync`` device names (``"cuda:1"``), else None."""
    if sync is None or callable(sync):
        return None
    import torch  # sync_function has accepted it as a device, so torch is there

    device = torch.device(sync)
    return device.index if device.type == "cuda" else None


def _process_gpu(cuda_index: int | None):
    """(NVML's number of the GPU this process's torch uses, the note to show).

    NVML numbers GPUs as nvidia-smi does; torch after ``CUDA_VISIBLE_DEVICES`` (and SLURM's
    cgroup): they are matched by UUID.  Reading torch's UUID starts a CUDA context, so, like
    the memory gauge, only a process that has started CUDA is asked; before that the answer
    is ``_THIS_GPU`` (ask again later), unless the machine has one GPU and nothing hides it.
    None when it cannot be known."""
    from .core import nvml

    if not nvml.cuda_started():
        count = nvml.gpu_count()
        if count == 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
            return 0, "GPU-Util of GPU 0 from NVML (the only GPU)"
        return _THIS_GPU, (f"no GPU-Util: this process has not started CUDA, so which of the "
                           f"{count} GPUs NVML sees is its own is unknown")
    torch = sys.modules["torch"]  # CUDA has started: torch is imported
    try:
        index = int(torch.cuda.current_device() if cuda_index is None else cuda_index)
        uuid = nvml.plain_uuid(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
    except Exception as exc:  # noqa: BLE001
        return None, (f"no GPU-Util: torch cannot say which GPU it uses "
                      f"({type(exc).__name__}: {exc})")
    for gpu in nvml.list_gpus():
        if uuid and nvml.plain_uuid(gpu.uuid) == uuid:
            return gpu.index, (f"GPU-Util of GPU {gpu.index} from NVML (this process's "
                               f"cuda:{index}, matched by UUID)")
    return None, (f"no GPU-Util: NVML lists no GPU with the UUID of this process's cuda:{index} "
                  f"({uuid or 'unknown'}): a MIG instance, or a GPU whose UUID NVML cannot read")


# ------------------------------------------------------------------------------ compare
@dataclass(frozen=True)
class RungResult:
    """One workload of a :func:`compare` run (``seconds`` is the best round)."""

    name: str
    samples: int | None = None
    seconds: float | None = None
    note: str = ""
    all_seconds: tuple[float, ...] = ()

    @property
    def ran(self) -> bool:
        return self.seconds is not None

    @property
    def samples_per_second(self) -> float | None:
        return self.samples / self.seconds if self.ran and self.seconds > 0 else None


@dataclass(repr=False)
class Comparison(ShownAsTable):
    """Workloads measured side by side; ``rows`` in the order given."""

    rows: list[RungResult] = field(default_factory=list)
    rounds: int = 1

    def __getitem__(self, name: str) -> RungResult:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no rung named {name!r}; rungs: {', '.join(r.name for r in self.rows)}")

    def rate(self, name: str) -> float | None:
        """Samples/s of one rung (None if it did not run)."""
        return self[name].samples_per_second

    def speedup(self, name: str, over: str | None = None) -> float | None:
        """Samples/s of ``name`` divided by that of ``over`` (default: the first rung)."""
        if not self.rows:
            raise ValueError("this comparison has no rungs: nothing to compare")
        base = self[over] if over is not None else self.rows[0]
        a, b = self[name].samples_per_second, base.samples_per_second
        return a / b if a is not None and b else None

    def table(self, title: str | None = None) -> Table:
        """Rung, samples/s, speed-up over the first rung and over the previous rung that
        ran; rungs that did not run show why."""
        rows, previous = [], None
        for row in self.rows:
            if not row.ran:
                rows.append([row.name, "not run", "", "", row.note])
                continue
            vs_base = fmt_ratio(self.speedup(row.name))
            vs_prev = fmt_ratio(self.speedup(row.name, previous)) if previous else ""
            rows.append([row.name, fmt_rate(row.samples_per_second), vs_base, vs_prev,
                         row.note])
            previous = row.name
        if not any(r[4] for r in rows):
            return Table(["rung", "samples/s", "vs baseline", "vs previous"],
                         [r[:4] for r in rows], title=title)
        return Table(["rung", "samples/s", "vs baseline", "vs previous", "note"], rows,
                     title=title)


def compare(runs: Mapping[str, Callable[[], int]], *, rounds: int = 2,
            skipped: Mapping[str, str] | None = None,
            notes: Mapping[str, str] | None = None, sync=None) -> Comparison:
    """Time workloads side by side in one process (lesson 09).

    Every round runs each workload once, in order; the best (shortest) round of each counts,
    as it is the least disturbed by whatever else the machine does.  Interleaving means a
    slow phase of the machine hits every workload alike.

    Args:
        runs: name -> function without arguments that does the work and returns how many
            samples it processed (the same number every round).  The first is the baseline.
        rounds: how many times to run each (>= 1).
        skipped: name -> reason, for rungs that cannot run here (shown in the table).
        notes: name -> a short note shown next to a rung's figures.
        sync: the device the runs use (``sync=device``), or a function: each run is timed
            from a synchronised start to a clock read taken only after the device finished
            its work (see :func:`helpers.core.timing.sync_function`). Without it, GPU work that
            a run only queued is not counted in its time but in the next run's.

    Returns:
        A :class:`Comparison`: ``.rate(name)``, ``.speedup(name)``, ``.table()``.
    """
    if not isinstance(runs, Mapping) or not runs:
        raise ValueError("runs must be a non-empty dict of name -> function returning samples")
    for name, fn in runs.items():
        if not isinstance(name, str) or not callable(fn):
            raise TypeError(f"runs must map names (str) to functions, got {name!r}: {fn!r}")
    rounds = positive_int(rounds, "rounds", 1000)
    wait = sync_function(sync)
    for what, mapping in (("skipped", skipped), ("notes", notes)):
        if mapping is not None and not isinstance(mapping, Mapping):
            raise TypeError(f"{what} must be a dict of rung name -> reason (a string) or None, "
                            f"got {type(mapping).__name__}")
    skipped, notes = dict(skipped or {}), dict(notes or {})
    for what, mapping in (("skipped", skipped), ("notes", notes)):
        for name, reason in mapping.items():
            if not isinstance(reason, str):
                raise TypeError(f"{what}[{name!r}] must be a string, got {reason!r}")
    clash = set(skipped) & set(runs)
    if clash:
        raise ValueError(f"rungs both run and skipped: {sorted(clash)}")
    times, returned = interleaved_rounds(runs, rounds=rounds, wait=wait, rotate=False)
    counts: dict[str, int] = {}
    for name, values in returned.items():
        for n in values:
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 < n <= LARGEST:
                raise ValueError(f"run {name!r} must return the number of samples it "
                                 f"processed (a positive int), got {shown(n)}")
            if counts.setdefault(name, int(n)) != n:
                raise ValueError(f"run {name!r} processed {counts[name]} samples in one round "
                                 f"and {n} in another; each round must do the same work")
    result = Comparison(rounds=rounds)
    order = list(runs) + [name for name in skipped if name not in runs]
    for name in order:
        if name in runs:
            result.rows.append(RungResult(name, counts[name], min(times[name]),
                                          notes.get(name, ""), tuple(times[name])))
        else:
            result.rows.append(RungResult(name, note=skipped[name]))
    return result


# ------------------------------------------------------------------------------ recorded
@dataclass(frozen=True, repr=False)
class RecordedResults(ShownAsTable):
    """Figures measured on a real GPU by ``tests/gpu/throughput_gpu.py``."""

    path: str  # relative to the kit's root
    date: str
    hardware: dict
    versions: dict
    rungs: list  # [{"part", "name", "samples_per_second", "speedup"}]
    notes: str = ""

    def table(self) -> Table:
        """Part, rung, samples/s and speed-up, titled with the GPU, date and versions."""
        gpu = self.hardware.get("gpu", "a GPU")
        rows = [[r.get("part", ""), r["name"], fmt_rate(r["samples_per_second"]),
                 fmt_ratio(r["speedup"])] for r in self.rungs]
        title = (f"Recorded on {gpu} ({self.date}; torch {self.versions.get('torch', '?')}, "
                 f"CUDA {self.versions.get('cuda', '?')}), not measured in this run")
        return Table(["part", "rung", "samples/s", "vs baseline of the part"], rows,
                     title=title)


def throughput_gpu_results(results_dir=None) -> RecordedResults | None:
    """The rungs ``tests/gpu/throughput_gpu.py`` recorded on a GPU, or None when the kit has none.

    Args:
        results_dir: where to look (default: the kit's ``tests/gpu/results``).

    Reads ``09_throughput.json`` through :func:`helpers.recorded_gpu_results` (the kit's one
    loader of recorded GPU results) and checks the rungs. A file that exists but is malformed
    raises ``ValueError`` saying what is wrong: a broken record must not pass for "no record".
    """
    from .core.recorded import recorded_gpu_results

    rec = recorded_gpu_results(RESULTS_NAME, directory=results_dir)
    if rec is None:
        return None
    data, name = rec.data, rec.path.name
    missing = [k for k in ("date", "hardware", "versions", "rungs") if k not in data]
    if missing:
        raise ValueError(f"{name} lacks {', '.join(missing)}")
    if "gpu" not in data["hardware"]:
        raise ValueError(f"{name}: hardware names no GPU; only GPU runs are recorded")
    for rung in data["rungs"]:
        if not {"name", "samples_per_second", "speedup"} <= set(rung):
            raise ValueError(f"{name}: each rung needs name, samples_per_second and "
                             f"speedup, got {sorted(rung)}")
    try:
        shown = str(rec.path.relative_to(RESULTS_DIR.parent.parent.parent))
    except ValueError:
        shown = name
    return RecordedResults(path=shown, date=str(data["date"]), hardware=dict(data["hardware"]),
                           versions=dict(data["versions"]), rungs=list(data["rungs"]),
                           notes=str(data.get("notes", "")))
