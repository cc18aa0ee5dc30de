"""Lesson 08: the out-of-memory challenge, reproducible on any machine and checked automatically.

::

    from helpers.oom import original_step   # the workshop script's loop body, as a make_step

    helpers.check_training(original_step, batch_size=256)   # does not fit an L40S: needs 65 GiB
    helpers.check_training(original_step, batch_size=32)    # fits

:func:`check_training` runs a proposed training step twice:

* at **full scale**: the real ``LargeResNet`` on 224 x 224 images at the batch size given, on
  a virtual L40S (fake tensors, CUDA-like allocator rounding, a 500 MiB CUDA context), until
  the optimizer has stepped twice (Adam's state appears in the first step). It fits when no
  ``torch.OutOfMemoryError`` is raised; the peak is what ``nvidia-smi`` would have shown for
  the step's tensors. Library workspaces (cuBLAS, cuDNN) are not counted on the virtual card
  (see ``helpers.VirtualGPU(workspaces=True)``); a real card needs that much more.
  On a CUDA GPU at least as large as the card, the real model is trained on the real GPU
  instead, with the allocator capped to the card's memory
  (``torch.cuda.set_per_process_memory_fraction``);
* at **small scale**: a narrow copy of the model (``width=8``) on 16 x 16 images, trained for
  real for a few steps on this machine's device, to check that the loss stays finite. Every
  ``torch.GradScaler`` is enabled there, as fp16 training needs it, so a scaler loop that
  would break fp16 training on a GPU fails: a missing ``scaler.update()``, or
  ``optimizer.step()`` on gradients still multiplied by the scale. On a GPU every
  ``torch.autocast`` region also computes in float16; on a CPU it keeps the dtype asked for
  (fp16 convolutions run ~15x slower than fp32 there).

It reports the micro-batch (the largest batch the model saw in one forward pass) and the
effective batch (samples per optimizer step), so a fix that silently changes training shows.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from .core.checks import LARGEST, device_arg, flag, positive_int, text, whole_number
from .core.fmt import ShownAsTable, Table, fmt_bytes
from .memory.capacity import parse_capacity, resolve_capacity
from .memory.errors import is_oom_error, release_after_error
from .memory.sources import CudaSource
from .memory.virtual import foreach_as_on_cuda, is_fake_value_error
from .models import ResNet

__all__ = [
    "LargeResNet", "SyntheticImages", "TrainingCheck", "check_training", "count_flops",
    "fix_table", "loop_step", "original_step", "plot_fixes",
]

#: the virtual card's CUDA context, as lessons 05 and 06 assume
CONTEXT = "500 MiB"
#: the largest card the checker simulates when a step does not fit, to say what it needs
_UNLIMITED = "4096 GiB"
_SMALL = {"width": 8, "n_classes": 10}
#: 32 px, not 16: at 16 px the last stage's first 3x3 stride-2 convolution gets a 1x1 input,
#: and PyTorch's CPU bfloat16 weight gradient for that shape (oneDNN) fills the taps that see
#: only padding with uninitialised memory: garbage, sometimes inf, so an enabled GradScaler
#: skipped every step now and then (tests/unit/topics/test_oom.py reproduces it)
_SMALL_IMAGE = 32


class LargeResNet(ResNet):
    """The challenge's model: ResNet-200 (3, 24, 36 and 3 bottleneck blocks, 64.7 M parameters).

    Laid out like ``helpers.ResNet``: ``self.stem``, the 66 residual blocks in one
    ``nn.Sequential`` ``self.layers`` (ready for ``checkpoint_sequential``), ``self.head``.
    At batch 256 on 224 x 224 images, a training step with Adam needs about 62 GiB: more than
    an L40S has. ``width`` scales every layer (``width=8``: a small copy the checker trains
    for real).
    """

    def __init__(self, n_classes: int = 1000, in_channels: int = 3, width: int = 64):
        super().__init__(depth=200, n_classes=n_classes, in_channels=in_channels, width=width)


class SyntheticImages(torch.utils.data.Dataset):
    """Random images with learnable labels, made on the fly (nothing to download).

    Sample ``i`` is the same every time it is read (its noise is seeded by ``seed`` and
    ``i``). Each sample is ``(image, label)``: a ``(channels, size, size)`` float32 image of noise
    whose mean over one channel depends on the label. Items are made when they are read, so
    inside ``helpers.full_scale()`` or a ``VirtualGPU(fake=True)`` they are fake tensors too.

    Args:
        n_samples: length of the data set.
        size: image height and width (224 for ImageNet-sized images).
        n_classes: number of labels.
        channels: image channels.
        seed: the labels are ``(seed + index) % n_classes``.
    """

    def __init__(self, n_samples: int = 1024, *, size: int = 224, n_classes: int = 1000,
                 channels: int = 3, seed: int = 0):
        self.n_samples = positive_int(n_samples, "n_samples")
        self.size = positive_int(size, "size", 16384)
        self.n_classes = positive_int(n_classes, "n_classes")
        self.channels = positive_int(channels, "channels", 1024)
        if self.channels * self.size**2 * 4 > 2**30:  # each image is made when it is read
            raise ValueError(f"size={self.size} and channels={self.channels}: one float32 image "
                             f"would take {self.channels * self.size**2 * 4 / 2**30:.3g} GiB; "
                             "at most 1 GiB an image")
        self.seed = whole_number(seed, "seed", -LARGEST)

    def __len__(self) -> int:
        return self.n_samples

    def __getitem__(self, index: int):
        index = whole_number(index, "index", -LARGEST)  # a float: TypeError
        if not -self.n_samples <= index < self.n_samples:
            raise IndexError(f"index {index} is out of range for {self.n_samples} samples")
        index %= self.n_samples
        label = (self.seed + index) % self.n_classes
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        image = torch.randn(self.channels, self.size, self.size, generator=generator)
        image[label % self.channels] += 2.0 * label / self.n_classes - 1.0
        return image, torch.tensor(label)

    def __repr__(self) -> str:
        return (f"SyntheticImages({self.n_samples} x {self.channels}x{self.size}x{self.size}, "
                f"{self.n_classes} classes)")


def original_step(model, optimizer):
    """The workshop script's loop body as a ``make_step``: ``step(data, labels)`` runs the
    forward pass, the loss, ``zero_grad()``, backward and the optimizer step, and returns the
    loss. Lesson 08 starts from it."""
    criterion = nn.CrossEntropyLoss()

    def step(data, labels):
        outputs = model(data)
        loss = criterion(outputs, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    return step


def loop_step(loop: Callable) -> Callable:
    """A ``make_step`` for :func:`check_training` made from a script's training loop.

    ``loop(model, optimizer, loader, epochs)`` is the loop as a script writes it::

        def loop(model, optimizer, loader, epochs):
            criterion = nn.CrossEntropyLoss()
            for epoch in range(epochs):
                for data, labels in loader:
                    ...   # forward, loss, zero_grad, backward, optimizer.step()

    Each ``step(data, labels)`` of the checker calls it once with a loader of that one batch
    and ``epochs=1``, so what the loop builds before its ``for`` (a criterion, a
    ``GradScaler``) is built again for every batch: harmless for memory and for the checks.
    The loss is read from the loop's loss module (a module whose class name ends in ``Loss``,
    such as ``nn.CrossEntropyLoss``): the last one it computed is the step's loss.
    """
    if not callable(loop):
        raise TypeError(f"loop must be a function loop(model, optimizer, loader, epochs), got "
                        f"{type(loop).__name__}: {loop!r}")

    def make_step(model, optimizer):
        def step(data, labels):
            losses = []

            def record(module, _args, output):
                if type(module).__name__.endswith("Loss"):  # CrossEntropyLoss, MSELoss...
                    losses.append(output)

            handle = nn.modules.module.register_module_forward_hook(record)
            try:
                loop(model, optimizer, [(data, labels)], 1)
            finally:
                handle.remove()
            if not losses:
                raise TypeError("the loop computed no loss with a loss module: compute it "
                                "with one, as the script does (criterion = "
                                "nn.CrossEntropyLoss(), loss = criterion(outputs, labels))")
            return losses[-1]

        return step

    make_step.__name__ = getattr(loop, "__name__", "loop")
    return make_step


# --------------------------------------------------------------------------- validation
def _arguments(make_step, batch_size, model, optimizer) -> tuple:
    """``(batch_size, model_factory, optimizer_factory)``, each checked."""
    if not callable(make_step):
        raise TypeError(
            "make_step must be a function make_step(model, optimizer) that returns a function "
            f"step(data, labels) -> loss; got {make_step!r}"
        )
    return (positive_int(batch_size, "batch_size"), _factory(model, "model", LargeResNet),
            _factory(optimizer, "optimizer", torch.optim.Adam))


def _factory(value, name: str, default):
    if value is None:
        return default
    if isinstance(value, (nn.Module, torch.optim.Optimizer)):
        raise TypeError(
            f"{name} must be a class or function that builds one (e.g. "
            f"{'helpers.LargeResNet' if name == 'model' else 'torch.optim.Adam'}), not an "
            f"instance: the checker builds a full-size one and a small one itself"
        )
    if not callable(value):
        raise TypeError(f"{name} must be a class or a function, got {value!r}")
    return value


# --------------------------------------------------------------------------- running steps
@dataclass
class _Run:
    calls: int = 0
    updates: int = 0
    micro_batch: int = 0
    samples: int = 0
    losses: list = field(default_factory=list)
    amp: bool = False        # the small-scale run used autocast or a GradScaler
    error: str | None = None  # why the small-scale run stopped (a broken GradScaler loop)
    model_called: bool = False  # the model's own forward ran (else its children's count)


_FAKE_VALUE_HINT = (
    "the training step reads a tensor's value (loss.item(), float(loss), print(loss) or an "
    "`if` on a tensor). At full scale the checker runs the step on fake tensors, which have "
    "shapes but no values: return the loss from step() instead and let the checker read it."
)


def _run_steps(make_step, net, opt, *, batch_size: int, image_size: int, n_classes: int,
               device, min_updates: int, max_calls: int, read_losses: bool) -> _Run:
    """Call the learner's step on fresh batches until the optimizer has stepped
    ``min_updates`` times (or ``max_calls`` calls); count what it did."""
    run = _Run()

    def count_update(*_):
        run.updates += 1

    def count_forward(_module, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
            run.micro_batch = max(run.micro_batch, int(args[0].shape[0]))

    def count_model_forward(module, args):
        run.model_called = True
        count_forward(module, args)

    def count_child_forward(module, args):  # a loop that calls model.stem(...) directly
        if not run.model_called:
            count_forward(module, args)

    handles = [opt.register_step_post_hook(count_update),
               net.register_forward_pre_hook(count_model_forward)]
    handles += [child.register_forward_pre_hook(count_child_forward)
                for child in net.children()]
    try:
        step = make_step(net, opt)
        if not callable(step):
            raise TypeError(
                "make_step(model, optimizer) must return a function step(data, labels) that "
                f"trains on one batch and returns its loss; it returned {step!r}"
            )
        while run.updates < min_updates and run.calls < max_calls:
            data = torch.randn(batch_size, 3, image_size, image_size, device=device)
            labels = torch.randint(0, n_classes, (batch_size,), device=device)
            try:
                loss = step(data, labels)
            except Exception as exc:
                if is_fake_value_error(exc):
                    raise RuntimeError(_FAKE_VALUE_HINT) from exc
                raise
            if loss is None:
                raise TypeError("step(data, labels) must return the loss (a tensor or a "
                                "number); it returned None")
            run.calls += 1
            run.samples += batch_size
            if read_losses:
                run.losses.append(_loss_value(loss))
            del loss, data, labels
    finally:
        for h in handles:
            h.remove()
    if run.updates == 0:
        seen = ""
        if read_losses:  # real tensors (small scale): say what a skipping GradScaler saw
            grads = [p.grad for p in net.parameters() if p.grad is not None]
            bad = sum(1 for g in grads if not bool(torch.isfinite(g).all()))
            last = ", ".join(f"{v:.4g}" for v in run.losses[-3:]) or "none"
            seen = (f" (last losses: {last}; parameters with non-finite gradients: {bad} of "
                    f"{len(grads)}: a GradScaler skips every such step)")
        raise ValueError(
            f"the optimizer never stepped in {run.calls} calls of step(data, labels): call "
            "optimizer.step() (or scaler.step(optimizer)) in the step, at least every "
            f"{max_calls // max(min_updates, 1)} calls{seen}"
        )
    return run


def _loss_value(loss) -> float:
    """The loss as a float (inf for a number beyond float's range: not finite either)."""
    try:
        return float(loss.detach().float()) if isinstance(loss, torch.Tensor) else float(loss)
    except OverflowError:
        return math.inf
    except (TypeError, ValueError):
        raise TypeError(f"step(data, labels) must return the loss (a tensor or a number); "
                        f"it returned {type(loss).__name__}") from None


def _build(model_factory, opt_factory, device, **kwargs):
    try:
        net = model_factory(**kwargs)
    except TypeError as exc:
        if kwargs:
            raise TypeError(
                f"the checker builds a small copy of the model with {kwargs}: model must "
                f"accept these keyword arguments, as helpers.LargeResNet does ({exc})"
            ) from exc
        raise
    if not isinstance(net, nn.Module):
        raise TypeError(f"model() must build an nn.Module, it returned {type(net).__name__}")
    net = net.to(device)
    opt = opt_factory(net.parameters())
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"optimizer(params) must build a torch.optim.Optimizer, it returned "
                        f"{type(opt).__name__}")
    return net, opt


_TRIED = re.compile(r"Tried to allocate ([\d.]+ \w+)")
_WHERE = re.compile(r"raised ([^\]]*?)\.\]")
_LIBRARY_STATUS = re.compile(r"\bCU(?:BLAS|DNN)_STATUS_\w+")


def _short_oom(message: str) -> str:
    tried = _TRIED.search(message)
    where = _WHERE.search(message)
    status = _LIBRARY_STATUS.search(message)
    if status:  # cuBLAS's or cuDNN's own allocation failed
        return status.group(0)
    if message.startswith("CUDA error: out of memory"):
        return "CUDA error: out of memory"
    parts = ["torch.OutOfMemoryError"]
    if where:
        parts.append(where.group(1).split(" by ")[0])
    if tried:
        parts.append(f"(tried to allocate {tried.group(1)})")
    return " ".join(parts)


# --------------------------------------------------------------------------- result
@dataclass(frozen=True, repr=False)
class TrainingCheck(ShownAsTable):
    """What :func:`check_training` found. ``passed``: fits and the loss stayed finite.

    ``peak_bytes`` is the full-scale peak the card would show (CUDA context + memory the
    allocator reserved) when the step fits; when it does not, ``oom`` holds the error's
    message and ``needed_bytes`` what the step needs (measured on a larger virtual card).
    Library workspaces (cuBLAS, cuDNN) are not counted on the virtual card (see
    ``helpers.VirtualGPU(workspaces=True)``); on a real GPU they are.
    """

    name: str
    gpu: str
    capacity_bytes: int
    source: str
    fits: bool
    peak_bytes: int | None
    needed_bytes: int | None
    oom: str | None
    batch_size: int
    micro_batch: int
    effective_batch: int
    updates: int
    losses: tuple
    small_scale: str
    #: why the small-scale run stopped (a broken ``GradScaler`` loop), or None
    small_error: str | None = None

    @property
    def loss_finite(self) -> bool:
        return bool(self.losses) and all(math.isfinite(v) for v in self.losses)

    @property
    def passed(self) -> bool:
        return self.fits and self.loss_finite and self.small_error is None

    @property
    def bytes(self) -> int | None:
        """The peak when it fits, else what it needs."""
        return self.peak_bytes if self.fits else self.needed_bytes

    @property
    def share(self) -> float | None:
        """Peak (or need) as a fraction of the card."""
        return None if self.bytes is None else self.bytes / self.capacity_bytes

    def memory_text(self) -> str:
        if self.fits:
            return (f"fits on the {self.gpu}: peak {fmt_bytes(self.peak_bytes)} reserved + "
                    f"context of {fmt_bytes(self.capacity_bytes)} ({self.share:.0%})")
        need = (f"needs {fmt_bytes(self.needed_bytes)}, peak reserved + context "
                f"({self.share:.0%} of the card)"
                if self.needed_bytes else "needs more than the largest card simulated")
        return f"does not fit on the {self.gpu}: {_short_oom(self.oom or '')}; {need}"

    def loss_text(self) -> str:
        if self.small_error is not None:
            return f"stopped: {self.small_error}"
        if not self.losses:
            return "no loss"
        values = " -> ".join(f"~{v:.3g}" for v in self.losses)
        return f"loss {values} ({'finite' if self.loss_finite else 'NOT finite'})"

    def text(self) -> str:
        verdict = "passes" if self.passed else "fails"
        return (f"{self.name}: {verdict}. Full scale ({self.source}): {self.memory_text()}. "
                f"Batch {self.batch_size}: micro-batch {self.micro_batch}, effective batch "
                f"{self.effective_batch} per optimizer step. Small scale "
                f"({self.small_scale}): {self.loss_text()}.")

    def _html(self) -> str:
        import html

        colour = "#2a7d2a" if self.passed else "#b22222"
        verdict = "passes" if self.passed else "fails"
        rows = [
            ("full scale", f"{self.source}: {self.memory_text()}"),
            ("batch", f"{self.batch_size} per call; micro-batch {self.micro_batch}; effective "
                      f"batch {self.effective_batch} per optimizer step"),
            ("small scale", f"{self.small_scale}: {self.loss_text()}"),
        ]
        body = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}"
                       f"</th><td style='text-align:left'>{html.escape(v)}</td></tr>"
                       for k, v in rows)
        return (f"<div><b>{html.escape(self.name)}</b>: <b style='color:{colour}'>{verdict}"
                f"</b><table>{body}</table></div>")


# --------------------------------------------------------------------------- the checker
def check_training(make_step: Callable, *, batch_size: int = 256, model=None, optimizer=None,
                   gpu="L40S", name: str | None = None, device=None,
                   small_steps: int = 3) -> TrainingCheck:
    """Does this training step fit on the card, and does it still train?

    Args:
        make_step: ``make_step(model, optimizer)`` returns ``step(data, labels)``, which trains
            on one batch from the data loader (``data``: ``(batch_size, 3, 224, 224)`` on the
            device) and returns the loss. Create what the step keeps between calls (a
            ``GradScaler``, an accumulation counter) in ``make_step``.
        batch_size: the data loader's batch size.
        model: a class or function building the model (default ``helpers.LargeResNet``); it
            must accept ``width=`` and ``n_classes=`` for the small copy.
        optimizer: a class or function ``optimizer(params)`` (default ``torch.optim.Adam``).
        gpu: the card to fit on: a known name (``"L40S"``) or a size (``"48 GiB"``).
        name: a label for tables (default: the make_step function's name).
        device: where to run (default ``helpers.pick_device()``). On a CUDA GPU with at least
            the card's memory, the full-scale run is real, capped to the card's size.
        small_steps: optimizer steps of the small-scale run (at least 1).

    Returns:
        a :class:`TrainingCheck` (shows itself as a small table in notebooks).
    """
    batch_size, model_factory, opt_factory = _arguments(make_step, batch_size, model, optimizer)
    small_steps = positive_int(small_steps, "small_steps", maximum=1000)
    card, capacity = resolve_capacity(gpu)
    card = card or fmt_bytes(capacity)
    if capacity <= parse_capacity(CONTEXT):
        raise ValueError(f"gpu must have more memory than the {CONTEXT} the CUDA context "
                         f"takes, got {fmt_bytes(capacity)}")
    if device is None:
        from .core.environment import pick_device

        device = pick_device()
    device = device_arg(device, "device")  # "cuda" without CUDA: ValueError (fuzz case 9)
    if device.type == "meta":  # the small-scale run reads losses, which meta tensors lack
        raise ValueError("device must be a device that computes ('cpu', 'cuda', 'mps'), got "
                         "'meta': check_training trains a few real steps to read the losses "
                         "(the full-scale part needs no device: it uses fake tensors)")
    label = text(name, "name") if name is not None else getattr(make_step, "__name__",
                                                                  "training step")

    kwargs = dict(batch_size=batch_size, model_factory=model_factory, opt_factory=opt_factory)
    full = None
    if device.type == "cuda" and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(device).total_memory
        if total >= capacity:
            full = _full_scale_cuda(make_step, device=device, capacity=capacity, card=card,
                                    **kwargs)
    if full is None:
        full = _full_scale_virtual(make_step, capacity=capacity, card=card, **kwargs)
    small = _small_scale(make_step, device=device, steps=small_steps, **kwargs)
    losses = tuple(full.pop("losses", ())) + tuple(small.losses)
    precision = ""
    if small.amp:
        precision = ("; GradScaler enabled" if device.type == "cpu" else
                     "; autocast in float16, GradScaler enabled")
    return TrainingCheck(
        name=label, gpu=card, capacity_bytes=capacity, losses=losses,
        small_scale=(f"width {_SMALL['width']}, {_SMALL_IMAGE}x{_SMALL_IMAGE} images, "
                     f"{small.updates} optimizer steps on {device.type}{precision}"),
        small_error=small.error, batch_size=batch_size, **full,
    )


def _counts(run: _Run) -> dict:
    return dict(micro_batch=run.micro_batch, updates=run.updates,
                effective_batch=round(run.samples / run.updates))


def _fit(attempt, first, second, *, label: str, batch_size: int, release) -> dict:
    """``attempt(first)``: the run on the card; if it runs out of memory, ``attempt(second)``
    on a larger one measures what the step needs.  ``attempt`` returns ``(run, peak)``."""
    try:
        run, peak = attempt(first)
    except Exception as exc:  # cuBLAS/cuDNN allocation failures are not OutOfMemoryError
        if not is_oom_error(exc):
            raise
        oom, failed = str(exc), exc
    else:
        return dict(source=label, fits=True, oom=None, needed_bytes=None, peak_bytes=peak,
                    losses=run.losses, **_counts(run))
    # The failed run's frames (its model, optimizer state and activations, held by the
    # traceback) must go and their cached blocks be given back, or the larger run's
    # reserved peak would start above them and inflate what the step needs.
    release(failed)
    try:
        run, needed = attempt(second)
    except Exception as exc:
        if not is_oom_error(exc):
            raise
        release(exc)
        return dict(source=label, fits=False, oom=oom, needed_bytes=None, peak_bytes=None,
                    micro_batch=batch_size, effective_batch=batch_size, updates=0)
    return dict(source=label, fits=False, oom=oom, needed_bytes=needed, peak_bytes=None,
                losses=run.losses, **_counts(run))


def _full_scale_virtual(make_step, *, batch_size, model_factory, opt_factory, capacity,
                        card) -> dict:
    from .memory.virtual import VirtualGPU

    def attempt(size):
        gpu = VirtualGPU(size, fake=True, rounding=True, context_bytes=CONTEXT)
        with gpu, foreach_as_on_cuda():  # Adam's CUDA default, as virtual_cuda runs it
            net, opt = _build(model_factory, opt_factory, gpu.device_type)
            run = _run_steps(make_step, net, opt, batch_size=batch_size, image_size=224,
                             n_classes=1000, device=gpu.device_type, min_updates=2,
                             max_calls=64, read_losses=False)
            del net, opt
        return run, gpu.context_bytes + gpu.peak_reserved_bytes

    return _fit(attempt, capacity, max(parse_capacity(_UNLIMITED), 2 * capacity),
                label=f"virtual {card}, fake tensors, CUDA allocator rounding, {CONTEXT} "
                      "context", batch_size=batch_size, release=release_after_error)


@contextlib.contextmanager
def _capped(source: CudaSource, fraction: float):
    torch.cuda.set_per_process_memory_fraction(fraction, source.device)
    try:
        yield
    finally:
        release_after_error(None, source.empty_cache)
        torch.cuda.set_per_process_memory_fraction(1.0, source.device)


def _full_scale_cuda(make_step, *, device, batch_size, model_factory, opt_factory, capacity,
                     card) -> dict | None:
    """The real model on the real GPU, its allocator capped to the card's memory."""
    source = CudaSource(device)
    release_after_error(None, source.empty_cache)
    total = source.free_and_total()[1]
    outside = source.outside()  # the CUDA context, other processes
    budget = capacity - outside
    if budget <= 0:
        return None

    def attempt(fraction):
        source.reset()
        with _capped(source, fraction):
            net, opt = _build(model_factory, opt_factory, device)
            run = _run_steps(make_step, net, opt, batch_size=batch_size, image_size=224,
                             n_classes=1000, device=device, min_updates=2, max_calls=64,
                             read_losses=True)
            del net, opt
        return run, outside + source.peak_reserved()

    return _fit(attempt, budget / total, 1.0,
                label=f"{torch.cuda.get_device_name(device)}, real allocator capped to the "
                      f"{card}'s {fmt_bytes(capacity)}",
                batch_size=batch_size,
                release=lambda exc: release_after_error(exc, source.empty_cache))


class _ScalerMisuse(RuntimeError):
    """The optimizer stepped on gradients a GradScaler had scaled and not unscaled."""


@contextlib.contextmanager
def _strict_amp(run: _Run, opt, fp16: bool):
    """Inside: every ``torch.GradScaler`` is enabled, ``torch.autocast`` regions compute in
    float16 if ``fp16``, and ``optimizer.step()`` on gradients a scaler scaled (not via
    ``scaler.step(optimizer)``) raises :class:`_ScalerMisuse`.  ``run.amp`` says whether
    autocast or a scaler was used."""
    from torch.amp import autocast_mode, grad_scaler

    autocast_class, scaler_class = autocast_mode.autocast, grad_scaler.GradScaler
    scalers: list = []

    class Fp16Autocast(autocast_class):
        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if enabled:
                run.amp = True
            super().__init__(device_type, dtype=torch.float16 if enabled and fp16 else dtype,
                             enabled=enabled, cache_enabled=cache_enabled)

    class EnabledScaler(scaler_class):
        def __init__(self, device="cuda", init_scale=2.0**16, growth_factor=2.0,
                     backoff_factor=0.5, growth_interval=2000, enabled=True):
            run.amp = True
            # scale 1: a few steps at a scale of 2**16 are mostly skipped for overflows, and
            # every check needs them; the loop's mistakes show at any scale
            super().__init__(device, init_scale=1.0, growth_factor=growth_factor,
                             backoff_factor=backoff_factor, growth_interval=growth_interval,
                             enabled=True)
            self.scaled = False
            scalers.append(self)

        def scale(self, outputs):
            self.scaled = True
            return super().scale(outputs)

        def update(self, new_scale=None):
            super().update(new_scale)
            self.scaled = False

    def check_unscaled(optimizer, *_):
        for scaler in scalers:
            state = scaler._per_optimizer_states[id(optimizer)]
            if scaler.scaled and state["stage"] is grad_scaler.OptState.READY:
                raise _ScalerMisuse(
                    "optimizer.step() ran on gradients still multiplied by the GradScaler's "
                    "scale: call scaler.step(optimizer), then scaler.update()")

    names = [(torch, "autocast", Fp16Autocast), (torch.amp, "autocast", Fp16Autocast),
             (torch, "GradScaler", EnabledScaler), (torch.amp, "GradScaler", EnabledScaler)]
    if hasattr(torch, "cpu") and hasattr(torch.cpu, "amp"):
        names.append((torch.cpu.amp, "GradScaler", EnabledScaler))
    saved = [(module, name, getattr(module, name)) for module, name, _ in names]
    handle = opt.register_step_pre_hook(check_unscaled)
    try:
        for module, name, value in names:
            setattr(module, name, value)
        yield
    finally:
        handle.remove()
        for module, name, value in saved:
            setattr(module, name, value)


def _small_scale(make_step, *, device, steps, batch_size, model_factory, opt_factory) -> _Run:
    """A narrow copy trained for real; mixed precision as strict as fp16 on a GPU (see
    :func:`_strict_amp`). A broken GradScaler loop sets ``error`` on the returned run."""
    torch.manual_seed(0)
    net, opt = _build(model_factory, opt_factory, device, **_SMALL)
    net.train()
    run = _Run()
    try:
        with _strict_amp(run, opt, fp16=device.type != "cpu"):
            done = _run_steps(make_step, net, opt, batch_size=batch_size,
                              image_size=_SMALL_IMAGE, n_classes=_SMALL["n_classes"],
                              device=device, min_updates=steps, max_calls=32 * steps,
                              read_losses=True)
    except _ScalerMisuse as exc:
        run.error = str(exc)
        return run
    except RuntimeError as exc:
        # GradScaler's own checks: step() twice without update(), update() without step()
        if not run.amp or "update()" not in str(exc) and "inf checks" not in str(exc):
            raise
        run.error = f"the GradScaler refused: {exc} (call scaler.step(optimizer), then " \
                    "scaler.update(), once per optimizer step)"
        return run
    done.amp = run.amp
    return done


# --------------------------------------------------------------------------- compute cost
def count_flops(make_step: Callable, *, batch_size: int = 256, model=None, optimizer=None,
                image_size: int = 224, by_operator: bool = False) -> float | dict[str, float]:
    """Floating-point operations per training sample of one optimizer step, at full scale.

    Counted exactly with ``torch.utils.flop_counter.FlopCounterMode`` on fake tensors,
    forward and backward, recomputation included, so checkpointing's extra forward pass
    shows; the precision does not change the count.  The counter counts only the operators
    in its table (matrix multiplications, convolutions and attention kernels); elementwise
    operations, normalization, activations, pooling and the optimizer count as 0.

    Args:
        by_operator: return ``{operator name: FLOPs per sample}`` (largest first) instead of
            the total, to see which operators were counted.
    """
    from torch.utils.flop_counter import FlopCounterMode

    from .memory.virtual import full_scale

    batch_size, model_factory, opt_factory = _arguments(make_step, batch_size, model, optimizer)
    image_size = positive_int(image_size, "image_size")
    by_operator = flag(by_operator, "by_operator")
    fs = full_scale()
    with fs:
        net, opt = _build(model_factory, opt_factory, fs.device)
        with FlopCounterMode(display=False) as counter:
            run = _run_steps(make_step, net, opt, batch_size=batch_size, image_size=image_size,
                             n_classes=1000, device=fs.device, min_updates=1, max_calls=64,
                             read_losses=False)
        del net, opt
    if not by_operator:
        return counter.get_total_flops() / run.samples
    counts = counter.get_flop_counts().get("Global", {})
    per_op = {getattr(op, "__name__", str(op)): n / run.samples for op, n in counts.items()}
    return dict(sorted(per_op.items(), key=lambda item: -item[1]))


# --------------------------------------------------------------------------- comparing fixes
def _as_checks(checks) -> list[TrainingCheck]:
    items = list(checks.values()) if isinstance(checks, Mapping) else list(checks)
    if not items or not all(isinstance(c, TrainingCheck) for c in items):
        raise TypeError("pass a non-empty list (or dict) of results of helpers.check_training")
    return items


def fix_table(checks) -> Table:
    """One row per :class:`TrainingCheck`: fits?, peak (or need), share of the card, batches."""
    items = _as_checks(checks)
    rows = []
    for c in items:
        memory = fmt_bytes(c.bytes) if c.bytes is not None else "?"
        share = f"{c.share:.0%}" if c.share is not None else "?"
        rows.append([c.name, "yes" if c.fits else "no (OOM)", memory, share, c.micro_batch,
                     c.effective_batch, "finite" if c.loss_finite else "NOT finite"])
    return Table(["training step", f"fits on the {items[0].gpu}", "reserved + context",
                  "share of the card", "micro-batch", "effective batch", "loss"], rows)


def plot_fixes(checks, *, title: str | None = None):
    """A bar chart of each step's peak (or need) against the card's capacity line."""
    import matplotlib.pyplot as plt

    items = _as_checks(checks)
    capacity = items[0].capacity_bytes
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(items) + 1.4), dpi=80)
    fig.patch.set_facecolor("white")
    names = [c.name for c in items][::-1]
    values = [(c.bytes or 0) / 2**30 for c in items][::-1]
    colours = ["#0072b2" if c.fits else "#d55e00" for c in items][::-1]
    hatches = ["" if c.fits else "//" for c in items][::-1]
    bars = ax.barh(names, values, color=colours)
    for bar, hatch, value in zip(bars, hatches, values, strict=True):
        bar.set_hatch(hatch)
        ax.text(value, bar.get_y() + bar.get_height() / 2, f" {value:.1f}", va="center",
                fontsize=8)
    ax.axvline(capacity / 2**30, color="black", ls="--", lw=1,
               label=f"{items[0].gpu}: {capacity / 2**30:.1f} GiB")
    ax.legend(loc="lower right", frameon=False, fontsize=8)
    ax.set_xlabel("GiB at the peak (blue: fits; orange, hatched: out of memory)")
    ax.set_xlim(0, max(values + [capacity / 2**30]) * 1.15)
    ax.set_title(title or "Peak memory of a training step, full scale", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    plt.close(fig)
    return fig
