"""``VirtualGPU``: a GPU's memory on any machine, down to a real ``torch.OutOfMemoryError``.

::

    with helpers.VirtualGPU("L40S") as gpu:           # 46068 MiB, as nvidia-smi reports it
        model = helpers.MLP().to(device)              # counted: created inside
        loss = model(x).sum(); loss.backward()        # x is counted from its first use
    print(gpu.peak_allocated_bytes)

Full scale (fake tensors: shapes, dtypes and bytes are exact, no data, no compute, no memory):

    with helpers.VirtualGPU("L40S", fake=True):
        model = helpers.ResNet(152)                   # 60 M parameters, allocated nowhere
        x = torch.randn(256, 3, 224, 224)
        model(x).sum().backward()                     # -> torch.OutOfMemoryError, in seconds

Used by lessons 04-08.  The error message has CUDA's wording, so code that catches
``torch.OutOfMemoryError`` or looks for "CUDA out of memory" works unchanged; it ends by
saying that the GPU was simulated.
"""

from __future__ import annotations

import contextlib
import os
import sys
from unittest import mock

import torch

from ..core.checks import flag, whole_number
from ..core.fmt import ShownAsTable, fmt_bytes
from . import state
from .allocator import CachingAllocator, ExactAllocator, SimulatedOOM
from .capacity import COMPUTE_CAPABILITY, resolve_capacity
from .engine import Engine, device_type
from .workspaces import Workspaces

__all__ = ["VirtualGPU", "full_scale", "current_virtual_gpu", "format_size", "oom_message",
           "foreach_as_on_cuda", "foreach_patches",
           "is_fake", "is_fake_value_error"]

current_virtual_gpu = state.current_virtual_gpu

DOCS_URL = "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables"


def format_size(n_bytes: int) -> str:
    """A size the way PyTorch's CUDA allocator writes it in messages (``"20.00 MiB"``)."""
    if n_bytes <= 1024:
        return f"{n_bytes} bytes"
    if n_bytes <= 1024**2:
        return f"{n_bytes / 1024:.2f} KiB"
    if n_bytes <= 1024**3:
        return f"{n_bytes / 1024**2:.2f} MiB"
    return f"{n_bytes / 1024**3:.2f} GiB"


def oom_message(*, tried: int, capacity: int, context: int, allocated: int, reserved: int,
                device_index: int = 0) -> str:
    """The text of CUDA's out-of-memory error for these numbers, in recent PyTorch's wording:
    since the allocator settings became ``PYTORCH_ALLOC_CONF`` (c10's generic caching device
    allocator), the hint names that variable, not the older ``PYTORCH_CUDA_ALLOC_CONF``
    (still read). Lesson 08 reads this message."""
    in_use = context + reserved
    free = max(0, capacity - in_use)
    return (
        f"CUDA out of memory. Tried to allocate {format_size(tried)}. GPU {device_index} has "
        f"a total capacity of {format_size(capacity)} of which {format_size(free)} is free. "
        f"Including non-PyTorch memory, this process has {format_size(in_use)} memory in use. "
        f"Of the allocated memory {format_size(allocated)} is allocated by PyTorch, and "
        f"{format_size(reserved - allocated)} is reserved by PyTorch but unallocated. If "
        "reserved but unallocated memory is large try setting "
        "PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        f"documentation for Memory Management  ({DOCS_URL})"
    )


def foreach_patches(fake: bool = True) -> list[tuple[object, str, object]]:
    """``(module, name, value)``: what to set so that optimizers (and ``clip_grad_norm_``)
    take their ``foreach`` paths on this machine's tensors, as they do by default on CUDA;
    with ``fake``, on fake tensors too. A virtual card's fake tensors are CPU tensors, where
    Adam would update parameter by parameter; on a GPU its default foreach update reserves
    more. The planner (and so ``virtual_cuda``) sets these, and :func:`foreach_as_on_cuda`."""
    import torch.optim.optimizer as optimizer_module
    import torch.utils._foreach_utils as foreach_utils
    from torch._subclasses.fake_tensor import FakeTensor

    original = foreach_utils._get_foreach_kernels_supported_devices

    def supported():  # CUDA's default: Adam, SGD and clip_grad_norm_ use foreach kernels
        return [*original(), "cpu"]

    patches = []
    for module in (foreach_utils, optimizer_module):
        patches.append((module, "_get_foreach_kernels_supported_devices", supported))
        if fake:  # fake parameters take the foreach paths too
            patches.append((module, "_foreach_supported_types",
                            [*module._foreach_supported_types, FakeTensor]))
    return patches


@contextlib.contextmanager
def foreach_as_on_cuda():
    """Inside: :func:`foreach_patches` set, put back on exit; so lesson 08's checker and the
    lesson's plain ``torch.cuda`` lines in ``virtual_cuda`` count the same bytes."""
    with contextlib.ExitStack() as stack:
        for module, name, value in foreach_patches():
            stack.enter_context(mock.patch.object(module, name, value))
        yield


_OPTIM_DIR = os.path.dirname(torch.optim.__file__) + os.sep
_MODULE_FILE = torch.nn.modules.module.__file__


def _phase_from_stack() -> str:
    """"backward", "optimizer", "forward" (inside a module's forward) or "" (elsewhere)."""
    if torch._C._current_graph_task_id() != -1:
        return "backward"
    frame = sys._getframe(1)
    in_module = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_OPTIM_DIR):
            return "optimizer"
        if filename == _MODULE_FILE and frame.f_code.co_name == "_call_impl":
            in_module = True
        frame = frame.f_back
    return "forward" if in_module else ""


def _in_fake_mode() -> bool:
    from torch._guards import active_fake_mode

    return active_fake_mode() is not None


def is_fake(t) -> bool:
    """Is ``t`` a fake tensor (made in full-scale mode: shape, dtype and bytes, no data)?"""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def is_fake_value_error(exc: BaseException) -> bool:
    """Did ``exc`` come from reading a fake tensor's value (``loss.item()``, ``float(x)``,
    ``if x:``)?  Fake tensors have no values; full-scale code must not read them."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    return isinstance(exc, DataDependentOutputException)


def _compiled_in(kind: str) -> bool:
    """Was this PyTorch built with the device kind (``"cuda"``, ``"mps"``, ``"xpu"``)?"""
    if kind == "cuda":
        # torch._C's flag, not torch.version.cuda: helpers.SimulatedCuda changes the latter
        return bool(getattr(torch._C, "_has_cuda", False))
    if kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        return mps is not None and mps.is_built()
    if kind == "xpu":
        xpu = getattr(torch, "xpu", None)
        return xpu is not None and bool(getattr(xpu, "_is_compiled", lambda: False)())
    return False


def fake_device_check(kind: str, name: str = "device", *, chosen: bool = False) -> None:
    """ValueError unless fake tensors can live on ``kind`` here: ``cpu`` and ``meta`` always,
    ``cuda``/``mps``/``xpu`` only on a PyTorch built with them (on other builds the first
    operation on such a fake tensor aborts the interpreter, killing a notebook's kernel)."""
    if kind in ("cpu", "meta") or _compiled_in(kind):
        return
    build = torch.__version__
    how = " (helpers.pick_device()'s choice: pass device='cpu')" if chosen else ""
    raise ValueError(
        f"{name}={kind!r}{how} in full-scale (fake tensor) mode needs a PyTorch built with "
        f"{kind.upper()} support, and this one ({build}) is not: its first operation on a "
        f"fake {kind} tensor would abort the Python interpreter. Use {name}='cpu': the "
        "tensors' shapes, dtypes and bytes are the same")


class full_scale:  # noqa: N801 - used like a function: ``with helpers.full_scale():``
    """Full-scale mode: tensors made inside are *fake* (exact shapes, dtypes and bytes, no data).

    Models, batches, forward and backward passes and optimizer steps run through PyTorch's
    ``FakeTensorMode``: memory is measured exactly without being allocated and nothing is
    computed, so a network that needs 60 GiB at batch 256 is measured on a laptop in seconds.
    Build the model *inside* the block (real tensors cannot mix with fake ones), and do not
    read values (``loss.item()``, printing numbers): there are none.

    Inside, new tensors are made on ``device`` (default: ``helpers.pick_device()``), so
    device-agnostic code works unchanged; ``model.to(device)`` is then a no-op, as it should
    be (PyTorch cannot move fake parameters between devices or dtypes: create the model
    where and as it will be used). A ``DataLoader`` (``num_workers=0``, no shuffling) over a
    data set that makes its samples when they are read works inside too.

    ``measure_step`` works inside; ``VirtualGPU(..., fake=True)`` combines both. Re-entering
    the same ``full_scale`` object continues with the same fake tensors.
    """

    def __init__(self, device=None):
        from torch._subclasses.fake_tensor import FakeTensorMode

        kind = device_type(device)  # validates
        fake_device_check(kind, "device", chosen=device is None)
        self.device = torch.device(kind) if device is None else torch.device(device)
        self.mode = FakeTensorMode()
        self._active = False
        self._device_ctx = None

    def __enter__(self):
        if self._active or _in_fake_mode():
            raise RuntimeError("already in full-scale (fake tensor) mode: do not nest it")
        self.mode.__enter__()
        self._device_ctx = torch.device(self.device)
        self._device_ctx.__enter__()
        _patch_module_to(+1)
        self._active = True
        return self

    def __exit__(self, *exc):
        if not self._active:  # a stray __exit__ must not undo another block's patches
            raise RuntimeError("this full_scale block is not active: __exit__ without "
                               "__enter__ (use `with helpers.full_scale(): ...`)")
        self._active = False
        _patch_module_to(-1)
        try:
            self._device_ctx.__exit__(*exc)
        finally:
            self.mode.__exit__(*exc)
        return False

    def __repr__(self) -> str:
        return f"full_scale(device={str(self.device)!r}, active={self._active})"


_ORIGINAL_APPLY = torch.nn.Module._apply
_patches = 0


def _module_apply(self, fn, *args, **kwargs):
    """``Module._apply`` (behind ``to``, ``cpu``, ``cuda``, ``float``...) that leaves the
    module untouched when ``fn`` changes no tensor: fake parameters cannot be swapped."""
    tensors = [*self.parameters(), *self.buffers()]
    if tensors and all(fn(t) is t for t in tensors):
        return self
    try:
        return _ORIGINAL_APPLY(self, fn, *args, **kwargs)
    except RuntimeError as exc:
        raise RuntimeError(
            f"{exc}. In full-scale mode, create the model where it will live, with the "
            "dtype it will have (tensors are made on the full-scale device): PyTorch cannot "
            "move or convert fake parameters."
        ) from exc


_LOADER_ITER = torch.utils.data.dataloader._BaseDataLoaderIter
_ORIGINAL_LOADER_INIT = _LOADER_ITER.__init__


def _loader_iter_init(self, loader, *args, **kwargs):
    """``DataLoader`` iterators draw their random seeds with ``.item()``, which fake tensors
    cannot answer: draw them as real numbers. Batches are then made (fake) as usual."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        _ORIGINAL_LOADER_INIT(self, loader, *args, **kwargs)


def _patch_module_to(delta: int) -> None:
    global _patches
    _patches += delta
    torch.nn.Module._apply = _module_apply if _patches > 0 else _ORIGINAL_APPLY
    _LOADER_ITER.__init__ = _loader_iter_init if _patches > 0 else _ORIGINAL_LOADER_INIT


class VirtualGPU(ShownAsTable):
    """A GPU of a given memory size, simulated exactly on this machine.

    Inside ``with VirtualGPU(...)``, every tensor storage created (and every one created
    before but used inside) counts towards the capacity; when a new one would not fit, a real
    ``torch.OutOfMemoryError`` with CUDA's message is raised, in the forward pass, the
    backward pass or the optimizer step alike. Storages are watched through weak references
    only: after the error is handled, nothing the virtual GPU counted stays referenced.

    How close it is to a real card: exact for the tensor storages of the operations it sees.
    It does not see kernels that exist only on CUDA (flash and memory-efficient attention
    save other tensors than the CPU's math path), CUDA's autocast op lists (the CPU's
    differ), NCCL's buffers, or, unless ``workspaces=True``, the cuBLAS and cuDNN workspaces;
    its out-of-memory error has CUDA's wording with simulated numbers. A real card shows
    more: workspaces, the real context, fragmentation (streams, expandable segments).

    Args:
        capacity: bytes, ``"48GB"``, ``"48 GiB"`` or a known card (``"L40S"``, ``"A100-80GB"``,
            ``"H100-80GB"``, ``"H200"``, ``"T4"``, ``"V100-16GB"``, ``"V100-32GB"``,
            ``"A100-40GB"``; see ``helpers.KNOWN_GPUS``). Cards have the capacity their
            driver reports (L40S: 46068 MiB). A real V100 cannot run torch 2.13's CUDA 13
            wheels (``helpers.memory.capacity.GPU_NOTES``); its memory can be simulated.
        rounding: simulate PyTorch's CUDA caching allocator: 512-byte blocks, 2 MiB and
            20 MiB segments, cached free blocks (``reserved_bytes`` > ``allocated_bytes``).
            Off (default): exact bytes, ``reserved_bytes == allocated_bytes``.
        context_bytes: memory the CUDA context takes before any tensor (typically 300-600 MiB
            on a real GPU; bytes or a size string such as ``"500 MiB"``). Default 0.
        fake: full-scale mode: tensors created inside are fake (see :class:`full_scale`):
            exact bytes, no memory, no compute.
        device: the kind of device whose tensors count (``"cpu"``, ``"cuda"``, ...). Default:
            the device ``helpers.pick_device()`` returns, so device-agnostic code counts the
            tensors it puts "on the GPU".
        index: the GPU number shown in messages ("GPU 0").
        workspaces: also charge what cuBLAS and cuDNN take through PyTorch's allocator on a
            real GPU (counted in ``allocated_bytes`` and ``reserved_bytes``, not in the
            context; see :mod:`helpers.memory.workspaces`): one cuBLAS workspace per thread,
            allocated by the first matrix product (``mm``, ``addmm``, ``bmm``...) and held
            (the backward pass has its own), and a transient allowance during each
            convolution. ``measure_step`` inside counts them as the category
            ``"workspace"``. Off (default): tensors only.
        cublas_workspace: the cuBLAS workspace in bytes or a size string (needs
            ``workspaces=True``). Default: from ``CUBLAS_WORKSPACE_CONFIG`` if set
            (``:SIZE:COUNT`` pairs in KiB, summed), else PyTorch's default for the card: 32
            MiB on H100/H200, ``:4096:2:16:8`` = 8,519,680 bytes on the others (and when the
            capacity is given as a size).
        cudnn_workspace: the allowance per convolution (needs ``workspaces=True``). Default:
            ``CUDNN_CONV_WSCAP_DBG`` (MiB, cuDNN's documented cap) if set, else 64 MiB. When
            it does not fit, the convolution runs without it, as PyTorch falls back to a
            cuDNN engine with less workspace (``cudnn_fallbacks`` counts these).

    Attributes (read them any time, also from another thread): ``name``, ``capacity_bytes``,
    ``context_bytes``, ``allocated_bytes``, ``reserved_bytes``, ``peak_allocated_bytes``,
    ``peak_reserved_bytes``, ``used_bytes`` (context + reserved: what nvidia-smi would show),
    ``free_bytes``, ``n_oom`` (errors raised so far).

    A ``VirtualGPU`` can be entered again later (memory still held stays counted); it cannot
    be nested in another one.
    """

    def __init__(self, capacity, *, rounding: bool = False, context_bytes=0,
                 fake: bool = False, device=None, index: int = 0, workspaces: bool = False,
                 cublas_workspace=None, cudnn_workspace=None):
        card, cap = resolve_capacity(capacity)
        self.capacity_bytes = cap
        self.name = card if card is not None else fmt_bytes(cap)
        self.context_bytes = resolve_capacity(context_bytes, what="context_bytes",
                                              allow_zero=True)[1]
        if self.context_bytes >= cap:
            raise ValueError(
                f"context_bytes ({fmt_bytes(self.context_bytes)}) must be smaller than the "
                f"capacity ({fmt_bytes(cap)})"
            )
        self.rounding = flag(rounding, "rounding")
        self.fake = flag(fake, "fake")
        self.index = whole_number(index, "index", 0, 1023)
        self.device_type = device_type(device)
        if self.fake:
            fake_device_check(self.device_type, chosen=device is None)
        limit = cap - self.context_bytes
        self._allocator = CachingAllocator(limit) if rounding else ExactAllocator(limit)
        self._engine = Engine(self._allocator, device_type=self.device_type,
                              on_oom=self._raise_oom)
        if flag(workspaces, "workspaces"):
            sizes = {}
            for name, value in (("cublas_workspace", cublas_workspace),
                                ("cudnn_workspace", cudnn_workspace)):
                sizes[name] = None if value is None else \
                    resolve_capacity(value, what=name, allow_zero=True)[1]
            self._engine.workspaces = Workspaces.resolve(
                compute_capability=COMPUTE_CAPABILITY.get(card),
                cublas=sizes["cublas_workspace"], cudnn=sizes["cudnn_workspace"])
        else:
            for name, value in (("cublas_workspace", cublas_workspace),
                                ("cudnn_workspace", cudnn_workspace)):
                if value is not None:
                    raise ValueError(f"{name} needs workspaces=True (got {name}={value!r} "
                                     "with workspaces=False)")
        self._full_scale = full_scale(self.device_type) if fake else None
        self._active = False

    # ------------------------------------------------------------------ state
    @property
    def allocated_bytes(self) -> int:
        """Bytes of live tensors (in 512-byte blocks with ``rounding=True``)."""
        return self._allocator.allocated_bytes

    @property
    def reserved_bytes(self) -> int:
        """Bytes the (simulated) caching allocator holds, cache included."""
        return self._allocator.reserved_bytes

    @property
    def peak_allocated_bytes(self) -> int:
        return self._allocator.peak_allocated_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        return self._allocator.peak_reserved_bytes

    @property
    def used_bytes(self) -> int:
        """What nvidia-smi would show as used: context + reserved."""
        return self.context_bytes + self._allocator.reserved_bytes

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    @property
    def n_oom(self) -> int:
        return self._allocator.n_oom

    @property
    def workspaces(self) -> Workspaces | None:
        """The workspace model (sizes, where they came from, what is held), or None when
        ``workspaces=False``."""
        return self._engine.workspaces

    @property
    def workspace_bytes(self) -> int:
        """Bytes of cuBLAS workspaces held now (0 with ``workspaces=False``)."""
        ws = self._engine.workspaces
        return 0 if ws is None else ws.held_bytes

    @property
    def cudnn_fallbacks(self) -> int:
        """Convolutions whose cuDNN allowance did not fit and ran without it."""
        ws = self._engine.workspaces
        return 0 if ws is None else ws.cudnn_fallbacks

    def clear_workspaces(self) -> int:
        """Free the cuBLAS workspaces held, as ``torch._C._cuda_clearCublasWorkspaces()``
        does on a GPU; the next matrix product allocates one again. Returns the bytes freed."""
        return self._engine.clear_workspaces()

    @property
    def live_tensor_bytes(self) -> int:
        """Exact bytes of live tensor storages (no rounding)."""
        return self._engine.live_bytes

    @property
    def active(self) -> bool:
        return self._active

    @property
    def engine(self) -> Engine:
        """The dispatch mode that counts this GPU's tensor storages (``measure_step`` records
        through it)."""
        return self._engine

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` like ``torch.cuda.mem_get_info()``."""
        return self.free_bytes, self.capacity_bytes

    def reset_peak(self) -> None:
        """Start the peaks afresh (``torch.cuda.reset_peak_memory_stats()``)."""
        self._engine.reset_peak()

    def empty_cache(self) -> None:
        """Release cached, unused segments (``torch.cuda.empty_cache()``)."""
        with self._engine.lock:
            self._allocator.empty_cache()

    def track(self, *objs) -> int:
        """Count tensors, modules or optimizers made outside now (as if moved to this GPU).

        Returns the bytes newly counted; raises ``torch.OutOfMemoryError`` if they do not fit.
        """
        return self._engine.adopt(objs)

    @contextlib.contextmanager
    def paused(self):
        """Run the block outside this virtual GPU: its counting (and, with ``fake=True``, its
        fake tensors) suspended, so tensors made inside are real, uncounted host tensors
        (e.g. a snapshot of the model to restore later).  Every dispatch mode active is
        suspended, and resumed after the block.  Outside the ``with`` block: does nothing."""
        if not self._active:
            yield
            return
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            yield

    # ------------------------------------------------------------------ context manager
    def __enter__(self):
        state._activate(self)
        try:
            if self._full_scale is not None:
                self._full_scale.__enter__()
            self._engine.__enter__()
        except BaseException:
            if self._full_scale is not None and self._full_scale._active:
                self._full_scale.__exit__(None, None, None)
            state._deactivate(self)
            raise
        self._active = True
        return self

    def __exit__(self, *exc):
        if not self._active:  # a stray __exit__ must not pop another block's modes
            raise RuntimeError(f"VirtualGPU {self.name} is not active: __exit__ without "
                               "__enter__ (use `with helpers.VirtualGPU(...): ...`)")
        self._active = False
        try:
            self._engine.__exit__(*exc)
        finally:
            try:
                if self._full_scale is not None:
                    self._full_scale.__exit__(*exc)
            finally:
                state._deactivate(self)
        return False

    # ------------------------------------------------------------------ OOM
    def _where(self, op) -> str:
        rec = self._engine.recorder
        phase = _phase_from_stack()
        module = rec.module() if rec is not None else ""
        phase = {"forward": "in the forward pass", "backward": "in the backward pass",
                 "optimizer": "in the optimizer step"}.get(phase, "")
        if op == "track":
            return "when tensors made outside were handed to it"
        name = f"aten.{op._overloadpacket.__name__}" if hasattr(op, "_overloadpacket") else op
        parts = [p for p in (phase, f"by {name}" if op is not None else "",
                             f"in {module}" if module else "") if p]
        return " ".join(parts)

    def _raise_oom(self, err: SimulatedOOM, op) -> None:
        a = self._allocator
        msg = oom_message(tried=err.alloc_size, capacity=self.capacity_bytes,
                          context=self.context_bytes, allocated=a.allocated_bytes,
                          reserved=a.reserved_bytes, device_index=self.index)
        where = self._where(op)
        msg += (f" [Virtual GPU {self.name} (helpers.VirtualGPU): simulated, no real GPU "
                f"memory was used{'; raised ' + where if where else ''}.]")
        raise torch.OutOfMemoryError(msg)

    # ------------------------------------------------------------------ display
    def summary(self) -> str:
        """One line: name, allocated/reserved of capacity, peak."""
        parts = [f"VirtualGPU {self.name}: {fmt_bytes(self.allocated_bytes)} allocated"]
        if self.rounding:
            parts.append(f"{fmt_bytes(self.reserved_bytes)} reserved")
        if self.context_bytes:
            parts.append(f"context {fmt_bytes(self.context_bytes)}")
        if self._engine.workspaces is not None:
            parts.append(f"cuBLAS workspaces {fmt_bytes(self.workspace_bytes)}")
        parts.append(f"of {fmt_bytes(self.capacity_bytes)}")
        text = ", ".join(parts[:-1]) + f" {parts[-1]}"
        text += f" (peak {fmt_bytes(self.peak_allocated_bytes)}"
        if self.rounding:
            text += f" allocated, {fmt_bytes(self.peak_reserved_bytes)} reserved"
        text += ")"
        if self.fake:
            text += ", fake tensors"
        return text

    text = summary  # shown as this line (ShownAsTable), and in notebooks with a usage bar

    def _html(self) -> str:
        import html

        share = self.used_bytes / self.capacity_bytes
        bar = (f"<div style='width:20em;height:0.8em;background:#eee;border:1px solid #999'>"
               f"<div style='width:{min(share, 1) * 100:.1f}%;height:100%;"
               f"background:{'#c44e52' if share > 0.9 else '#4c72b0'}'></div></div>")
        return f"<div><code>{html.escape(self.summary())}</code>{bar}</div>"
