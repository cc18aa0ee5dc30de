"""``find_batch_size``: the largest batch size whose training step fits, in few trials.

::

    def step(batch_size):                      # one training step at this batch size
        x, y = make_batch(batch_size)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

    with helpers.VirtualGPU("L40S"):           # or on a real GPU, without the `with`
        result = helpers.find_batch_size(step, model=model, optimizer=optimizer)
    result.batch_size                           # the answer; result.trials: every try
    result.plot()                               # memory (and, on a real device, samples/s)

How it searches.  Memory grows almost linearly with the batch size (activations and the batch
itself scale with it; weights, gradients and optimizer state do not), so measured trials
predict where the line crosses the memory budget.  The finder runs the step at ``start`` and
at twice that, then at the size the line predicts (at most 8 times the largest that fitted,
and aiming a little short: a long extrapolation magnifies small errors), draws the line
again over a long base, and closes the search by checking that a size just above the answer
(``tolerance``, at least one multiple of ``multiple_of``) does *not* fit.  The line is drawn
through the memory the tensors need (``max_memory_allocated``), not what ``nvidia-smi``
shows: near the limit the caching allocator gives its cache back rather than fail.  When a
prediction misses or does not halve the range, the next size is the midpoint; after two
misses, or where no prediction can be made (no memory statistics, no growth), the search is
doubling and binary search, the method of PyTorch Lightning's ``scale_batch_size``.

What counts as out of memory: ``torch.OutOfMemoryError`` (real CUDA, and the virtual GPU's,
also in full-scale mode), PyTorch's other out-of-memory messages (cuBLAS and cuDNN allocation
failures included) and TensorFlow's ``ResourceExhaustedError`` (:func:`is_oom_error`).
Anything else stops the search and is re-raised.  Between trials the model and optimizer
are restored to their state before the search, the error's traceback frames are released,
garbage is collected and the (virtual or CUDA) allocator's cache is emptied, so each trial
starts from the same memory and, afterwards, memory is back where it started (on CUDA,
measured from a baseline read after a warm-up matmul: cuBLAS's workspaces, which
``empty_cache()`` never frees, are part of it; :func:`warm_up_cuda`; the same on a virtual GPU
made with ``workspaces=True``).  Trials on a real device
report samples/s; on a virtual GPU they do not: there a step's time is mostly the bookkeeping
of every tensor, not the speed of any device.  Memory is read through
:mod:`helpers.memory.sources`; Keras models and optimizers are handled by
:mod:`helpers.tf.finder`.  Used by lesson 05.
"""

from __future__ import annotations

import contextlib
import html
import operator
import re
import sys
import time
import traceback
from dataclasses import dataclass, field

from .core.checks import positive_int, real_number, whole_number
from .core.fmt import ShownAsTable, Table, fmt_bytes, fmt_rate
from .memory import state
from .memory.errors import is_oom_error, release_after_error, warm_up_cuda
from .memory.sources import CudaSource, MemorySource, VirtualGpuSource

__all__ = ["find_batch_size", "BatchSizeResult", "Trial", "BatchSizeError"]

# The strategy's tuning, each found on the benchmark's workloads (benchmarks/batch_size.py):
# a prediction that extrapolates far aims this share of the remaining memory short of the
# budget, so it lands just below the limit and the next prediction can interpolate
_AIM_SHORT = 0.03
# a prediction never jumps further than this factor above the largest size that fitted
_MAX_LEAP = 8
# a line that puts the limit at most this share past a size that failed is nearly right
_NEAR = 0.05
# the line is drawn between the largest size that fits and one at most this share of it
_BASE = 0.9
# predictions that failed (ran out of memory, or did not halve the range) before the search
# trusts bisection alone
_MAX_MISSES = 2


class BatchSizeError(RuntimeError):
    """The search cannot give a batch size (e.g. the step does not fit even at batch size 1)."""


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Trial:
    """One try of the step at one batch size.

    ``peak_bytes`` is the memory the step needed at its peak: the tensors' allocator blocks
    (``max_memory_allocated``; TensorFlow's allocator peak) plus what the device holds
    besides (the CUDA context, other processes). ``reserved_bytes`` is what ``nvidia-smi``
    showed at the peak: the same plus the caching allocator's cache, which the allocator
    gives back when memory runs short. Both are None after an out-of-memory error or where
    no statistics exist.  ``samples_per_s`` is measured over the steps after the first on a
    real device; it is None on a virtual GPU (the time there is the bookkeeping's, not a
    throughput; fake tensors compute nothing at all).  ``why`` says how the size was chosen.
    """

    batch_size: int
    fits: bool
    oom: bool
    peak_bytes: int | None
    reserved_bytes: int | None
    samples_per_s: float | None
    seconds: float
    why: str
    steps: int = 0
    error: str | None = None
    planned: bool = False  # not run: its memory is a Keras virtual card's line (see notes)

    @property
    def outcome(self) -> str:
        outcome = "out of memory" if self.oom else "fits" if self.fits else "over budget"
        return f"{outcome} (planned)" if self.planned else outcome


@dataclass(repr=False)
class BatchSizeResult(ShownAsTable):
    """What :func:`find_batch_size` found, and every trial that led there.

    ``batch_size`` is the answer: the largest size tried that fits within the budget
    (``capacity_bytes * (1 - margin)``).  ``trials`` lists each try in order; ``n_trials`` and
    ``n_steps`` count them and the training steps they ran.  ``bytes_per_sample`` and
    ``fixed_bytes`` describe the memory line fitted to the trials (None without two
    measured sizes).  ``baseline_bytes`` and ``after_bytes`` are the bytes allocated before
    and after the search (equal when everything was released; on CUDA the baseline is read
    after a warm-up matmul, so it includes cuBLAS's workspaces, which are never freed).
    ``virtual`` is True when the search ran on a virtual GPU: its trials have no samples/s,
    and the table leaves that column out.
    """

    batch_size: int
    trials: list[Trial]
    device: str
    capacity_bytes: int | None
    budget_bytes: int | None
    margin: float
    multiple_of: int
    maximum: int | None
    steps_per_trial: int
    stopped: str
    baseline_bytes: int | None = None
    after_bytes: int | None = None
    fixed_bytes: float | None = None
    bytes_per_sample: float | None = None
    notes: list[str] = field(default_factory=list)
    virtual: bool = False

    @property
    def n_trials(self) -> int:
        return len(self.trials)

    @property
    def n_steps(self) -> int:
        """Training steps run (an out-of-memory trial counts the steps it started)."""
        return sum(t.steps for t in self.trials)

    @property
    def smallest_too_big(self) -> int | None:
        """The smallest batch size tried that did not fit (None if all fitted)."""
        return min((t.batch_size for t in self.trials if not t.fits), default=None)

    def trial(self, batch_size: int) -> Trial:
        """The trial at this batch size (KeyError if it was not tried)."""
        for t in self.trials:
            if t.batch_size == batch_size:
                return t
        raise KeyError(f"batch size {batch_size} was not tried; tried: "
                       f"{[t.batch_size for t in self.trials]}")

    def predicted_bytes(self, batch_size) -> int | None:
        """Memory the fitted line predicts at ``batch_size`` (None without a fit)."""
        if self.bytes_per_sample is None:
            return None
        return round(self.fixed_bytes + self.bytes_per_sample * batch_size)

    def table(self) -> Table:
        rows = []
        for i, t in enumerate(self.trials, 1):
            measured = t.peak_bytes is not None
            share = f"{t.peak_bytes / self.capacity_bytes:.1%}" \
                if measured and self.capacity_bytes else "-"
            rate = "-" if t.samples_per_s is None else fmt_rate(t.samples_per_s, unit="").rstrip()
            rows.append([i, t.batch_size, t.why, t.outcome,
                         fmt_bytes(t.peak_bytes) if measured else "-", share, rate])
        headers = ["trial", "batch size", "chosen by", "result", "peak memory", "of capacity"]
        if self.virtual:  # no throughput on a virtual GPU (a note says why)
            return Table(headers, [row[:-1] for row in rows])
        # measured numbers last, under a header longer than any of them: the layout stays
        # the same when the notebook tests mask them
        return Table([*headers, "samples/s (measured)"], rows)

    def summary(self) -> str:
        limit = "memory (no capacity known: out-of-memory errors decide)"
        if self.budget_bytes is not None:
            limit = (f"{fmt_bytes(self.budget_bytes)} ({1 - self.margin:.0%} of "
                     f"{fmt_bytes(self.capacity_bytes)})")
        return (f"batch size {self.batch_size}: the largest that fits in {limit} on "
                f"{self.device}; {self.n_trials} trials, {self.n_steps} training steps "
                f"({self.stopped})")

    def _lines(self) -> list[str]:
        lines = []
        if self.bytes_per_sample is not None:
            lines.append(f"memory grows by {fmt_bytes(self.bytes_per_sample)} per sample "
                         f"from {fmt_bytes(self.fixed_bytes)} (line through the trials)")
        if self.baseline_bytes is not None and self.after_bytes is not None:
            lines.append(f"allocated before the search {fmt_bytes(self.baseline_bytes)}, "
                         f"after it {fmt_bytes(self.after_bytes)}")
        return lines + list(self.notes)

    def text(self) -> str:
        return "\n".join([self.summary(), self.table().text(), *self._lines()])

    def _html(self) -> str:
        foot = "<br>".join(html.escape(x) for x in self._lines())
        return (f"<div><p>{html.escape(self.summary())}</p>{self.table()._repr_html_()}"
                f"<p>{foot}</p></div>")

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("trials", "notes")}
        return {**out, "trials": [t.__dict__.copy() for t in self.trials],
                "notes": list(self.notes)}

    def plot(self, ax=None, *, unit: str | None = None, title: str | None = None):
        """Peak memory and throughput of every trial against batch size, with the capacity.

        Trials that fit are dots, those over the budget or out of memory are crosses drawn
        at the capacity line; the fitted memory line is dotted; throughput (measured on a
        real device, never on a virtual GPU) is on the right-hand axis.  Returns the
        matplotlib Figure.
        """
        return _plot(self, ax=ax, unit=unit, title=title)


# ---------------------------------------------------------------------------- the device
class _Unmeasured(MemorySource):
    """A device whose memory nothing reads (a CPU): out-of-memory errors alone decide."""

    available, why_not = False, "no memory statistics on this device"


def _device_for(framework: str | None, model, capacity: int | None):
    """Where memory is measured, as ``(source, name, capacity, other, gpu)``: the active virtual
    GPU (PyTorch), TensorFlow's allocator (Keras, or a bare step where only TensorFlow is
    loaded), the model's CUDA device (or the current one), else nothing. ``other`` is what the
    device holds outside the source (the CUDA context, other processes), read once."""
    gpu = state.current_virtual_gpu()
    if gpu is not None and framework != "tensorflow":
        name = f"VirtualGPU {gpu.name}" + (" (fake tensors)" if gpu.fake else "")
        return VirtualGpuSource(gpu), name, gpu.capacity_bytes, gpu.context_bytes, gpu
    if framework == "tensorflow" or (framework is None and "torch" not in sys.modules
                                     and "tensorflow" in sys.modules):
        from .tf.finder import keras_memory
        from .tf.virtual_card import current_keras_virtual_gpu

        card = current_keras_virtual_gpu() if framework == "tensorflow" else None
        if card is not None:  # its line gives each trial's memory (see _Search.run_trial)
            source = keras_memory()[0]
            return source, f"KerasVirtualGPU {card.name}", card.capacity_bytes, \
                card.context_bytes, card
        source, capacity, other = keras_memory(capacity)
        return source, source.name, capacity, other, None
    import torch

    where = next(iter(model.parameters()), None) if model is not None else None
    where = where.device if where is not None else None
    if where is None and torch.cuda.is_available():
        where = torch.device("cuda", torch.cuda.current_device())
    if where is None or where.type != "cuda":
        return _Unmeasured(), str(where or "cpu"), None, 0, None
    source = CudaSource(where)
    source.sync()
    free, total = source.free_and_total()
    other = total - free - source.reserved()  # not PyTorch's: the CUDA context, others
    fraction = torch.cuda.get_per_process_memory_fraction(source.index)
    capacity = total if fraction >= 1 else min(total, other + int(total * fraction))
    return source, f"{source.name} ({torch.cuda.get_device_name(source.index)})", capacity, \
        other, None


_size = operator.attrgetter("batch_size")


def _read(source) -> int | None:
    return source.read() if source.available else None


# ---------------------------------------------------------------------------- state
class _State:
    """Parameters and buffers, gradients and optimizer state as they were; ``restore()`` puts
    them back after every trial.  Copies are kept in host memory; fake tensors hold no values
    (in-place updates change nothing), so they are kept as they are."""

    def __init__(self, model, optimizers, gpu):
        import torch

        from .memory.engine import unique_params
        from .memory.virtual import is_fake

        self.model, self.optimizers, self.gpu = model, optimizers, gpu
        self.params = unique_params(model, optimizers)
        self.fake = bool(gpu is not None and gpu.fake) or any(map(is_fake, self.params))
        keep = _same if self.fake else (lambda t: t.detach().to("cpu", copy=True))
        with self.paused(), torch.no_grad():
            self.values = _tree(keep, model.state_dict()) if model is not None else {}
            self.grads = [None if p.grad is None else keep(p.grad) for p in self.params]
            self.saved = [_tree(keep, opt.state_dict()) for opt in self.optimizers]

    def paused(self):
        """Tensors made in it are host copies, not counted by the virtual GPU (fake tensors
        make nothing: the fake GPU is not paused)."""
        return self.gpu.paused() if self.gpu is not None and not self.fake \
            else contextlib.nullcontext()

    def restore(self) -> None:
        import torch

        with self.paused(), torch.no_grad():
            if not self.fake:  # in place: no new memory
                current = self.model.state_dict() if self.model is not None else {}
                for k, v in self.values.items():
                    current[k].copy_(v)
            for p, g in zip(self.params, self.grads, strict=True):
                p.grad = g if g is None or self.fake else g.to(p.device, copy=True)
            for opt, saved in zip(self.optimizers, self.saved, strict=True):
                # load_state_dict moves the (cloned) state onto the parameters' device
                opt.load_state_dict(_tree(_same if self.fake else torch.clone, saved))
        if self.gpu is not None and not self.fake:  # the new gradients and optimizer state
            self.gpu.track(*self.params, *(p.grad for p in self.params if p.grad is not None),
                           *self.optimizers)


def _same(t):
    return t


def _tree(fn, obj):
    """``obj`` with ``fn`` applied to each tensor in it (dicts, lists and tuples rebuilt)."""
    import torch

    if isinstance(obj, dict):
        return {k: _tree(fn, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_tree(fn, v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return fn(obj) if isinstance(obj, torch.Tensor) else obj


# ---------------------------------------------------------------------------- the search
class _Search:
    """The strategy: bounds from the trials so far, a line through them, the next size."""

    def __init__(self, step, where, restore, *, start, maximum, margin, tolerance,
                 steps_per_trial, multiple_of, max_trials):
        self.step, self.restore = step, restore
        self.source, self.name, self.capacity, self.other, gpu = where
        self.fake = bool(gpu is not None and gpu.fake)
        # a Keras virtual card: memory by its line; steps above its measured range not run
        self.card = gpu if hasattr(gpu, "plan") else None
        self.model = None  # the Keras model the card checks (set by find_batch_size)
        self.virtual = gpu is not None  # its step times are bookkeeping, not throughput
        self.start, self.maximum, self.margin, self.tolerance = start, maximum, margin, tolerance
        self.steps, self.m, self.max_trials = steps_per_trial, multiple_of, max_trials
        self.budget = None if self.capacity is None else int(self.capacity * (1 - margin))
        self.trials: list[Trial] = []
        self.baseline = _read(self.source)
        self.bisect_next = False  # the last prediction did not halve the bracket
        self.gallop = 0  # verifications in a row that fitted (the line under-predicts)
        self.misses = 0  # predictions that failed inside a bracket

    def snap(self, b: int) -> int:
        """Sizes tried: multiples of m (from m on), every size below m, and the maximum."""
        if self.maximum is not None and b >= self.maximum:
            return self.maximum
        return b // self.m * self.m if b >= self.m else max(1, b)

    def resolution(self, b: int) -> int:
        """How close the answer must get at ``b``: ``tolerance * b``, at least one step."""
        return 1 if b < self.m else max(self.m, int(self.tolerance * b) // self.m * self.m)

    def bounds(self) -> tuple[Trial | None, Trial | None]:
        """The largest size that fitted and the smallest that did not (None where none)."""
        return (max((t for t in self.trials if t.fits), key=_size, default=None),
                min((t for t in self.trials if not t.fits), key=_size, default=None))

    def width(self) -> int | None:
        lo, hi = self.bounds()
        return None if lo is None or hi is None else hi.batch_size - lo.batch_size

    def line(self) -> tuple[float, float] | None:
        """(fixed bytes, bytes per sample) through the largest measured size that fits and
        one at least 10 % smaller (a long base: the allocator's rounding steps barely tilt
        it), or None. Small sizes can sit on a flat stretch where a batch-independent peak
        (the optimizer step's) dominates; secants from there are too flat, so the steepest
        is taken (memory is convex in the batch size: flat, then linear)."""
        pts = sorted({t.batch_size: t for t in self.trials
                      if t.fits and t.peak_bytes is not None}.values(), key=_size)
        if len(pts) < 2:
            return None
        big = pts[-1]
        far = [t for t in pts[:-1] if t.batch_size <= _BASE * big.batch_size] or pts[:1]
        slope = max((big.peak_bytes - t.peak_bytes) / (big.batch_size - t.batch_size)
                    for t in far)
        return None if slope <= 0 else (big.peak_bytes - slope * big.batch_size, slope)

    def predict(self) -> float | None:
        """The batch size at which memory reaches the budget, or None."""
        lo, hi = self.bounds()
        if self.budget is None:
            return None
        if lo is not None and hi is not None and None not in (lo.peak_bytes, hi.peak_bytes) \
                and hi.peak_bytes > lo.peak_bytes:  # measured on both sides: interpolate
            slope = (hi.peak_bytes - lo.peak_bytes) / (hi.batch_size - lo.batch_size)
            return lo.batch_size + (self.budget - lo.peak_bytes) / slope
        line = self.line()
        if line is None or lo is None:
            return None
        fixed, slope = line
        target = (self.budget - fixed) / slope
        if target > 1.5 * lo.batch_size:  # a long extrapolation: aim a little short
            target = (self.budget - _AIM_SHORT * (self.budget - lo.peak_bytes) - fixed) / slope
        return target

    def next_size(self) -> tuple[int, str] | None:
        lo, hi = self.bounds()
        if lo is None:
            if hi is None:
                return self.start, "start"
            return None if hi.batch_size <= 1 else (self.snap(hi.batch_size // 2), "halving")
        b = lo.batch_size
        if (self.maximum is not None and b >= self.maximum) or \
                (hi is not None and hi.batch_size - b <= self.resolution(b)):
            return None  # closed
        pred = self.predict()
        # the line says b is the largest: check that a size just above does not fit (if it
        # does, the line under-predicts: take ever larger steps)
        verify = self.snap(b + self.resolution(b) * 2**self.gallop), "verify"
        if hi is None:
            if pred is None:
                return self.snap(2 * b), "doubling"
            cand = self.snap(int(min(pred, _MAX_LEAP * b)))
            return (cand, "prediction") if cand > b else verify
        bisection = max(self.snap((b + hi.batch_size) // 2), b + 1), "bisection"
        if pred is None or self.bisect_next or self.misses >= _MAX_MISSES:
            return bisection
        cand = self.snap(int(pred))
        if cand <= b:
            return verify if verify[0] < hi.batch_size else bisection
        if cand < hi.batch_size:
            return cand, "prediction"
        below = hi.batch_size - 1 if hi.batch_size - 1 < self.m else \
            (hi.batch_size - 1) // self.m * self.m
        if pred <= (1 + _NEAR) * hi.batch_size and below > b:
            # the line crosses the budget just past a size that ran out of memory
            # (fragmentation wastes a little): the largest size is probably just below it
            return below, "prediction"
        return bisection

    def run_trial(self, b: int, why: str) -> Trial:
        if self.card is not None:
            return self.card_trial(b, why)
        source = self.source
        source.reset()
        t_start = time.perf_counter()
        started, times, error = self.run_steps(b)
        seconds = time.perf_counter() - t_start
        # clean-up outside the except block, so nothing from the error is alive any more
        peak = None if error is not None else source.peak()
        reserved = None if peak is None else source.peak_reserved()
        peak, reserved = (None if v is None else self.other + v for v in (peak, reserved))
        self.restore()
        self.release(error is not None)
        timed = times[1:] if len(times) > 1 else times
        rate = b * len(timed) / sum(timed) if error is None and not self.virtual \
            and sum(timed) > 0 else None
        trial = Trial(batch_size=b, fits=error is None and (self.budget is None or peak is None
                                                           or peak <= self.budget),
                      oom=error is not None, peak_bytes=peak, reserved_bytes=reserved,
                      samples_per_s=rate, seconds=seconds, why=why, steps=started, error=error)
        self.trials.append(trial)
        return trial

    def run_steps(self, b: int) -> tuple[int, list[float], str | None]:
        """``steps_per_trial`` calls of the step at ``b``: how many started, each one's
        seconds, and the first line of the out-of-memory error that stopped them (None if
        none did; any other error is raised)."""
        times, started, error = [], 0, None
        try:
            for started in range(1, self.steps + 1):  # noqa: B007 - counted when one fails
                t0 = time.perf_counter()
                self.step(b)
                self.source.sync()
                times.append(time.perf_counter() - t0)
        except BaseException as exc:
            if not is_oom_error(exc):
                raise
            error = _first_line(exc)
            traceback.clear_frames(exc.__traceback__)  # its frames hold the step's tensors
        return started, times, error

    def card_trial(self, b: int, why: str) -> Trial:
        """A trial on a Keras virtual card: the memory is the card's line (context
        included). Up to the largest batch the line was measured at, the step runs for real
        (the card checks it and raises its error where it does not fit); larger batches,
        too big for the CPU, are planned from the line and not run."""
        card, t_start, started, error = self.card, time.perf_counter(), 0, None
        planned = b > card.run_limit
        if planned:
            error = card.plan(self.model, b)
        else:
            started, _, error = self.run_steps(b)
            self.restore()
            self.release(error is not None)
        peak = None if error is not None else card.need_bytes(b)
        trial = Trial(batch_size=b, fits=error is None and peak <= self.budget, oom=error
                      is not None, peak_bytes=peak, reserved_bytes=peak, samples_per_s=None,
                      seconds=time.perf_counter() - t_start, why=why, steps=started,
                      error=error, planned=planned)
        self.trials.append(trial)
        return trial

    def release(self, after_oom: bool) -> None:
        """Free what the trial left: collect garbage (after an error, or if memory is not
        back to the baseline: a full collection takes a while) and empty the cache."""
        now = _read(self.source) if self.source.exact else None
        if after_oom or (now is not None and now != self.baseline):
            release_after_error(None, self.source.empty_cache)
        else:
            self.source.empty_cache()

    def run(self) -> str:
        """Try sizes until the answer is proven (or max_trials); returns why it stopped."""
        while (nxt := self.next_size()) is not None:
            if len(self.trials) >= self.max_trials:
                return f"stopped after max_trials={self.max_trials}"
            before = self.width()
            trial = self.run_trial(*nxt)
            after = self.width()
            # safeguard: a prediction that does not halve the bracket is followed by a
            # bisection step, so the search is never slower than about twice bisection
            self.bisect_next = nxt[1] in ("prediction", "verify") and before is not None \
                and after is not None and after > before / 2
            self.misses += self.bisect_next
            self.gallop = self.gallop + 1 if nxt[1] == "verify" and trial.fits else 0
        lo, hi = self.bounds()
        if lo is None:
            return "nothing fits"
        if self.maximum is not None and lo.batch_size >= self.maximum:
            return "the maximum fits"
        return f"{lo.batch_size} fits, {hi.batch_size} does not"


def _first_line(exc: BaseException) -> str:
    """``"Type: the line that says what ran out"`` (Keras' colour codes and TensorFlow's
    function-node prefix removed)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()
    line = next((x for x in text if "out of memory" in x.lower() or "OOM" in x),
                text[0] if text else "")
    if "OOM when allocating" in line:
        line = line[line.index("OOM when allocating"):]
    return f"{type(exc).__name__}: {line.strip()}"


# ---------------------------------------------------------------------------- arguments
def _framework(model, optimizer) -> tuple[str | None, list]:
    """``"torch"`` or ``"tensorflow"`` for a PyTorch or Keras model and optimizer (None when
    neither is given), and the optimizers as a list; TypeError for anything else.  Keras
    objects are recognised by helpers.tf.finder, imported only for what is not PyTorch's."""
    torch = sys.modules.get("torch")
    opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else \
        [] if optimizer is None else [optimizer]
    torch_model = model is None or (torch is not None and isinstance(model, torch.nn.Module))
    torch_opts = all(torch is not None and isinstance(o, torch.optim.Optimizer) for o in opts)
    if torch_model and torch_opts:
        return ("torch" if model is not None or opts else None), opts
    from .tf.finder import keras_kind

    keras_model, keras_opt = keras_kind(model) == "model", keras_kind(optimizer) == "optimizer"
    if not (torch_model or keras_model):
        raise TypeError(f"model must be a torch.nn.Module or a Keras model, got "
                        f"{type(model).__name__}")
    if not (torch_opts or keras_opt):
        inside = f" of {', '.join(sorted({type(o).__name__ for o in opts}))}" \
            if isinstance(optimizer, (list, tuple)) else ""
        raise TypeError(f"optimizer must be a torch.optim.Optimizer (or a list of them) or a "
                        f"Keras optimizer, got {type(optimizer).__name__}{inside}")
    if not ((model is None or keras_model) and (optimizer is None or keras_opt)):
        raise TypeError("model and optimizer must both be PyTorch's or both Keras'")
    return "tensorflow", opts


def _checked(start, maximum, margin, tolerance, steps_per_trial, multiple_of,
             max_trials) -> dict:
    """The search's settings, checked (helpers.core.checks: TypeError for the wrong kind,
    ValueError for a value out of range)."""
    start = positive_int(start, "start")
    if maximum is not None and positive_int(maximum, "maximum") < start:
        raise ValueError(f"maximum ({maximum}) must be at least start ({start})")
    if real_number(margin, "margin", 0, 0.5) == 0.5:
        raise ValueError("margin must be a share of memory to leave free, below 0.5 (e.g. "
                         "0.05 or 0.1); got 0.5")
    return dict(start=start, maximum=None if maximum is None else int(maximum),
                margin=float(margin), tolerance=real_number(tolerance, "tolerance", 0, 0.25),
                steps_per_trial=positive_int(steps_per_trial, "steps_per_trial", 1000),
                multiple_of=positive_int(multiple_of, "multiple_of"),
                max_trials=whole_number(max_trials, "max_trials", 2, 1000))


# ---------------------------------------------------------------------------- public
def find_batch_size(step, *, model=None, optimizer=None, start: int = 32,
                    maximum: int | None = None, margin: float = 0.05,
                    steps_per_trial: int = 2, multiple_of: int = 8, tolerance: float = 0.01,
                    max_trials: int = 25, capacity=None) -> BatchSizeResult:
    """Find the largest batch size whose training step fits in (a share of) device memory.

    Args:
        step: a function ``step(batch_size)`` that runs one training step at that batch size:
            makes (or loads) a batch of that size, runs forward, backward and the optimizer
            step. Its return value is discarded.
        model: the model it trains (``torch.nn.Module`` or Keras model): its parameters,
            buffers and gradients are restored after every trial.
        optimizer: its optimizer (a ``torch.optim.Optimizer``, a list of them, or a Keras
            optimizer): its state (Adam's moments, step counts, learning rates) is restored
            after every trial.
        start: the first batch size tried (the original lesson starts at 16 or 32).
        maximum: the largest batch size worth having (e.g. the data set's size).
        margin: share of the capacity to leave free (default 0.05: use at most 95 %), for
            fragmentation, longer inputs, evaluation, other processes. 0 allows the limit.
        steps_per_trial: steps run at each size. 2 (default) also covers Adam-like
            optimizers, whose state appears during the first step, so the second step is the
            one that needs most memory. At most 1000.
        multiple_of: sizes are multiples of this (8 suits tensor cores); 1 finds the exact
            maximum. Sizes below it, and ``maximum`` itself, are allowed.
        tolerance: stop once the answer is proven to be within this share of the largest
            size that fits (default 0.01: a size that fits, and one 1 % larger that does
            not); 0 searches down to the last multiple of ``multiple_of``.
        max_trials: give up after this many trials (the largest size that fitted is kept);
            2 to 1000.
        capacity: the memory to plan against (bytes, "24 GiB" or a card name) when the
            device's total is not the limit, or is unknown (TensorFlow without NVML).
            By default: the virtual GPU's, the CUDA device's, or TensorFlow's limit.

    Returns:
        A :class:`BatchSizeResult`: ``batch_size``, ``trials`` (batch size, fits, peak bytes,
        samples/s for each; none on a virtual GPU), ``n_trials``, ``bytes_per_sample``,
        ``text()``, ``plot()``.

    Raises:
        BatchSizeError: the step does not fit even at batch size 1, or no memory limit is
            known and no ``maximum`` is given.
        TypeError, ValueError: an argument is of the wrong kind or out of range (the message
            names it).
        Any error of ``step`` other than out of memory, unchanged (model and optimizer are
        restored first; a note on the error says which trial raised it).

    Where memory is measured: inside ``with helpers.VirtualGPU(...)`` (also ``fake=True``)
    on the virtual GPU; else on the CUDA device of the model (or the current one);
    TensorFlow's allocator for Keras models. Used by lesson 05.
    """
    if not callable(step):
        raise TypeError(f"step must be a function step(batch_size), got {type(step).__name__}")
    framework, optimizers = _framework(model, optimizer)
    if model is not None and step is model:
        raise TypeError("step must be a function step(batch_size) that runs a training step, "
                        "not the model itself")
    settings = _checked(start, maximum, margin, tolerance, steps_per_trial, multiple_of,
                        max_trials)
    if capacity is not None:
        from .memory.capacity import resolve_capacity

        capacity = resolve_capacity(capacity)[1]
    source, name, known, other, gpu = _device_for(framework, model, capacity)
    capacity = known if capacity is None else capacity
    if capacity is None and settings["maximum"] is None:
        raise BatchSizeError(
            f"nothing limits memory on {name}: no capacity is known and no out-of-memory "
            "error will stop a search. Run it inside `with helpers.VirtualGPU(...)`, on a GPU, "
            "or give capacity=... or maximum=...")
    if model is None and not optimizers:
        restore = _nothing
    elif framework == "tensorflow":
        from .tf.finder import KerasState

        restore = KerasState(model, optimizers[0] if optimizers else None).restore
    else:
        restore = _State(model, optimizers, gpu).restore
        if model is not None and gpu is not None:
            _adopt(gpu, name, [model, *optimizers])
    if isinstance(source, CudaSource):
        warm_up_cuda(source.device)  # the baseline includes cuBLAS's workspaces
    elif gpu is not None and gpu.workspaces is not None:
        warm_up_cuda(gpu.device_type)  # the virtual GPU's too (VirtualGPU(workspaces=True))
    release_after_error(None, source.empty_cache)
    search = _Search(step, (source, name, capacity, other, gpu), restore, **settings)
    if search.card is not None:
        if model is None:
            raise TypeError("inside a helpers.KerasVirtualGPU, give model=... (the Keras model "
                            "the step trains): the card checks it against its memory line")
        search.model = model
    try:
        stopped = search.run()
    except BaseException as exc:
        exc.add_note(f"find_batch_size: raised by step() in trial {len(search.trials) + 1}; "
                     "only out-of-memory errors are part of the search, so it stopped (model "
                     "and optimizer were restored).")
        raise
    finally:
        restore()
        search.release(False)
    return _result(search, stopped)


def _nothing() -> None:
    pass


def _adopt(gpu, name: str, objs) -> None:
    """Count the model and optimizer on the virtual GPU (made before its `with` block, they are
    on the GPU as far as the search is concerned); BatchSizeError if they alone do not fit."""
    try:
        gpu.track(*objs)
    except BaseException as exc:
        if not is_oom_error(exc):
            raise
        text = _first_line(exc)
        traceback.clear_frames(exc.__traceback__)
        raise BatchSizeError(f"the model and optimizer alone do not fit on {name}: "
                             f"{text}") from None


def _result(search: _Search, stopped: str) -> BatchSizeResult:
    """The result of a finished search (BatchSizeError if nothing fitted)."""
    lo, after = search.bounds()[0], _read(search.source)
    if lo is None:
        errors = [t.error for t in search.trials if t.error]
        raise BatchSizeError(
            f"the step does not fit on {search.name} even at batch size 1 "
            f"({errors[-1] if errors else 'over the memory budget'}). The model, its gradients "
            "and optimizer state need too much memory by themselves: use mixed precision, "
            "gradient checkpointing, a smaller model or more memory.")
    chosen, notes, margin = lo.batch_size, [], search.margin
    if search.budget is None:
        chosen = max(1, search.snap(int(chosen * (1 - margin))))
        if margin:
            notes.append(f"no memory capacity known: the margin ({margin:.0%}) was taken off "
                         f"the largest size that ran ({lo.batch_size})")
    if stopped.startswith("stopped after"):
        notes.append(f"the search did not close: {stopped}; {chosen} is the largest size "
                     "that fitted")
    if not search.source.available and search.capacity is not None:
        notes.append(f"nothing measures memory on {search.name}: only out-of-memory errors "
                     "decided, not the capacity")
    if search.card is not None:
        planned = [t.batch_size for t in search.trials if t.planned]
        notes.append(
            f"KerasVirtualGPU: each trial's memory is the card's measured line "
            f"({search.card.memory.title}) plus {fmt_bytes(search.other)} outside TensorFlow; "
            f"trials up to batch {search.card.run_limit} (the line's measured range) ran on "
            "the CPU, " + (f"{len(planned)} larger ones were planned from the line, not run "
                           "(too big for a CPU)" if planned else "none was planned")
            + "; no samples/s")
    elif search.fake:
        notes.append("fake tensors: memory is exact, nothing was computed (no samples/s)")
    elif search.virtual:
        notes.append("virtual GPU: no samples/s; a trial's time here is mostly the virtual "
                     "GPU's bookkeeping, not the speed of a device (measure speed on the "
                     "device itself)")
    fixed, per_sample = search.line() or (None, None)
    return BatchSizeResult(
        batch_size=chosen, trials=search.trials, device=search.name,
        capacity_bytes=search.capacity, budget_bytes=search.budget, margin=margin,
        multiple_of=search.m, maximum=search.maximum, steps_per_trial=search.steps,
        stopped=stopped, baseline_bytes=search.baseline, after_bytes=after,
        fixed_bytes=fixed, bytes_per_sample=per_sample, notes=notes, virtual=search.virtual)


# ---------------------------------------------------------------------------- plot
def _plot(result: BatchSizeResult, ax=None, *, unit=None, title=None):
    import matplotlib.pyplot as plt

    if unit not in (None, "MiB", "GiB"):
        raise ValueError(f"unit must be 'MiB', 'GiB' or None, got {unit!r}")
    cap, trials = result.capacity_bytes, result.trials
    top = max([t.peak_bytes for t in trials if t.peak_bytes is not None] + [cap or 0]) or 1
    unit = unit or ("GiB" if top >= 2 * 1024**3 else "MiB")
    scale = 1024**3 if unit == "GiB" else 1024**2
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=80)
        plt.close(fig)  # returned and displayed once, never by pyplot again
    xmax = max(t.batch_size for t in trials) * 1.08
    if cap is not None:
        ax.axhline(cap / scale, color="red", lw=1.2, label=f"capacity ({fmt_bytes(cap)})")
    if result.budget_bytes is not None and result.margin:
        ax.axhline(result.budget_bytes / scale, color="red", lw=1, ls="--",
                   label=f"budget ({1 - result.margin:.0%})")
    if result.bytes_per_sample is not None:
        ax.plot([0, xmax], [(result.fixed_bytes + result.bytes_per_sample * x) / scale
                            for x in (0, xmax)], color="grey", lw=1, ls=":", label="fitted line")

    def y(t):  # a trial without a peak (out of memory) is drawn at the capacity
        return (t.peak_bytes if t.peak_bytes is not None else (cap or top)) / scale

    ok = [t for t in trials if t.fits and t.peak_bytes is not None]
    ax.plot([t.batch_size for t in ok], [y(t) for t in ok], "o", color="#4c72b0", label="fits")
    bad = [t for t in trials if not t.fits]
    if bad:
        ax.plot([t.batch_size for t in bad], [y(t) for t in bad], "x", color="#c44e52", ms=8,
                mew=2, label="does not fit")
    for i, t in enumerate(trials, 1):
        ax.annotate(str(i), (t.batch_size, y(t)), textcoords="offset points", xytext=(3, 4),
                    fontsize=7)
    ax.axvline(result.batch_size, color="green", lw=1, label=f"chosen: {result.batch_size}")
    ax.set(xlim=(0, xmax), ylim=(0, top / scale * 1.12), xlabel="batch size",
           ylabel=f"peak memory ({unit})")
    rated = sorted((t for t in trials if t.samples_per_s is not None), key=_size)
    handles, labels = ax.get_legend_handles_labels()
    if rated:
        ax2 = ax.twinx()
        ax2.plot([t.batch_size for t in rated], [t.samples_per_s for t in rated], "s-",
                 color="#dd8452", ms=4, lw=1, label="samples/s (measured)")
        ax2.set(ylabel="samples/s (measured)",
                ylim=(0, max(t.samples_per_s for t in rated) * 1.15))
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4,
              fontsize=8, frameon=False)
    ax.set_title(title if title is not None else f"Batch-size search on {result.device}: "
                 f"{result.n_trials} trials -> {result.batch_size}", fontsize=10)
    ax.figure.tight_layout()
    return ax.figure
