"""The engine: a dispatch mode that sees every tensor storage appear and disappear.

Every ATen operation passes through :class:`Engine` (a ``TorchDispatchMode``).  After an
operation runs, each output tensor's *storage* (the memory block behind it and all its views)
is looked up; a new one is registered with the allocator (exact or CUDA-like, see
:mod:`.allocator`) and watched through a weak reference whose callback returns the bytes when
the storage is freed.  Nothing is kept alive by the engine: it holds weak references only.

Tensors that existed before the engine started are counted from the first operation that
uses them ("adopted"), or at once when handed over with :meth:`Engine.adopt`.

A :class:`Recorder` (``measure_step``) can listen to an engine: it gets every allocation and
free as an event and marks a point after every operation that allocated, with the operation,
the module running it and the phase (forward, backward, optimizer step).  Categories
(parameters, gradients, ...) are labels on each storage, decided while it lives and applied
to its whole life when the timeline is built (see :mod:`.report`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .allocator import ExactAllocator, SimulatedOOM
from .workspaces import CUBLAS_OPS, CUDNN_OPS

__all__ = ["Engine", "Recorder", "tensors_in", "optimizer_state_tensors", "unique_params",
           "watch_ops", "device_type"]

# a storage keeps the strongest label it was given
_RANK = {"temporaries": 0, "activations": 1, "other": 2, "inputs": 3, "buffers": 4,
         "optimizer_state": 5, "gradients": 6, "parameters": 7}

_VIEW, _MUTATE, _NEW, _FRESH = 0, 1, 2, 3
_FRESH_OPS = {"lift_fresh", "lift_fresh_copy"}


_KINDS: dict = {}  # OpOverload -> what it returns (shared: the answer never changes)


def _classify(func) -> int:
    """Does ``func`` return new storages (_NEW), alias-and-write (_MUTATE) or views (_VIEW)?"""
    try:
        returns = func._schema.returns
    except AttributeError:  # pragma: no cover - every OpOverload has a schema
        return _NEW
    if func._overloadpacket.__name__ in _FRESH_OPS:
        return _FRESH
    if not returns:
        return _NEW
    aliases = [r.alias_info for r in returns]
    if all(a is not None for a in aliases):
        return _MUTATE if any(a.is_write for a in aliases) else _VIEW
    return _NEW


_DEVICE_QUERY = torch.ops.prim.device.default
_IN_PLACE = set()
for _name in ("add_", "sub_", "mul_", "div_", "lerp_", "addcmul_", "addcdiv_", "relu_", "zero_",
              "fill_", "uniform_", "normal_", "clamp_min_", "clamp_"):
    _packet = getattr(torch.ops.aten, _name, None)
    if _packet is not None:
        _IN_PLACE.update(getattr(_packet, o) for o in _packet.overloads())

try:
    from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
except ImportError:  # pragma: no cover
    _FakeTensor = None


def _in_place_on_fake(args, kwargs) -> bool:
    """Can an elementwise in-place operation skip fake-tensor dispatch?  Only when it writes
    a fake tensor that carries no constant value, every other tensor argument is a fake tensor
    on the same device whose shape broadcasts to it and whose dtype is the same, and the
    written tensor is floating point (so a Python number cannot fail to cast).  Anything else
    goes through FakeTensorMode, which raises the errors a GPU would."""
    if _FakeTensor is None or any(isinstance(v, torch.Tensor) or k == "generator" and
                                  v is not None for k, v in kwargs.items()):
        return False
    self = args[0]
    if type(self) is not _FakeTensor or self.constant is not None \
            or not self.dtype.is_floating_point:
        return False
    shape, device, dtype = self.shape, self.fake_device, self.dtype
    for other in args[1:]:
        if isinstance(other, torch.Tensor):
            if type(other) is not _FakeTensor or other.fake_device != device \
                    or other.dtype != dtype or other.constant is not None:
                return False
            o = other.shape
            if len(o) > len(shape) or any(a != 1 and a != b for a, b in
                                          zip(o, shape[len(shape) - len(o):], strict=True)):
                return False
        elif not isinstance(other, (int, float, bool)) and other is not None:
            return False
    return True


def _kind(func) -> int:
    kind = _KINDS.get(func)
    if kind is None:
        kind = _KINDS[func] = _classify(func)
    return kind


class watch_ops(TorchDispatchMode):  # noqa: N801 - used like a function in a `with`
    """``with watch_ops(on_op):`` calls ``on_op(name, args, kwargs, out)`` after every ATen
    operation that runs inside, views left out (``trace_dtypes`` lists them with their
    dtypes); ``name`` is the operation's short name (``"mm"``, ``"_to_copy"``)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # see Engine

    def __init__(self, on_op):
        super().__init__()
        self.on_op = on_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _kind(func) != _VIEW:
            self.on_op(func._overloadpacket.__name__, args, kwargs, out)
        return out


def device_type(device, name: str = "device") -> str:
    """The kind of ``device`` (``"cpu"``, ``"cuda"``, ...; None: ``helpers.pick_device()``'s),
    whether or not this machine has one: TypeError for a non-device, ValueError for a
    malformed name."""
    if device is None:
        from ..core.environment import pick_device

        return pick_device().type
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name} must be None, a string such as 'cuda' or a torch.device, got "
                        f"{type(device).__name__}")
    try:
        return torch.device(device).type
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{name} {device!r} is not a torch device ({exc})") from None


def tensors_in(obj) -> Iterable[torch.Tensor]:
    """Tensors in nested lists/tuples/dicts, modules (params, buffers, grads), optimizers.

    Each container is visited once, so a list that contains itself ends (fuzz case 4)."""
    stack, seen = [obj], set()
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            yield x
            continue
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, nn.Module):
            for p in x.parameters():
                yield p
                if p.grad is not None:
                    yield p.grad
            yield from x.buffers()
        elif isinstance(x, torch.optim.Optimizer):
            stack.extend(optimizer_state_tensors(x))
            for group in x.param_groups:
                for p in group["params"]:
                    yield p
                    if p.grad is not None:
                        yield p.grad


def optimizer_state_tensors(optimizer) -> list[torch.Tensor]:
    out = []
    for state in optimizer.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return out


def unique_params(model, optimizers) -> list:
    """The model's parameters, then any others the optimizers hold, each once, in order."""
    seen, out = set(), []
    sources = [] if model is None else list(model.parameters())
    for opt in optimizers:
        for group in opt.param_groups:
            sources.extend(group["params"])
    for p in sources:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _storage(t: torch.Tensor):
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, no storage
        return None


class _Tracked:
    """One live storage: its bytes, allocator handle and category label."""

    __slots__ = ("key", "nbytes", "handle", "label", "ref", "__weakref__")

    def __init__(self, key: int, nbytes: int, handle, label: str):
        self.key = key
        self.nbytes = nbytes
        self.handle = handle
        self.label = label
        self.ref = None


class Engine(TorchDispatchMode):
    """Counts live tensor storages through an allocator; optionally raises OOM at a limit.

    Args:
        allocator: an :class:`~.allocator.ExactAllocator` or ``CachingAllocator`` (its
            ``limit`` decides when memory runs out).
        device_type: count only storages on this kind of device (``"cpu"``, ``"cuda"``, ...).
        on_oom: called as ``on_oom(error: SimulatedOOM, op_name: str)`` when the allocator
            refuses; it must raise (``VirtualGPU`` raises ``torch.OutOfMemoryError``).

    Three attributes serve the planner (:mod:`.planner`):

    * ``propagate`` (default False): count only what lives "on the device" as a GPU would
      have it: storages handed over with :meth:`adopt`, and the outputs of operations that read
      a counted storage. Host tensors (a DataLoader's batches, Adam's step counters) are never
      counted, even when an operation reads them.
    * ``on_new_peak``: called without arguments each time the live bytes reach a new peak.
    * ``on_alloc``: called without arguments after every storage it counts.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Not wrapping __torch_dispatch__ in torch._dynamo.disable saves importing
        # torch._dynamo (2-4 s and ~100 MB, on first use) and a wrapper call per operation.
        # The engine is not meant to run under torch.compile.
        return False

    def __init__(self, allocator=None, *, device_type: str = "cpu", on_oom=None):
        super().__init__()
        self.allocator = allocator if allocator is not None else ExactAllocator(None)
        self.device_type = device_type
        self.on_oom = on_oom
        self.live: dict[int, _Tracked] = {}
        self.live_bytes = 0
        self.peak_live_bytes = 0
        self.recorder: Recorder | None = None
        self.lock = threading.RLock()
        self._pending: SimulatedOOM | None = None
        self.current_op = None
        # a ``workspaces.Workspaces`` to charge cuBLAS/cuDNN workspaces (VirtualGPU's
        # ``workspaces=True``); None (the default) charges nothing and changes nothing
        self.workspaces = None
        self.propagate = False
        self.on_new_peak = None
        self.on_alloc = None

    # ------------------------------------------------------------------ bookkeeping
    def _register(self, st, label: str) -> _Tracked | None:
        """Count a new storage; None (and ``self._pending`` set) when it does not fit."""
        nbytes = st.nbytes()
        key = id(st)
        with self.lock:
            try:
                handle = self.allocator.malloc(nbytes)
            except SimulatedOOM as err:
                self._pending = err
                return None
            rec = _Tracked(key, nbytes, handle, label)
            rec.ref = weakref.ref(st, _make_callback(self, rec))
            self.live[key] = rec
            self.live_bytes += nbytes
            new_peak = self.live_bytes > self.peak_live_bytes
            if new_peak:
                self.peak_live_bytes = self.live_bytes
            if self.recorder is not None:
                self.recorder.on_alloc(rec)
        if new_peak and self.on_new_peak is not None:
            self.on_new_peak()
        if self.on_alloc is not None:
            self.on_alloc()
        return rec

    def _free(self, rec: _Tracked) -> None:
        with self.lock:
            if self.live.get(rec.key) is not rec:
                return
            del self.live[rec.key]
            self.allocator.free(rec.handle)
            self.live_bytes -= rec.nbytes
            if self.recorder is not None:
                self.recorder.on_free(rec)

    def _resize(self, rec: _Tracked, st) -> None:
        nbytes = st.nbytes()
        with self.lock:
            self.allocator.free(rec.handle)
            self.live_bytes -= rec.nbytes
            if self.recorder is not None:
                self.recorder.on_free(rec)
            try:
                rec.handle = self.allocator.malloc(nbytes)
            except SimulatedOOM as err:
                rec.handle, rec.nbytes = None, 0
                self._pending = err
                return
            rec.nbytes = nbytes
            self.live_bytes += nbytes
            self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
            if self.recorder is not None:
                self.recorder.on_alloc(rec)

    def lookup(self, t: torch.Tensor) -> _Tracked | None:
        st = _storage(t)
        return None if st is None else self.live.get(id(st))

    def adopt(self, objs, label: str = "inputs", op: str = "track") -> int:
        """Count the storages of tensors (or modules, optimizers, nested containers) now.

        Storages already counted are relabelled (a label only ever gets stronger). Returns the
        bytes newly counted. ``op`` names the call in an out-of-memory message (default: tensors
        made outside handed to the engine).
        """
        added = 0
        self.current_op = op
        for t in tensors_in(objs):
            if t.device.type != self.device_type:
                continue
            st = _storage(t)
            if st is None:
                continue
            rec = self.live.get(id(st))
            if rec is None:
                rec = self._register(st, label)
                if rec is None:
                    st = t = None
                    self._fail()
                added += rec.nbytes
            elif _RANK[label] > _RANK[rec.label]:
                rec.label = label
        return added

    def relabel(self, tensors, label: str, *, force: bool = False) -> None:
        for t in tensors_in(tensors):
            rec = self.lookup(t)
            if rec is not None and (force or _RANK[label] > _RANK[rec.label]):
                rec.label = label

    def reset_peak(self) -> None:
        with self.lock:
            self.peak_live_bytes = self.live_bytes
            self.allocator.reset_peak()

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _DEVICE_QUERY:  # tensor.device from C++ (autograd asks it constantly)
            return func(*args, **kwargs)
        kind = _kind(func)
        if kind == _VIEW:
            return func(*args, **kwargs)
        # an elementwise in-place operation on fake tensors: no storage appears, grows or
        # goes, and a fake tensor has no values to write (see _in_place_on_fake)
        skip = kind == _MUTATE and func in _IN_PLACE and _in_place_on_fake(args, kwargs)
        self.current_op = func
        recorder = self.recorder
        if recorder is not None and recorder.in_optimizer:
            recorder.optimizer_args(args)
        # lift_fresh's input is the constant it makes: not an input
        read_counted = kind != _FRESH and self._scan_inputs(args, kwargs, recorder)
        if self._pending is not None:
            args = kwargs = None
            self._fail()
        out = args[0] if skip else func(*args, **kwargs)
        n_points = len(recorder.points) if recorder is not None else 0
        if read_counted or not self.propagate:
            self._track_outputs(func, kind, out, recorder)
        # else (propagate): an operation on host tensors only, whose outputs stay on the host
        if self.workspaces is not None and self._pending is None:
            # after the outputs, as PyTorch's kernels do
            self._charge_workspaces(func, recorder, n_points)
        if self._pending is not None:
            # out of memory: this frame must not keep the outputs alive (the traceback holds
            # it), so drop them before raising; their storages are freed right here
            out = args = kwargs = None
            self._fail()
        return out

    def _charge_workspaces(self, func, recorder=None, n_points: int = 0) -> None:
        """cuBLAS: the first matrix product on a thread allocates that thread's workspace,
        held afterwards (autograd's backward runs on a device thread of its own on a GPU: a
        second one). cuDNN: a convolution takes its allowance for the call and frees it; an
        allowance that does not fit is skipped (PyTorch tries an engine with less workspace),
        counted in ``workspaces.cudnn_fallbacks``. See :mod:`.workspaces`.

        A recorder (``measure_step``) is told of each charge while it is held, so that its
        point for the operation (made after the outputs; ``n_points`` points existed before
        them) counts the workspace too."""
        ws = self.workspaces
        name = func._overloadpacket.__name__
        if name in CUBLAS_OPS:
            key = ("backward" if torch._C._current_graph_task_id() != -1
                   else f"thread {threading.get_ident()}")
            if key in ws.held:
                return
            with self.lock:
                try:
                    ws.held[key] = self.allocator.malloc(ws.cublas_bytes)
                except SimulatedOOM as err:
                    self._pending = err
                    return
                if recorder is not None:
                    recorder.on_workspace(func, 0, len(recorder.points) > n_points)
        elif name in CUDNN_OPS and ws.cudnn_bytes > 0:
            with self.lock:
                try:
                    handle = self.allocator.malloc(ws.cudnn_bytes, quiet=True)
                except SimulatedOOM:
                    ws.cudnn_fallbacks += 1
                    return
                if recorder is not None:
                    recorder.on_workspace(func, ws.cudnn_bytes, len(recorder.points) > n_points)
                self.allocator.free(handle)

    def clear_workspaces(self) -> int:
        """Free the cuBLAS workspaces held (``torch._C._cuda_clearCublasWorkspaces()``);
        returns the bytes freed."""
        ws = self.workspaces
        if ws is None:
            return 0
        with self.lock:
            freed = ws.held_bytes
            for handle in ws.held.values():
                self.allocator.free(handle)
            ws.held.clear()
            if freed and self.recorder is not None:
                self.recorder.dirty = True  # the next allocation marks the drop first
        return freed

    def _fail(self) -> None:
        err, self._pending = self._pending, None
        err.__traceback__ = None  # its frames (the allocation's) hold the step's tensors
        if self.recorder is not None:
            self.recorder.on_oom(err)
        if self.on_oom is not None:
            self.on_oom(err, self.current_op)
        raise err

    def _on_device(self, tensors: list) -> list:
        """``(tensor, storage)`` of each tensor on the counted device that has a storage."""
        out = []
        for t in tensors:
            if t.device.type == self.device_type:
                st = _storage(t)
                if st is not None:
                    out.append((t, st))
        return out

    def _track_outputs(self, func, kind, out, recorder) -> None:
        if kind == _MUTATE:
            changed = False
            for _, st in self._on_device(_flat_tensors(out)):
                rec = self.live.get(id(st))
                if rec is None or rec.nbytes != st.nbytes():
                    if recorder is not None:
                        recorder.before_alloc(func)
                    if rec is None:
                        self._register(st, "inputs")
                    else:
                        self._resize(rec, st)
                    changed = True
                if self._pending is not None:
                    return
            if changed and recorder is not None:
                recorder.mark(func)
            return
        allocated = False
        label = None
        for _, st in self._on_device(_flat_tensors(out)):
            if id(st) in self.live:
                continue
            if label is None:
                label = recorder.new_label() if recorder is not None else "temporaries"
                if recorder is not None:
                    recorder.before_alloc(func)
            if self._register(st, label) is None:
                return
            allocated = True
        if allocated and recorder is not None:
            recorder.mark(func)

    def _scan_inputs(self, args, kwargs, recorder) -> bool:
        """Count the inputs not counted yet (with ``propagate``: leave them uncounted, as
        host tensors); True when an input was already counted."""
        read_counted = False
        for t, st in self._on_device(_flat_tensors(args, kwargs) if kwargs
                                     else _flat_tensors(args)):
            rec = self.live.get(id(st))
            if rec is None:
                if self.propagate:
                    continue
                label = "parameters" if _is_param(t) else "inputs"
                if recorder is not None:
                    recorder.before_alloc(self.current_op)
                if self._register(st, label) is None:
                    return read_counted
            else:
                read_counted = True
                if rec.label != "parameters" and t.is_leaf and _is_param(t):
                    rec.label = "parameters"
        return read_counted


def _make_callback(engine: Engine, rec: _Tracked):
    engine_ref = weakref.ref(engine)
    rec_ref = weakref.ref(rec)

    def on_storage_freed(_):
        eng, r = engine_ref(), rec_ref()
        if eng is not None and r is not None:
            eng._free(r)

    return on_storage_freed


_Tensor = torch.Tensor


def _flat_tensors(*objs) -> list:
    """Tensors in (nested lists/tuples/dicts of) arguments or outputs, in no fixed order."""
    out = []
    stack = list(objs)
    while stack:
        x = stack.pop()
        if isinstance(x, _Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            if x:
                stack.extend(x)
        elif isinstance(x, dict):
            if x:
                stack.extend(x.values())
    return out


def _is_param(t) -> bool:
    # nn.Parameter's isinstance goes through a slow metaclass check
    return type(t) is nn.Parameter or getattr(t, "_is_param", False)


# ---------------------------------------------------------------------------- recorder
class _Point:
    __slots__ = ("n_events", "op", "module", "phase", "step", "live", "allocated", "reserved",
                 "workspace")

    def __init__(self, n_events, op, module, phase, step, live, allocated, reserved,
                 workspace=0):
        self.n_events = n_events
        self.op = op
        self.module = module
        self.phase = phase
        self.step = step
        self.live = live
        self.allocated = allocated
        self.reserved = reserved
        self.workspace = workspace  # cuBLAS workspaces held + a convolution's cuDNN allowance


_TAG = "helpers.memory.module"


class _Modules:
    """Which module an operation belongs to, without keeping anything alive.

    Forward: a stack of the modules whose ``forward`` is running. Backward: each autograd
    node made inside a module's forward is tagged with the module's name in its
    ``metadata`` when that forward returns, and ``torch._C._current_autograd_node()`` tells
    which node is running.
    """

    def __init__(self, model):
        self.names: dict = {}
        if model is not None:
            root = type(model).__name__
            for name, mod in model.named_modules():
                self.names[mod] = f"{root}.{name}" if name else root
        self.stack: list = []
        self.last_backward = ""

    def name_of(self, module) -> str:
        name = self.names.get(module)
        if name is None:
            name = self.names[module] = type(module).__name__
        return name

    def push(self, module, args) -> None:
        inputs = set()
        if torch.is_grad_enabled():
            for t in _flat_tensors(args):
                if t.grad_fn is not None:
                    inputs.add(t.grad_fn)
        self.stack.append((self.name_of(module), inputs))

    def pop(self, output) -> None:
        if not self.stack:
            return
        name, inputs = self.stack.pop()
        if output is None or not torch.is_grad_enabled():
            return
        frontier = [t.grad_fn for t in _flat_tensors(output) if t.grad_fn is not None]
        while frontier:
            node = frontier.pop()
            if node is None or node in inputs:
                continue
            meta = node.metadata
            if _TAG in meta:
                continue
            meta[_TAG] = name
            frontier.extend(fn for fn, _ in node.next_functions if fn is not None)

    def current(self) -> str:
        if self.stack:
            return self.stack[-1][0]
        if torch._C._current_graph_task_id() != -1:
            node = torch._C._current_autograd_node()
            name = node.metadata.get(_TAG) if node is not None else None
            if name:
                self.last_backward = name
            return self.last_backward
        return ""


class Recorder:
    """Listens to an engine during ``measure_step``: events, points, phases and modules."""

    def __init__(self, engine: Engine, *, model=None, track_modules: bool = True):
        self.engine = engine
        self.model = model
        self.events: list[tuple[_Tracked, int]] = []
        self.points: list[_Point] = []
        self.baseline: list[_Tracked] = []
        self.step = 0
        self.in_optimizer = False
        self.outer_phase = "forward"
        self.dirty = False
        self.last_phase = None
        self.recomputing = False
        self.oom = None
        self._born_forward: list[weakref.ref] = []
        self._born_recompute: list[weakref.ref] = []
        self._hooks: list = []
        self._modules = _Modules(model) if track_modules else None
        self._params: list = []
        self._optimizers: list = []
        self._param_names: dict = {}
        self._names_by_storage: dict = {}
        self._opt_current = ""
        if model is not None:
            root = type(model).__name__
            self._param_names = {p: f"{root}.{n}" for n, p in model.named_parameters()}

    # --------------------------------------------------------------- life cycle
    def start(self, params: list[torch.Tensor], optimizers: list) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self._params = params
        self._optimizers = optimizers
        self._hooks.append(register_optimizer_step_pre_hook(self._opt_pre))
        self._hooks.append(register_optimizer_step_post_hook(self._opt_post))
        self._hooks.append(register_module_forward_pre_hook(self._fw_pre))
        self._hooks.append(register_module_forward_hook(self._fw_post, always_call=True))
        for p in params:
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        self.engine.recorder = self

    def stop(self) -> None:
        if self.engine.recorder is self:
            self.engine.recorder = None
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def begin_step(self, step: int) -> None:
        self.step = step
        self.in_optimizer = False
        self.outer_phase = "forward"
        self.last_phase = None
        self.recomputing = False
        self._born_forward.clear()
        self._born_recompute.clear()
        if self._modules is not None:
            self._modules.stack.clear()
        self.mark("start")

    def end_step(self) -> None:
        self._sweep(self._born_forward)
        self._sweep(self._born_recompute)
        self.relabel_state()
        self.mark("end")

    def relabel_state(self) -> None:
        eng = self.engine
        grads = [p.grad for p in self._params if p.grad is not None]
        for opt in self._optimizers:
            for group in opt.param_groups:
                grads.extend(p.grad for p in group["params"] if p.grad is not None)
            eng.relabel(optimizer_state_tensors(opt), "optimizer_state")
        eng.relabel(grads, "gradients")

    # --------------------------------------------------------------- hooks
    def _opt_pre(self, optimizer, args, kwargs):
        self.relabel_state()
        self.in_optimizer = True
        self._opt_current = ""
        names = self._param_names
        by_storage = self._names_by_storage = {}
        for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"]):
            name = names.get(p) or f"parameter {i}"
            tensors = [p, p.grad, *optimizer.state.get(p, {}).values()]
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    st = _storage(t)
                    if st is not None:
                        by_storage[id(st)] = name
        # a point, so that the phase shows even when the step allocates nothing (SGD)
        self.mark(f"{type(optimizer).__name__}.step")

    def optimizer_args(self, args) -> None:
        """Which parameter the optimizer is updating (sticky; "all" for foreach lists)."""
        by_storage = self._names_by_storage
        for a in args:
            if isinstance(a, (list, tuple)) and len(a) > 1 and \
                    isinstance(a[0], torch.Tensor):
                self._opt_current = "all parameters (foreach)"
                return
            if isinstance(a, torch.Tensor):
                st = _storage(a)
                name = by_storage.get(id(st)) if st is not None else None
                if name:
                    self._opt_current = name
                    return

    def _opt_post(self, optimizer, args, kwargs):
        self.engine.relabel(optimizer_state_tensors(optimizer), "optimizer_state")
        self.in_optimizer = False
        self.outer_phase = "other"

    def _fw_pre(self, module, args):
        # a top-level module call outside backward and the optimizer starts a forward pass
        if torch._C._current_graph_task_id() == -1 and not self.in_optimizer and \
                not self._stack_depth():
            self.outer_phase = "forward"
        if self._modules is not None:
            self._modules.push(module, args)

    def _fw_post(self, module, args, output):
        if self._modules is not None:
            self._modules.pop(output)
        if module is self.model and torch._C._current_graph_task_id() == -1 \
                and torch.is_grad_enabled():
            self._sweep(self._born_forward)  # the model's forward is done

    def _stack_depth(self) -> int:
        return len(self._modules.stack) if self._modules is not None else 0

    def _grad_ready(self, param):
        if param.grad is not None:
            self.engine.relabel(param.grad, "gradients")

    def _sweep(self, born: list) -> None:
        """Storages born in a forward (or recomputation) and still alive are activations."""
        live = self.engine.live
        for ref in born:
            rec = ref()
            if rec is not None and rec.label == "temporaries" and live.get(rec.key) is rec:
                rec.label = "activations"
        born.clear()

    # --------------------------------------------------------------- engine callbacks
    def phase(self) -> str:
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        if self.in_optimizer:
            return "optimizer"
        return self.outer_phase

    def new_label(self) -> str:
        """Label for storages an operation is about to create (called once per operation)."""
        if torch._C._current_graph_task_id() != -1:
            if self.last_phase != "backward":
                self._enter_backward()
            top = torch._C._autograd._top_saved_tensors_default_hooks(False)
            recomputing = top is not None and \
                "_recomputation_hook" in getattr(top[0], "__qualname__", "")
            if self.recomputing and not recomputing:
                self._sweep(self._born_recompute)  # what the recomputation kept
            self.recomputing = recomputing
        return "temporaries"

    def _enter_backward(self) -> None:
        self._sweep(self._born_forward)
        self.outer_phase = "other"

    def on_alloc(self, rec: _Tracked) -> None:
        self.events.append((rec, rec.nbytes))
        phase = self.phase()
        if phase == "forward":
            self._born_forward.append(weakref.ref(rec))
        elif phase == "backward" and self.recomputing:
            self._born_recompute.append(weakref.ref(rec))

    def on_free(self, rec: _Tracked) -> None:
        self.events.append((rec, -rec.nbytes))
        self.dirty = True

    def on_oom(self, err: SimulatedOOM) -> None:
        # keep numbers, never the error: its traceback's frames hold the failed step's
        # tensors, and the recorder lives on in a reference cycle until gc (fuzz case 2)
        self.oom = (err.alloc_size, self.phase(), self.module(), self.engine.current_op)

    def module(self) -> str:
        if self.in_optimizer:
            return self._opt_current
        return self._modules.current() if self._modules is not None else ""

    def before_alloc(self, func) -> None:
        if self.dirty:
            self.mark(func)

    def mark(self, what) -> None:
        """A point on the timeline after ``what`` (an operation, or a label such as
        ``"start"``)."""
        self.dirty = False
        phase = self.phase()
        if phase == "backward" and self.last_phase != "backward":
            self._enter_backward()
        self.last_phase = phase
        eng = self.engine
        op = what if isinstance(what, str) else _op_name(what)
        ws = eng.workspaces
        self.points.append(_Point(
            len(self.events), op, self.module(), phase, self.step, eng.live_bytes,
            eng.allocator.allocated_bytes, eng.allocator.reserved_bytes,
            0 if ws is None else ws.held_bytes,
        ))

    def on_workspace(self, func, transient: int, marked: bool) -> None:
        """The engine charged a workspace for ``func`` (a cuBLAS workspace now held, or a
        convolution's ``transient`` cuDNN allowance, about to be freed): the operation's
        point (``marked``: made after its outputs; else one is made now) counts it, and the
        allocator's figures while it is held."""
        if not marked:
            self.mark(func)
        point, eng = self.points[-1], self.engine
        point.workspace = eng.workspaces.held_bytes + transient
        point.allocated = eng.allocator.allocated_bytes
        point.reserved = eng.allocator.reserved_bytes


def _op_name(func) -> str:
    try:
        name = func._overloadpacket.__name__
    except AttributeError:
        name = str(func)
    if torch._C._current_graph_task_id() != -1:
        node = torch._C._current_autograd_node()
        if node is not None:
            return f"{name} ({node.name().replace('torch::autograd::', '')})"
    return name
