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
    result.plot()                               # memory and throughput against batch size

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
``empty_cache()`` never frees, are part of it; :func:`warm_up_cuda`).  Used by lesson 05.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import html
import numbers
import re
import sys
import time
import traceback
from dataclasses import dataclass, field

from .core.checks import whole_number
from .core.fmt import Table, fmt_bytes, fmt_rate
from .memory.errors import is_oom_error, warm_up_cuda

__all__ = ["find_batch_size", "BatchSizeResult", "Trial", "BatchSizeError"]

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
    no statistics exist.  ``samples_per_s`` is measured over the steps after the first (None
    with fake tensors, which compute nothing).  ``why`` says how the size was chosen.
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

    @property
    def outcome(self) -> str:
        if self.oom:
            return "out of memory"
        return "fits" if self.fits else "over budget"


@dataclass
class BatchSizeResult:
    """What :func:`find_batch_size` found, and every trial that led there.

    ``batch_size`` is the answer: the largest size tried that fits within the budget
    (``capacity_bytes * (1 - margin)``).  ``trials`` lists each try in order; ``n_trials`` and
    ``n_steps`` count them and the training steps they ran.  ``bytes_per_sample`` and
    ``fixed_bytes`` describe the memory line fitted to the trials (None without two
    measured sizes).  ``baseline_bytes`` and ``after_bytes`` are the bytes allocated before
    and after the search (equal when everything was released; on CUDA the baseline is read
    after a warm-up matmul, so it includes cuBLAS's workspaces, which are never freed).
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
        sizes = [t.batch_size for t in self.trials if not t.fits]
        return min(sizes) if sizes else None

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

    # ------------------------------------------------------------------ display
    def table(self) -> Table:
        rows = []
        for i, t in enumerate(self.trials, 1):
            peak = fmt_bytes(t.peak_bytes) if t.peak_bytes is not None else "-"
            share = (f"{t.peak_bytes / self.capacity_bytes:.1%}"
                     if t.peak_bytes is not None and self.capacity_bytes else "-")
            rate = _rate(t.samples_per_s) if t.samples_per_s is not None else "-"
            rows.append([i, t.batch_size, t.why, t.outcome, peak, share, rate])
        # measured numbers last, under a header longer than any of them: the layout stays
        # the same when the notebook tests mask them
        return Table(["trial", "batch size", "chosen by", "result", "peak memory",
                      "of capacity", "samples/s (measured)"], rows)

    def summary(self) -> str:
        where = self.device
        if self.budget_bytes is not None:
            limit = (f"{fmt_bytes(self.budget_bytes)} ({1 - self.margin:.0%} of "
                     f"{fmt_bytes(self.capacity_bytes)})")
        else:
            limit = "memory (no capacity known: out-of-memory errors decide)"
        return (f"batch size {self.batch_size}: the largest that fits in {limit} on {where}; "
                f"{self.n_trials} trials, {self.n_steps} training steps ({self.stopped})")

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

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        foot = "<br>".join(html.escape(x) for x in self._lines())
        return (f"<div><p>{html.escape(self.summary())}</p>{self.table()._repr_html_()}"
                f"<p>{foot}</p></div>")

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in (
            "batch_size", "device", "capacity_bytes", "budget_bytes", "margin", "multiple_of",
            "maximum", "steps_per_trial", "stopped", "baseline_bytes", "after_bytes",
            "fixed_bytes", "bytes_per_sample")}
        out["trials"] = [t.__dict__.copy() for t in self.trials]
        out["notes"] = list(self.notes)
        return out

    def plot(self, ax=None, *, unit: str | None = None, title: str | None = None):
        """Peak memory and throughput of every trial against batch size, with the capacity.

        Trials that fit are dots, those over the budget or out of memory are crosses drawn
        at the capacity line; the fitted memory line is dotted; throughput (where measured)
        is on the right-hand axis.  Returns the matplotlib Figure.
        """
        return _plot(self, ax=ax, unit=unit, title=title)


def _rate(per_second: float) -> str:
    """``fmt_rate`` without the unit (it is in the column's header): ``"~1,234"``."""
    return fmt_rate(per_second, unit="").rstrip()


# ---------------------------------------------------------------------------- memory probes
class _Probe:
    """Where memory is measured: a virtual GPU, a CUDA device, TensorFlow, or nothing."""

    name = "this device"
    capacity_bytes: int | None = None
    fake = False
    framework = "torch"
    exact = True  # allocated() is back to the baseline when everything is released

    def allocated(self) -> int | None:
        return None

    def reset(self) -> None:
        pass

    def peak(self) -> tuple[int | None, int | None]:
        """(needed, reserved) bytes at the peak since ``reset``, context included."""
        return None, None

    def sync(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def host_copies(self):
        """A context in which tensors made are host copies, not device memory."""
        return contextlib.nullcontext()

    def adopt(self, objs) -> None:
        """Count tensors that are already on the device (the model) from now on."""

    def warm_up(self) -> None:
        """Allocate what stays allocated after the first step (before the baseline)."""


class _VirtualProbe(_Probe):
    def __init__(self, gpu):
        self.gpu = gpu
        self.capacity_bytes = gpu.capacity_bytes
        self.fake = gpu.fake
        self.name = f"VirtualGPU {gpu.name}" + (" (fake tensors)" if gpu.fake else "")

    def allocated(self):
        return self.gpu.allocated_bytes

    def reset(self):
        self.gpu.reset_peak()

    def peak(self):
        ctx = self.gpu.context_bytes
        return ctx + self.gpu.peak_allocated_bytes, ctx + self.gpu.peak_reserved_bytes

    def empty_cache(self):
        self.gpu.empty_cache()

    def adopt(self, objs):
        # a model made before the `with VirtualGPU` block is on the GPU as far as the
        # search is concerned: count it from the start, not from its first use
        self.gpu.track(*objs)

    def host_copies(self):
        # the virtual GPU counts every CPU tensor made in it; snapshots for restoring the model
        # live in host memory, so they are made with its counting (dispatch modes) paused
        if self.fake:
            return contextlib.nullcontext()
        from torch.utils._python_dispatch import _disable_current_modes

        return _disable_current_modes()


class _CudaProbe(_Probe):
    device_type = "cuda"

    def __init__(self, index: int):
        import torch

        self.torch = torch
        self.index = index
        self.device = torch.device(self.device_type, index)
        torch.cuda.synchronize(index)
        free, total = torch.cuda.mem_get_info(index)
        # memory PyTorch does not manage: the CUDA context, other processes
        self.other = int(total - free - torch.cuda.memory_reserved(index))
        self.capacity_bytes = int(total)
        getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        fraction = getter(index) if getter is not None else 1.0
        if fraction < 1.0:  # set_per_process_memory_fraction caps what the allocator reserves
            self.capacity_bytes = min(int(total), self.other + int(total * fraction))
        self.name = f"cuda:{index} ({torch.cuda.get_device_name(index)})"

    def allocated(self):
        return int(self.torch.cuda.memory_allocated(self.index))

    def reset(self):
        self.torch.cuda.synchronize(self.index)
        self.torch.cuda.reset_peak_memory_stats(self.index)

    def peak(self):
        cuda = self.torch.cuda
        return (self.other + int(cuda.max_memory_allocated(self.index)),
                self.other + int(cuda.max_memory_reserved(self.index)))

    def sync(self):
        self.torch.cuda.synchronize(self.index)

    def empty_cache(self):
        self.torch.cuda.empty_cache()

    def warm_up(self):
        # cuBLAS's workspaces (forward, and backward on autograd's thread) stay allocated
        warm_up_cuda(self.device)


class _TFProbe(_Probe):
    framework = "tensorflow"
    exact = False  # TensorFlow's own buffers come and go

    def __init__(self, device: str, capacity: int | None):
        import tensorflow as tf

        self.tf = tf
        self.device = device
        self.name = f"TensorFlow {device}"
        try:
            tf.config.experimental.get_memory_info(device)
            self.stats = True
        except ValueError:
            self.stats = False
        self.capacity_bytes = capacity
        self.other = 0
        if capacity is None and device.startswith("GPU"):
            from .core.nvml import gpu_memory

            index = int(device.split(":")[1])
            mem = gpu_memory(index)
            if mem is not None:
                self.capacity_bytes = mem.total_bytes
                current = self.allocated() or 0
                self.other = max(0, mem.used_bytes - current)
        elif capacity is None and device.startswith("CPU"):
            self.capacity_bytes = _tf_cpu_limit()

    def allocated(self):
        if not self.stats:
            return None
        return int(self.tf.config.experimental.get_memory_info(self.device)["current"])

    def reset(self):
        if self.stats:
            self.tf.config.experimental.reset_memory_stats(self.device)

    def peak(self):
        if not self.stats:
            return None, None
        used = self.other + int(self.tf.config.experimental.get_memory_info(self.device)["peak"])
        return used, None


def _tf_cpu_limit() -> int | None:
    """The CPU BFC allocator's limit when TF_CPU_ALLOCATOR_USE_BFC / ..._MEM_LIMIT_IN_MB set it."""
    import os

    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() != "true":
        return None
    mb = os.environ.get("TF_CPU_BFC_MEM_LIMIT_IN_MB")
    try:
        return int(mb) * 1024**2 if mb else None
    except ValueError:
        return None


# ---------------------------------------------------------------------------- state
class _TorchState:
    """Parameters, buffers, gradients and optimizer state as they were; put back on demand."""

    def __init__(self, model, optimizers, probe: _Probe):
        import torch

        from .memory.engine import unique_params

        self.torch = torch
        self.model = model
        self.optimizers = optimizers
        self.probe = probe
        self.params = unique_params(model, optimizers)
        fake = probe.fake or any(_is_fake(p) for p in self.params)
        self.fake = fake
        with probe.host_copies(), torch.no_grad():
            if fake:  # no values to keep: keep the objects (in-place updates change nothing)
                self.values = None
                self.grads = [p.grad for p in self.params]
                self.opt_states = [{p: dict(s) for p, s in opt.state.items()}
                                   for opt in optimizers]
                self.opt_groups = [copy.deepcopy([{k: v for k, v in g.items() if k != "params"}
                                                  for g in opt.param_groups])
                                   for opt in optimizers]
            else:
                self.values = ({k: _host_copy(v) for k, v in model.state_dict().items()}
                               if model is not None else None)
                self.grads = [None if p.grad is None else _host_copy(p.grad)
                              for p in self.params]
                self.opt_dicts = [_host_copy_tree(opt.state_dict()) for opt in optimizers]

    def restore(self) -> None:
        torch = self.torch
        with torch.no_grad():
            if self.fake:
                for p, g in zip(self.params, self.grads, strict=True):
                    p.grad = g
                for opt, st, groups in zip(self.optimizers, self.opt_states, self.opt_groups,
                                           strict=True):
                    opt.state.clear()
                    opt.state.update({p: dict(s) for p, s in st.items()})
                    for g, saved in zip(opt.param_groups, groups, strict=True):
                        g.update(saved)
                return
            with self.probe.host_copies():
                if self.values is not None:  # in place: no new memory
                    current = self.model.state_dict()
                    for k, v in self.values.items():
                        current[k].copy_(v)
                for p, g in zip(self.params, self.grads, strict=True):
                    p.grad = None if g is None else g.to(p.device, copy=True)
                for opt, saved in zip(self.optimizers, self.opt_dicts, strict=True):
                    # load_state_dict moves the (cloned) state onto the parameters' device
                    opt.load_state_dict(_clone_tree(saved))
            # the new gradients and optimizer state are on the device, as the old ones were
            self.probe.adopt([*self.params, *(p.grad for p in self.params if p.grad is not None),
                              *self.optimizers])


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _host_copy(t):
    return t.detach().to("cpu", copy=True)


def _host_copy_tree(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return _host_copy(obj)
    if isinstance(obj, dict):
        return {k: _host_copy_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_host_copy_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_host_copy_tree(v) for v in obj)
    return copy.deepcopy(obj)


def _clone_tree(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_clone_tree(v) for v in obj)
    return copy.deepcopy(obj)


class _KerasState:
    """Weights and optimizer variables of a Keras model, as numpy copies (host memory)."""

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.weights = model.get_weights() if model is not None else None
        self.opt_values = ([v.numpy() for v in optimizer.variables]
                           if optimizer is not None else None)

    def restore(self) -> None:
        if self.weights is not None:
            self.model.set_weights(self.weights)
        if self.opt_values is not None:
            # variables made by the search (slots built on the first step) keep their shape
            for v, value in zip(self.optimizer.variables, self.opt_values, strict=False):
                v.assign(value)


class _NoState:
    def restore(self) -> None:
        pass


# ---------------------------------------------------------------------------- arguments
def _framework_of(model) -> str | None:
    if model is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        return "torch"
    mod = type(model).__module__
    if mod.startswith(("keras", "tensorflow", "tf_keras")):
        return "tensorflow"
    raise TypeError(f"model must be a torch.nn.Module or a Keras model, got "
                    f"{type(model).__name__}")


def _optimizer_list(optimizer, framework) -> list:
    if optimizer is None:
        return []
    if framework == "tensorflow":
        return [optimizer]
    import torch

    opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    for opt in opts:
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer (or a list of them), "
                            f"got {type(opt).__name__}")
    return opts


def _probe_for(framework, model, capacity) -> _Probe:
    from .memory.state import current_virtual_gpu

    gpu = current_virtual_gpu()
    if gpu is not None and framework != "tensorflow":
        return _VirtualProbe(gpu)
    if framework == "tensorflow" or (framework is None and "torch" not in sys.modules
                                     and "tensorflow" in sys.modules):
        import tensorflow as tf

        device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
        probe = _TFProbe(device, capacity)
        return probe
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    device = None
    if model is not None:
        for p in model.parameters():
            device = p.device
            break
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if device is not None and device.type == "cuda":
        return _CudaProbe(device.index if device.index is not None else 0)
    probe = _Probe()
    probe.name = str(device or "cpu")
    return probe


# ---------------------------------------------------------------------------- the search
class _Search:
    """The search: bounds from the trials so far, a line through them, the next size."""

    def __init__(self, step, probe, state, *, start, maximum, budget, multiple_of, tolerance,
                 steps, max_trials):
        self.step = step
        self.probe = probe
        self.state = state
        self.start = start
        self.maximum = maximum
        self.budget = budget
        self.m = multiple_of
        self.steps = steps
        self.max_trials = max_trials
        self.trials: list[Trial] = []
        self.baseline = probe.allocated()
        self.tolerance = tolerance
        self.bisect_next = False  # the last prediction did not halve the bracket
        self.gallop = 0  # verifications in a row that fitted (the line under-predicts)
        self.misses = 0  # predictions that failed inside a bracket

    # sizes tried: multiples of m (from m on), every size below m, and the maximum
    def snap(self, b: int) -> int:
        if self.maximum is not None and b >= self.maximum:
            return self.maximum
        if b >= self.m:
            return b // self.m * self.m
        return max(1, b)

    def resolution(self, b: int) -> int:
        """How close the answer must get at ``b``: ``tolerance * b``, at least one step."""
        if b < self.m:
            return 1
        return max(self.m, int(self.tolerance * b) // self.m * self.m)

    def prev_down(self, b: int) -> int:
        """The largest size below ``b`` (``b`` is at most the maximum)."""
        return b - 1 if b - 1 < self.m else (b - 1) // self.m * self.m

    # ---------------------------------------------------------------- bounds and line
    def lo(self) -> Trial | None:
        fits = [t for t in self.trials if t.fits]
        return max(fits, key=lambda t: t.batch_size) if fits else None

    def hi(self) -> Trial | None:
        bad = [t for t in self.trials if not t.fits]
        return min(bad, key=lambda t: t.batch_size) if bad else None

    def width(self) -> int | None:
        lo, hi = self.lo(), self.hi()
        return None if lo is None or hi is None else hi.batch_size - lo.batch_size

    def closed(self) -> bool:
        lo, hi = self.lo(), self.hi()
        if lo is None:
            return False
        if self.maximum is not None and lo.batch_size >= self.maximum:
            return True
        return hi is not None and hi.batch_size - lo.batch_size <= self.resolution(lo.batch_size)

    def line(self) -> tuple[float, float] | None:
        """(fixed bytes, bytes per sample) through the largest measured size that fits and
        one at least 10 % smaller (a long base: the allocator's rounding steps barely tilt
        it), or None. Small sizes can sit on a flat stretch where a batch-independent peak
        (the optimizer step's) dominates; secants from there are too flat, so the steepest
        is taken."""
        pts = sorted({t.batch_size: t for t in self.trials
                      if t.fits and t.peak_bytes is not None}.values(),
                     key=lambda t: t.batch_size)
        if len(pts) < 2:
            return None
        big = pts[-1]
        far = [t for t in pts[:-1] if t.batch_size <= _BASE * big.batch_size] or pts[:1]
        # memory is convex in the batch size (flat, then linear): of the long secants, the
        # steepest is the one drawn past the flat stretch
        slope = max((big.peak_bytes - t.peak_bytes) / (big.batch_size - t.batch_size)
                    for t in far)
        if slope <= 0:
            return None
        return big.peak_bytes - slope * big.batch_size, slope

    def predict(self) -> float | None:
        """The batch size at which memory reaches the budget, or None."""
        if self.budget is None:
            return None
        lo, hi = self.lo(), self.hi()
        if lo is not None and hi is not None and lo.peak_bytes is not None \
                and hi.peak_bytes is not None and hi.peak_bytes > lo.peak_bytes:
            # measured on both sides of the budget: interpolate
            slope = (hi.peak_bytes - lo.peak_bytes) / (hi.batch_size - lo.batch_size)
            return lo.batch_size + (self.budget - lo.peak_bytes) / slope
        line = self.line()
        if line is None or lo is None:
            return None
        fixed, slope = line
        target = (self.budget - fixed) / slope
        if target > 1.5 * lo.batch_size:
            # a long extrapolation: aim a little short, then interpolate from there
            aim = self.budget - _AIM_SHORT * (self.budget - lo.peak_bytes)
            target = (aim - fixed) / slope
        return target

    # ---------------------------------------------------------------- next size
    def next_size(self) -> tuple[int, str] | None:
        lo, hi = self.lo(), self.hi()
        if lo is None:
            if hi is None:
                return self.start, "start"
            if hi.batch_size <= 1:
                return None
            return self.snap(hi.batch_size // 2), "halving"
        if self.closed():
            return None
        b = lo.batch_size
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
        if pred <= (1 + _NEAR) * hi.batch_size and self.prev_down(hi.batch_size) > b:
            # the line crosses the budget just past a size that ran out of memory
            # (fragmentation wastes a little): the largest size is probably just below it
            return self.prev_down(hi.batch_size), "prediction"
        return bisection

    # ---------------------------------------------------------------- one trial
    def run_trial(self, b: int, why: str) -> Trial:
        probe = self.probe
        probe.reset()
        times = []
        started = 0
        oom_text = None
        t_start = time.perf_counter()
        try:
            for _ in range(self.steps):
                started += 1
                t0 = time.perf_counter()
                self.step(b)
                probe.sync()
                times.append(time.perf_counter() - t0)
        except BaseException as exc:
            if not is_oom_error(exc):
                raise
            oom_text = _first_line(exc)
            # the traceback's frames hold the step's tensors: release them now
            traceback.clear_frames(exc.__traceback__)
        seconds = time.perf_counter() - t_start
        # clean-up outside the except block, so nothing from the error is alive any more
        peak, reserved = (None, None) if oom_text is not None else probe.peak()
        self.state.restore()
        self.release(oom_text is not None)
        fits = oom_text is None and (self.budget is None or peak is None
                                     or peak <= self.budget)
        rate = None
        if oom_text is None and not probe.fake:
            timed = times[1:] if len(times) > 1 else times
            total = sum(timed)
            rate = b * len(timed) / total if total > 0 else None
        trial = Trial(batch_size=b, fits=fits, oom=oom_text is not None, peak_bytes=peak,
                      reserved_bytes=reserved,
                      samples_per_s=rate, seconds=seconds, why=why, steps=started,
                      error=oom_text)
        self.trials.append(trial)
        return trial

    def release(self, after_oom: bool) -> None:
        """Free what the trial left: collect garbage (after an error, or if memory is not
        back to the baseline: a full collection takes a while) and empty the cache."""
        now = self.probe.allocated() if self.probe.exact else None
        if after_oom or (now is not None and now != self.baseline):
            gc.collect()
        self.probe.empty_cache()

    def run(self) -> str:
        while True:
            nxt = self.next_size()
            if nxt is None:
                return self._why_stopped()
            if len(self.trials) >= self.max_trials:
                return f"stopped after max_trials={self.max_trials}"
            b, why = nxt
            before = self.width()
            trial = self.run_trial(b, why)
            after = self.width()
            # safeguard: a prediction that does not halve the bracket is followed by a
            # bisection step, so the search is never slower than about twice bisection
            self.bisect_next = why in ("prediction", "verify") and before is not None \
                and after is not None and after > before / 2
            self.misses += self.bisect_next
            self.gallop = self.gallop + 1 if why == "verify" and trial.fits else 0

    def _why_stopped(self) -> str:
        lo, hi = self.lo(), self.hi()
        if lo is None:
            return "nothing fits"
        if self.maximum is not None and lo.batch_size >= self.maximum:
            return "the maximum fits"
        return f"{lo.batch_size} fits, {hi.batch_size} does not"


def _first_line(exc: BaseException) -> str:
    """``"Type: the line that says what ran out"`` (Keras' colour codes and TensorFlow's
    function-node prefix removed)."""
    text = _ANSI.sub("", str(exc)).strip().splitlines()
    line = next((x for x in text if "out of memory" in x.lower() or "OOM" in x),
                text[0] if text else "")
    if "OOM when allocating" in line:
        line = line[line.index("OOM when allocating"):]
    return f"{type(exc).__name__}: {line.strip()}"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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
        optimizer: its optimizer (or a list of torch optimizers): its state (Adam's moments,
            step counts, learning rates) is restored after every trial.
        start: the first batch size tried (the original lesson starts at 16 or 32).
        maximum: the largest batch size worth having (e.g. the data set's size).
        margin: share of the capacity to leave free (default 0.05: use at most 95 %), for
            fragmentation, longer inputs, evaluation, other processes. 0 allows the limit.
        steps_per_trial: steps run at each size. 2 (default) also covers Adam-like
            optimizers, whose state appears during the first step, so the second step is the
            one that needs most memory.
        multiple_of: sizes are multiples of this (8 suits tensor cores); 1 finds the exact
            maximum. Sizes below it, and ``maximum`` itself, are allowed.
        tolerance: stop once the answer is proven to be within this share of the largest
            size that fits (default 0.01: a size that fits, and one 1 % larger that does
            not); 0 searches down to the last multiple of ``multiple_of``.
        max_trials: give up after this many trials (the largest size that fitted is kept).
        capacity: the memory to plan against (bytes, "24 GiB" or a card name) when the
            device's total is not the limit, or is unknown (TensorFlow without NVML).
            By default: the virtual GPU's, the CUDA device's, or TensorFlow's limit.

    Returns:
        A :class:`BatchSizeResult`: ``batch_size``, ``trials`` (batch size, fits, peak bytes,
        samples/s for each), ``n_trials``, ``bytes_per_sample``, ``text()``, ``plot()``.

    Raises:
        BatchSizeError: the step does not fit even at batch size 1, or no memory limit is
            known and no ``maximum`` is given.
        Any error of ``step`` other than out of memory, unchanged (model and optimizer are
        restored first; a note on the error says which trial raised it).

    Where memory is measured: inside ``with helpers.VirtualGPU(...)`` (also ``fake=True``)
    on the virtual GPU; else on the CUDA device of the model (or the current one);
    TensorFlow's allocator for Keras models. Used by lesson 05.
    """
    if not callable(step):
        raise TypeError(f"step must be a function step(batch_size), got "
                        f"{type(step).__name__}: {step!r}")
    framework = _framework_of(model)
    if framework is not None and step is model:
        raise TypeError("step must be a function step(batch_size) that runs a training step, "
                        "not the model itself")
    start = whole_number(start, "start", 1)
    if maximum is not None:
        maximum = whole_number(maximum, "maximum", 1)
        if maximum < start:
            raise ValueError(f"maximum ({maximum}) must be at least start ({start})")
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or \
            not 0 <= margin < 0.5:
        raise ValueError(f"margin must be a share of memory to leave free, from 0 up to "
                         f"(not including) 0.5, e.g. 0.05 or 0.1; got {margin!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or \
            not 0 <= tolerance <= 0.25:
        raise ValueError(f"tolerance must be a share of the batch size from 0 to 0.25, e.g. "
                         f"0.01; got {tolerance!r}")
    steps_per_trial = whole_number(steps_per_trial, "steps_per_trial", 1)
    multiple_of = whole_number(multiple_of, "multiple_of", 1)
    max_trials = whole_number(max_trials, "max_trials", 2)
    if capacity is not None:
        from .memory.capacity import parse_capacity, resolve_capacity

        capacity = resolve_capacity(capacity)[1] if isinstance(capacity, str) \
            else parse_capacity(capacity)
    if framework is None and optimizer is not None:
        framework = "torch" if "torch" in sys.modules and isinstance(
            optimizer, (list, tuple, sys.modules["torch"].optim.Optimizer)) else "tensorflow"
    optimizers = _optimizer_list(optimizer, framework)

    probe = _probe_for(framework, model, capacity)
    if capacity is not None:
        probe.capacity_bytes = capacity
    if probe.capacity_bytes is None and maximum is None:
        raise BatchSizeError(
            f"nothing limits memory on {probe.name}: no capacity is known and no out-of-memory "
            "error will stop a search. Run it inside `with helpers.VirtualGPU(...)`, on a GPU, "
            "or give capacity=... or maximum=..."
        )
    budget = None if probe.capacity_bytes is None else int(
        probe.capacity_bytes * (1 - margin))

    if framework == "tensorflow" or probe.framework == "tensorflow":
        state = _KerasState(model, optimizers[0] if optimizers else None) \
            if model is not None or optimizers else _NoState()
    elif model is not None or optimizers:
        state = _TorchState(model, optimizers, probe)
    else:
        state = _NoState()

    if model is not None and framework == "torch":
        try:
            probe.adopt([model, *optimizers])
        except BaseException as exc:
            if not is_oom_error(exc):
                raise
            text = _first_line(exc)
            traceback.clear_frames(exc.__traceback__)
            raise BatchSizeError(f"the model and optimizer alone do not fit on {probe.name}: "
                                 f"{text}") from None
    probe.warm_up()  # the baseline includes cuBLAS's workspaces: the steps would add them
    gc.collect()
    probe.empty_cache()
    search = _Search(step, probe, state, start=start, maximum=maximum, budget=budget,
                     multiple_of=multiple_of, tolerance=float(tolerance), steps=steps_per_trial,
                     max_trials=max_trials)
    try:
        stopped = search.run()
    except BaseException as exc:
        n = len(search.trials) + 1
        exc.add_note(f"find_batch_size: raised by step() in trial {n}; only out-of-memory "
                     "errors are part of the search, so it stopped (model and optimizer "
                     "were restored).")
        raise
    finally:
        state.restore()
        search.release(False)
    baseline, after = search.baseline, probe.allocated()

    lo = search.lo()
    if lo is None:
        errors = [t.error for t in search.trials if t.error]
        why = errors[-1] if errors else "over the memory budget"
        raise BatchSizeError(
            f"the step does not fit on {probe.name} even at batch size 1 ({why}). The "
            "model, its gradients and optimizer state need too much memory by themselves: "
            "use mixed precision, gradient checkpointing, a smaller model or more memory."
        )
    chosen = lo.batch_size
    notes = []
    if budget is None:
        chosen = max(1, search.snap(int(chosen * (1 - margin))))
        if margin:
            notes.append(f"no memory capacity known: the margin ({margin:.0%}) was taken off "
                         f"the largest size that ran ({lo.batch_size})")
    if stopped.startswith("stopped after"):
        notes.append(f"the search did not close: {stopped}; {chosen} is the largest size "
                     "that fitted")
    if probe.fake:
        notes.append("fake tensors: memory is exact, nothing was computed (no samples/s)")
    line = search.line()
    result = BatchSizeResult(
        batch_size=chosen, trials=search.trials, device=probe.name,
        capacity_bytes=probe.capacity_bytes, budget_bytes=budget, margin=float(margin),
        multiple_of=multiple_of, maximum=maximum, steps_per_trial=steps_per_trial,
        stopped=stopped, baseline_bytes=baseline, after_bytes=after,
        fixed_bytes=None if line is None else line[0],
        bytes_per_sample=None if line is None else line[1], notes=notes,
    )
    return result


# ---------------------------------------------------------------------------- plot
def _plot(result: BatchSizeResult, ax=None, *, unit=None, title=None):
    import matplotlib.pyplot as plt

    if unit not in (None, "MiB", "GiB"):
        raise ValueError(f"unit must be 'MiB', 'GiB' or None, got {unit!r}")
    peaks = [t.peak_bytes for t in result.trials if t.peak_bytes is not None]
    top = max(peaks + [result.capacity_bytes or 0]) or 1
    if unit is None:
        unit = "GiB" if top >= 2 * 1024**3 else "MiB"
    scale = 1024**3 if unit == "GiB" else 1024**2
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=80)
        plt.close(fig)  # returned and displayed once, never by pyplot again
    fig = ax.figure
    sizes = [t.batch_size for t in result.trials]
    xmax = max(sizes) * 1.08
    cap = result.capacity_bytes
    if cap is not None:
        ax.axhline(cap / scale, color="red", lw=1.2, label=f"capacity ({fmt_bytes(cap)})")
    if result.budget_bytes is not None and result.margin:
        ax.axhline(result.budget_bytes / scale, color="red", lw=1, ls="--",
                   label=f"budget ({1 - result.margin:.0%})")
    if result.bytes_per_sample is not None:
        xs = [0, xmax]
        ax.plot(xs, [(result.fixed_bytes + result.bytes_per_sample * x) / scale for x in xs],
                color="grey", lw=1, ls=":", label="fitted line")
    ok = [t for t in result.trials if t.fits and t.peak_bytes is not None]
    ax.plot([t.batch_size for t in ok], [t.peak_bytes / scale for t in ok], "o",
            color="#4c72b0", label="fits")
    bad = [t for t in result.trials if not t.fits]
    if bad:
        ys = [(t.peak_bytes if t.peak_bytes is not None else (cap or top)) / scale
              for t in bad]
        ax.plot([t.batch_size for t in bad], ys, "x", color="#c44e52", ms=8, mew=2,
                label="does not fit")
    for i, t in enumerate(result.trials, 1):
        y = (t.peak_bytes if t.peak_bytes is not None else (cap or top)) / scale
        ax.annotate(str(i), (t.batch_size, y), textcoords="offset points", xytext=(3, 4),
                    fontsize=7)
    ax.axvline(result.batch_size, color="green", lw=1, label=f"chosen: {result.batch_size}")
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, top / scale * 1.12)
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"peak memory ({unit})")
    rated = sorted((t for t in result.trials if t.samples_per_s is not None),
                   key=lambda t: t.batch_size)
    handles, labels = ax.get_legend_handles_labels()
    if rated:
        ax2 = ax.twinx()
        ax2.plot([t.batch_size for t in rated], [t.samples_per_s for t in rated], "s-",
                 color="#dd8452", ms=4, lw=1, label="samples/s (measured)")
        ax2.set_ylabel("samples/s (measured)")
        ax2.set_ylim(0, max(t.samples_per_s for t in rated) * 1.15)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4,
              fontsize=8, frameon=False)
    ax.set_title(title if title is not None else
                 f"Batch-size search on {result.device}: {result.n_trials} trials -> "
                 f"{result.batch_size}", fontsize=10)
    fig.tight_layout()
    return fig
