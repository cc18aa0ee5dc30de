"""``measure_step``: exact memory of a training step, by category, phase and operation.

::

    def step():
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    report = helpers.measure_step(step, model=model, optimizer=optimizer, steps=2)
    report                      # a table: parameters, gradients, optimizer state, activations...
    report.plot_timeline()      # live memory after every operation, phases shaded, peak marked

On the CPU (and in full-scale mode) the numbers are exact bytes of live tensor storages. On a
CUDA device the same call also reads the real allocator's statistics (``report.cuda``).
Inside a ``VirtualGPU`` the report uses the virtual GPU's accounting (and its rounding).
It counts the kernels of the device it runs on: on the CPU an ``nn.LSTM`` step includes
oneDNN's workspace, where ``will_it_fit`` (which plans a CUDA card) counts cuDNN's reserve
space instead (:mod:`.cuda_dispatch`). Used by lessons 04-08.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.checks import flag, positive_int, text
from . import state
from .engine import (
    Engine,
    Recorder,
    device_type,
    optimizer_state_tensors,
    tensors_in,
    unique_params,
)
from .report import (
    CATEGORIES,
    PHASES,
    WORKSPACE,
    CudaStats,
    MemoryReport,
    StepMemory,
    Timeline,
)
from .sources import CudaSource

__all__ = ["measure_step"]

#: the most steps one ``measure_step`` call runs (each is recorded op by op)
MAX_STEPS = 10_000


def _device_type(device, model, inputs) -> str:
    if device is None:
        for t in tensors_in([model, inputs]):
            return t.device.type
    return device_type(device)


def measure_step(step, *, model=None, optimizer=None, inputs=None, steps: int = 1,
                 device=None, title: str | None = None,
                 track_modules: bool = True) -> MemoryReport:
    """Run ``step()`` and measure exactly what it holds in memory, when and why.

    Args:
        step: a function without arguments that runs one training step (forward, backward,
            optimizer step) or anything else to measure (e.g. inference under ``no_grad``).
        model: the ``nn.Module`` it trains: its parameters and buffers count as
            "parameters", their ``.grad`` as "gradients", and operations are attributed to
            its submodules.
        optimizer: its optimizer (or a list of them): state tensors count as "optimizer
            state". Adam's state appears during the first step, so measure ``steps=2`` to see
            the first step and the steady state.
        inputs: tensors (or a list/tuple/dict of them) that the step reads, counted as
            "inputs" from the start. Other tensors made before the step are counted from the
            first operation that uses them.
        steps: how many times to call ``step()``; each call is reported (``report.steps``).
        device: the device whose memory to count; by default that of the model's
            parameters (or the inputs), else ``helpers.pick_device()``.
        title: a name for the report ("training step").
        track_modules: attribute operations to modules (small cost; on by default).

    Returns:
        A :class:`MemoryReport`: ``peak_bytes``, ``at_peak`` and ``category_max`` (bytes by
        category), ``phase_peaks`` (forward, backward, optimizer), ``steps``,
        ``first_step``/``steady_state``, ``timeline``, ``plot_timeline()``, ``text()``, and
        ``cuda`` (the real allocator's statistics, on CUDA).

        ``peak_bytes`` is the largest sum, over the points after each operation, of the
        exact bytes of live tensor storages and, inside ``VirtualGPU(..., workspaces=True)``,
        the library workspaces (category ``"workspace"``: the cuBLAS workspaces held plus a
        running convolution's cuDNN allowance). Without allocator rounding that is the
        virtual GPU's ``peak_allocated_bytes`` over the step (when the step holds its peak);
        with rounding, ``peak_allocated_bytes`` and ``peak_reserved_bytes`` are the virtual
        GPU's. Without workspaces modelled the report has no ``"workspace"`` category.

    Raises:
        torch.OutOfMemoryError: inside a ``VirtualGPU`` that runs out; the partial report
            is attached to the error as ``memory_report``.
    """
    if not callable(step):
        raise TypeError(
            f"step must be a function without arguments (e.g. `def step(): ...`), got "
            f"{type(step).__name__}: {step!r}"
        )
    if isinstance(step, (nn.Module, torch.Tensor)):
        raise TypeError("step must be a function that runs the step, not a model or tensor: "
                        "pass the model as model=...")
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
    optimizers = _optimizers(optimizer)
    steps = positive_int(steps, "steps", maximum=MAX_STEPS)
    if inputs is not None and not any(True for _ in tensors_in(inputs)):
        raise TypeError("inputs must be a tensor or a list/tuple/dict of tensors")
    flag(track_modules, "track_modules")
    if title is not None:
        text(title, "title", empty=True)
    if title is None:
        title = f"{type(model).__name__} training step" if model is not None else "step"

    gpu = state.current_virtual_gpu()
    if gpu is not None:
        engine, own = gpu.engine, False
        if engine.recorder is not None:
            raise RuntimeError("measure_step cannot be nested in another measure_step")
        dev = gpu.device_type
    else:
        dev = _device_type(device, model, inputs)
        engine, own = Engine(device_type=dev), True
    from torch._guards import active_fake_mode

    fake = active_fake_mode() is not None
    use_cuda = dev == "cuda" and not fake and torch.cuda.is_available()

    if own:
        engine.__enter__()
    recorder = None
    try:
        for rec in list(engine.live.values()):
            rec.label = "other"
        params = unique_params(model, optimizers)
        engine.adopt(params, "parameters")
        if model is not None:
            engine.adopt(list(model.buffers()), "parameters")
        engine.adopt([p.grad for p in params if p.grad is not None], "gradients")
        for opt in optimizers:
            engine.adopt(optimizer_state_tensors(opt), "optimizer_state")
        if inputs is not None:
            engine.adopt(inputs, "inputs")
        recorder = Recorder(engine, model=model, track_modules=track_modules)
        recorder.baseline = list(engine.live.values())
        baseline_bytes = engine.live_bytes
        if engine.workspaces is not None:
            baseline_bytes += engine.workspaces.held_bytes
        cuda_before = _cuda_start() if use_cuda else None
        recorder.start(params, optimizers)
        for i in range(1, steps + 1):
            recorder.begin_step(i)
            step()
            recorder.end_step()
    except torch.OutOfMemoryError as err:
        if recorder is not None:
            recorder.stop()
            if recorder.points:
                err.memory_report = _build(recorder, engine, gpu, title, dev, fake,
                                           baseline_bytes, None)
        raise
    finally:
        if recorder is not None:
            recorder.stop()
        if own:
            engine.__exit__(None, None, None)
    cuda = _cuda_stop(cuda_before) if use_cuda else None
    return _build(recorder, engine, gpu, title, dev, fake, baseline_bytes, cuda)


def _optimizers(optimizer) -> list:
    if optimizer is None:
        return []
    opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    for opt in opts:
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer (or a list of them), got "
                f"{type(opt).__name__}"
            )
    return opts


def _cuda_start() -> tuple[CudaSource, int]:
    source = CudaSource()
    source.reset()  # synchronises first
    return source, source.read()


def _cuda_stop(start: tuple[CudaSource, int]) -> CudaStats:
    source, before = start
    source.sync()
    return CudaStats(
        device_name=torch.cuda.get_device_name(source.index), total_bytes=source.total,
        allocated_before_bytes=before, peak_allocated_bytes=source.peak(),
        peak_reserved_bytes=source.peak_reserved(), allocated_after_bytes=source.read(),
        reserved_after_bytes=source.reserved(),
    )


def _build(recorder: Recorder, engine: Engine, gpu, title, dev, fake, baseline_bytes,
           cuda) -> MemoryReport:
    """Replay the recorded events with each storage's final category into a report.

    With workspaces modelled (``VirtualGPU(workspaces=True)``) a ``"workspace"`` category
    follows the tensor categories (each point's cuBLAS workspaces held plus a convolution's
    cuDNN allowance) and ``total`` includes it; without, the report has no trace of it.
    """
    with_ws = engine.workspaces is not None
    categories = (*CATEGORIES, WORKSPACE) if with_ws else CATEGORIES
    totals = dict.fromkeys(CATEGORIES, 0)
    for rec in recorder.baseline:
        totals[rec.label] += rec.nbytes
    cols = {k: [] for k in ("point", "step", "phase", "op", "module", "total", *categories,
                            "allocated", "reserved")}
    events = recorder.events
    ei = 0
    for k, p in enumerate(recorder.points):
        while ei < p.n_events:
            rec, delta = events[ei]
            totals[rec.label] += delta
            ei += 1
        row = dict(point=k, step=p.step, phase=p.phase, op=p.op, module=p.module, total=p.live,
                   **totals)
        if with_ws:
            row[WORKSPACE] = p.workspace
            row["total"] += p.workspace
        row.update(allocated=p.allocated, reserved=p.reserved)
        for key, value in row.items():
            cols[key].append(value)
    n = len(cols["point"])

    def peak_index(idx):
        return max(idx, key=lambda i: (cols["total"][i], -i))

    def phase_peaks(idx) -> dict:
        """The peak of each phase over the points ``idx`` (start/end marks left out)."""
        peaks = {}
        for i in idx:
            if cols["op"][i] not in _MARKS:
                ph = cols["phase"][i]
                peaks[ph] = max(peaks.get(ph, 0), cols["total"][i])
        return {ph: peaks[ph] for ph in PHASES if ph in peaks}

    steps = []
    for s in sorted(set(cols["step"])):
        idx = [i for i in range(n) if cols["step"][i] == s]
        ip = peak_index(idx)
        steps.append(StepMemory(
            step=s, peak_bytes=cols["total"][ip], peak_phase=cols["phase"][ip],
            peak_op=cols["op"][ip], peak_module=cols["module"][ip],
            at_peak={c: cols[c][ip] for c in categories}, phase_peaks=phase_peaks(idx),
            start_bytes=cols["total"][idx[0]], end_bytes=cols["total"][idx[-1]],
            peak_reserved_bytes=max(cols["reserved"][i] for i in idx),
        ))
    ip = peak_index(range(n))
    rounding = bool(getattr(engine.allocator, "rounding", False))
    report = MemoryReport(
        peak_bytes=cols["total"][ip], peak_step=cols["step"][ip],
        peak_phase=cols["phase"][ip], peak_op=cols["op"][ip], peak_module=cols["module"][ip],
        at_peak={c: cols[c][ip] for c in categories},
        category_max={c: max(cols[c]) for c in categories},
        phase_peaks=phase_peaks(range(n)), steps=steps, baseline_bytes=baseline_bytes,
        end_bytes=cols["total"][-1], timeline=Timeline(cols), device=dev, fake=fake,
        title=title, virtual_gpu=None if gpu is None else gpu.name,
        capacity_bytes=None if gpu is None else gpu.capacity_bytes,
        context_bytes=0 if gpu is None else gpu.context_bytes, rounding=rounding,
        peak_allocated_bytes=max(cols["allocated"]), peak_reserved_bytes=max(cols["reserved"]),
        cuda=cuda,
    )
    if recorder.oom is not None:
        alloc_size, phase, module, op = recorder.oom
        where = f"{phase}" + (f", in {module}" if module else "")
        report.notes.append(
            f"ran out of memory ({where}): could not allocate {alloc_size:,} more bytes"
        )
    return report


_MARKS = ("start", "end")
