"""Plan a GPU job from an unmodified PyTorch training script: ``python -m helpers.fit``.

::

    plan = helpers.will_it_fit("train.py", ["--batch-size", "256"], gpu="A100-40GB")
    plan                    # peak by category, the script's line at the peak, every card
    plan.slurm()            # a request for the smallest card that fits

How it works (the "device-scoped full scale" of the kit's memory engine):

* The script runs as ``__main__`` (``runpy``), with its own arguments, in a process of its
  own (:mod:`.sandbox`: forked from a planner server the caller starts once), never in the
  caller's: what it does to its process (default device, signal handlers, ``sys.stdout``,
  threads, subprocesses) ends with that process, and its output is relayed as it comes.
  Its writes (``open(..., "w")``, ``os.replace``, ``shutil.rmtree``...) go to a throw-away
  folder and are listed in the notes; ``os.fork``/``multiprocessing``/``mp.spawn`` are
  refused (plan one process; ``ddp=N`` for N ranks); its folder is first on ``sys.path``.
* ``torch.cuda`` answers as the chosen card (:class:`~.cuda_standin.SimulatedCuda` backed by a
  :class:`~.virtual.VirtualGPU`), and so do ``torch.accelerator``'s functions.
* What the script puts on the GPU (``.cuda()``, ``.to("cuda")``, ``device="cuda"``, a
  module's ``.to(device)``) becomes a *fake* tensor: exact shape, dtype and bytes, no data, no
  compute. Operations on fake tensors make fake tensors, which the engine counts as GPU
  memory (``Engine.propagate``). Host tensors (the DataLoader's batches, Adam's step
  counters) stay real and are not counted, as on a real GPU.
* A module's move keeps its Parameter objects, as on a GPU (``torch.utils.swap_tensors``
  where CUDA's ``Module._apply`` sets ``param.data``): tied weights stay tied, an optimizer
  built before ``.cuda()`` keeps its parameters, ``.cuda().half()`` and repeated moves work.
  Tensors on the card answer ``.device`` (``cuda:0``), ``.is_cuda`` and ``.get_device()`` as
  on a GPU, so ``torch.zeros(n, device=x.device)`` is made on the card;
  ``torch.set_default_device("cuda")`` and ``with torch.device("cuda"):`` put tensors made
  without ``device=`` on the card. ``nn.DataParallel`` over the one card runs its module.
* ``torch.autocast("cuda")`` runs as CPU autocast with the same dtype, and the ops whose
  type CUDA's autocast sets otherwise (its float32 list: GroupNorm, LayerNorm, the losses,
  softmax...; its "promote" list; ``einsum`` and the other ops only CUDA casts down) run as
  on CUDA, so their bytes are in the peak; ``GradScaler("cuda")`` works; Adam and gradient
  clipping take their ``foreach`` paths, as on CUDA.
* Where CUDA's kernels keep other memory than the CPU's (:mod:`.cuda_dispatch`), fake runs
  take CUDA's: ``scaled_dot_product_attention`` (also in ``nn.MultiheadAttention``) runs
  the backend CUDA would pick for the chosen card (cuDNN, flash, memory-efficient or math,
  by PyTorch's sdp_utils.cpp rules) with that backend's own op, so no L x L matrix is kept
  where CUDA keeps none; ``nn.LSTM``/``GRU``/``RNN`` keep a lower bound of cuDNN's reserve
  space until backward. The plan lists each call and the model used (``Plan.dispatch``).
* Values read from GPU tensors (``loss.item()``, ``print(loss)``, ``if torch.isnan(loss)``)
  get stand-in values (1.0 or 1 for a number, ``False`` for a truth value but ``True`` for
  ``isfinite``, zeros for a tensor copied to the host), and each file and line that asked is
  listed (``strict=True`` stops at the first one). ``torch.save`` is skipped
  and listed; DataLoaders run with ``num_workers=0`` and without pinned memory.
* The run stops cleanly when every optimizer the script made has taken ``steps`` steps
  (default 2: Adam's state exists from the first step, so the second is the steady state; a
  GAN's generator and discriminator both get theirs). An optimizer that does not step
  within ``max_forwards`` forward passes of the others' last step is not waited for.

It measures once, with no limit, and judges every card in ``KNOWN_GPUS`` on the caching
allocator's peak *reserved* bytes + the context (+ DDP's buckets), with a margin (default
max(15 %, 2 GiB) of the card): "fits", "fits, inside the margin" or "out of memory";
it re-runs the script only for the batch-size search (``batch_arg``) and for each fix
(``amp``, ``checkpoint_every``).

What it cannot see (say so, and leave a margin): cuDNN/cuBLAS workspaces, the CUDA context
(a fixed ``context`` allowance is added, 500 MiB by default), other processes on the card,
fragmentation over a long run, cuDNN's exact RNN reserve size (a lower bound is counted),
custom CUDA kernels (flash-attn, apex, Triton), and NCCL's buffers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import linecache
import math
import os
import re
import runpy
import signal
import sys
import threading
import time
import traceback
import weakref

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _device as _default_device

from ..core.checks import choice, flag, positive_int, real_number, text, whole_number
from ..core.fmt import GiB, MiB, ShownAsTable, Table, fmt_bytes
from . import cuda_dispatch, sandbox
from .capacity import COMPUTE_CAPABILITY, KNOWN_GPUS, card_name, resolve_capacity
from .cuda_standin import SimulatedCuda
from .sources import ProcessRamSource
from .virtual import VirtualGPU, foreach_patches

__all__ = ["will_it_fit", "Plan", "PlanError", "CardFit", "CodeLine", "StandIn",
           "DEFAULT_CONTEXT", "CUDA_FP32_OPS"]

#: what the CUDA context and the kernels' modules take on a card before any tensor (typical
#: for PyTorch on an A100/H100; measure ``nvidia-smi`` after ``torch.zeros(1).cuda()``)
DEFAULT_CONTEXT = 500 * MiB

#: the margin a card keeps free by default, the lessons' rule: max(15 % of the card, 2 GiB)
DEFAULT_MARGIN = (0.15, 2 * GiB)

#: ``--constraint`` feature names in ``plan.slurm()`` (SITE: clusters name features their own
#: way; these tell the memory sizes apart where one GPU comes in two)
SLURM_FEATURES = {"T4": "t4", "V100-16GB": "v100_16gb", "V100-32GB": "v100_32gb",
                  "A100-40GB": "a100_40gb", "L40S": "l40s", "H100-80GB": "h100_80gb",
                  "A100-80GB": "a100_80gb", "H200": "h200"}

#: host memory a CUDA process holds beyond what the planner measures on a CPU: the CUDA
#: runtime, cuBLAS and cuDNN loaded and initialised. An allowance for ``--mem``, not measured
#: here (no GPU): reports put it at 1.2 GB of RSS added by the first CUDA use
#: (pytorch/pytorch#106511, torch 2.0) and 1.1 GB at the first ``.to("cuda")`` + 0.6 GB at
#: the first cuDNN convolution (pytorch/pytorch#12873); 2 GiB covers both
CUDA_HOST_BYTES = 2 * GiB

#: host memory per DataLoader worker, an allowance for ``--mem``: a worker is a forked copy
#: of the main process, and only the pages it writes are its own. Measured on this kit's CPU
#: machine: 47 MiB of its own (USS; RSS 219 MiB, mostly shared) for a synthetic image data
#: set; workers that decode images or touch Python objects of a large data set (copy-on-read
#: of reference counts) own much more: 512 MiB each
WORKER_HOST_BYTES = 512 * MiB

#: ops that CUDA autocast runs in float32 (PyTorch's AMP docs: "CUDA Ops that can autocast to
#: float32"); the plan runs them so (:mod:`.cuda_dispatch`)
CUDA_FP32_OPS = cuda_dispatch.CUDA_FP32_OPS | cuda_dispatch.CUDA_FP32_OUT_OPS

_HELPERS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OVERRIDES_FILE = torch.overrides.__file__
#: code that asks a fake tensor's device for the planner or for fake-tensor propagation
_INTERNAL_CODE = (_HELPERS_DIR, *(os.path.join(_TORCH_DIR, p) for p in (
    "_subclasses", "_meta_registrations.py", "_decomp", "_refs", "_prims", "_ops.py",
    "fx", "utils/_python_dispatch.py", "_library", "_higher_order_ops")))
_T = torch.Tensor
_READS = {_T.item: "item()", _T.tolist: "tolist()", _T.__bool__: "bool()",
          _T.__float__: "float()", _T.__int__: "int()", _T.__index__: "index",
          _T.numpy: "numpy()", _T.__format__: "format", _T.__repr__: "print/repr",
          _T.__array__: "numpy array", _T.cpu: "cpu()"}
_LOW = (torch.bfloat16, torch.float16)
_CUDA0 = torch.device("cuda", 0)
#: what a tensor on the card answers, as on a GPU (the TorchFunctionMode sees the property
#: getters); FakeTensor's own ``device`` property is patched (:meth:`_Patches._patch_fake_device`)
_DEVICE_ANSWERS = {_T.device.__get__: _CUDA0, _T.is_cuda.__get__: True,
                   _T.is_cpu.__get__: False, _T.get_device: 0}
_MAX_TIME_LIMIT = 7 * 24 * 3600.0  # a week: SIGALRM's timer and the caller's clock stay finite


class PlanError(ValueError):
    """The script could not be planned: the message says why, and where in the script."""

    def __init__(self, message: str, *, kind: str = "error", details: str = ""):
        super().__init__(message)
        self.kind = kind
        self.details = details


class _Stop(BaseException):  # noqa: N818 - not an error: ends the script's run cleanly
    """Raised inside the script to end its run (a BaseException, so that the script's own
    ``except Exception`` does not catch it)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class CodeLine:
    """A line of the user's code: file, line number and its text."""

    file: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{_short(self.file)}:{self.line}: {self.code}"


@dataclasses.dataclass
class StandIn:
    """A value the script read from a GPU tensor, answered with a stand-in."""

    what: str
    where: CodeLine
    value: object
    count: int = 1


@dataclasses.dataclass
class CardFit:
    """One card against the measured peak.

    ``needed_bytes`` is the verdict's basis: the caching allocator's peak *reserved* bytes +
    the context (+ DDP's buckets); ``needed_allocated_bytes`` is the same with allocated
    bytes (what ``torch.cuda.max_memory_allocated()`` reports), shown beside it. ``fits``:
    needed <= capacity; ``fits_with_margin``: needed + ``margin_bytes`` <= capacity.
    ``largest_batch`` fits, ``recommended_batch`` fits with the margin."""

    card: str
    capacity_bytes: int
    needed_bytes: int
    fits: bool
    drivable: bool
    oom_at: CodeLine | None = None
    oom_phase: str = ""
    largest_batch: int | None = None
    batch_capped: bool = False  # the largest batch searched (max_batch) fits: maybe more
    needed_allocated_bytes: int = 0
    margin_bytes: int = 0
    recommended_batch: int | None = None

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.needed_bytes

    @property
    def share(self) -> float:
        return self.needed_bytes / self.capacity_bytes

    @property
    def fits_with_margin(self) -> bool:
        return self.needed_bytes + self.margin_bytes <= self.capacity_bytes

    @property
    def verdict(self) -> str:
        """"fits", "fits, inside the margin" (less headroom than the margin) or "out of
        memory"."""
        if not self.fits:
            return "out of memory"
        return "fits" if self.fits_with_margin else "fits, inside the margin"


def _short(path: str) -> str:
    """The path relative to the working folder when that is short (at most two levels up)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    ups = 0
    for part in rel.split(os.sep):
        if part != "..":
            break
        ups += 1
    return rel if ups <= 2 else path


def _is_ordinal(device) -> bool:
    return isinstance(device, int) and not isinstance(device, bool)


def _ordinals_named(args, kwargs) -> tuple[list, dict]:
    """``.to()`` arguments with each bare CUDA ordinal (``0``, ``device=1``) written as
    ``"cuda:N"``: torch's argument parser would ask the (absent) accelerator for it."""
    return ([f"cuda:{a}" if _is_ordinal(a) else a for a in args],
            {k: f"cuda:{v}" if k == "device" and _is_ordinal(v) else v
             for k, v in kwargs.items()})


def _device_kind(device) -> str | None:
    """The device type a ``.to()``/``device=`` argument names ("cuda" for a bare ordinal,
    as ``.to(0)`` means), or None when it names none."""
    if _is_ordinal(device):
        return "cuda"
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        try:
            return torch.device(device).type
        except RuntimeError:
            return None
    return None


def _is_cuda(device) -> bool:
    return _device_kind(device) == "cuda"


# ---------------------------------------------------------------------------------- one run
class _Run:
    """One execution of the script on the planner's virtual card."""

    def __init__(self, script: str, argv: list[str], *, card: str, steps: int, fake: bool,
                 strict: bool, amp: str | None, checkpoint_every: int | None,
                 max_forwards: int, time_limit: float, context: int, workspaces: bool = False):
        self.script = os.path.abspath(script)
        self.user_dir = os.path.dirname(self.script) + os.sep
        self.argv = list(argv)
        self.card = card
        self.steps = steps
        self.fake = fake
        self.strict = strict
        self.amp = amp
        self.checkpoint_every = checkpoint_every
        self.max_forwards = max_forwards
        self.time_limit = time_limit
        self.context = context
        self.gpu = VirtualGPU(card, rounding=True, context_bytes=context, device="cpu",
                              workspaces=workspaces)
        # measure once with no limit; each card's limit is compared afterwards
        self.gpu._allocator.limit = None
        self.engine = self.gpu.engine
        self.engine.propagate = True
        self.engine.on_new_peak = self._on_new_peak
        self.engine.on_alloc = self._on_alloc
        self.phase_peaks: dict[str, int] = {}
        self._in_optimizer = False
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

        self._fake_type = FakeTensor
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
        self.stand_ins: dict[tuple, StandIn] = {}
        self.saves: list[CodeLine] = []
        self.notes: dict[str, CodeLine | None] = {}
        self.autocast_diffs: dict[tuple, list] = {}
        self.dispatches: dict[tuple, cuda_dispatch.Dispatch] = {}
        self.device_mode: _DeviceMode | None = None
        self.optimizers: list = []  # those that stepped, in the order of their first step
        self.step_counts: dict[int, int] = {}  # id(optimizer) -> its steps so far
        self.created = weakref.WeakValueDictionary()  # id -> each optimizer made (alive)
        self.created_at: dict[int, str] = {}  # id -> "Adam (train.py:12)"
        self.n_steps = 0  # steps of all optimizers together
        self.n_forwards = 0
        self._waiting_since: int | None = None  # forwards when the stepped ones were done
        self.bf16 = False  # the script computes in bfloat16 (autocast or bf16 parameters)
        self.n_checkpointed = 0  # nn.Sequential forwards --checkpoint-every wrapped
        self._depth = 0
        self.peak_line: CodeLine | None = None
        self.peak_phase = ""
        self.peak_op = ""
        self._snapshot: list = []
        self.categories: dict[str, int] = {}
        self._crossings: dict[str, tuple[CodeLine | None, str]] = {}
        limits = sorted((cap - context, name) for name, cap in KNOWN_GPUS.items())
        self._limits = [(lim, name) for lim, name in limits if lim > 0]
        self._deadline = math.inf
        self._autocasts: list = []
        self._ckpt_local = threading.local()
        self.stopped = ""
        self.rss_peak = 0
        self._ram = ProcessRamSource()  # without psutil: not measured (rss_peak stays 0)
        self.seconds = 0.0
        self.used_workers = 0
        self.script_ddp = False  # the script sets up DDP itself (a process group or DDP)
        self.ddp_wrapped = False  # the script wraps its model in DistributedDataParallel

    def mode_is_on(self) -> bool:
        """Is the script's code running (the planner's TorchFunctionMode on the stack and
        not set aside, as it is inside its own handler and in the kernels below it)?"""
        mode = self.device_mode
        if mode is None or not torch._C._is_torch_function_mode_enabled():
            return False
        stack_at = torch._C._get_function_stack_at
        return any(stack_at(i) is mode for i in range(torch._C._len_torch_function_stack()))

    def asks_as_script(self, frame) -> bool:
        """Does ``.device``/``.is_cuda`` asked from ``frame`` get the GPU's answer? Yes for
        the script and the libraries it calls (torch.nn, torch.optim, torch.amp...); no for
        the planner itself and PyTorch's fake-tensor, meta and decomposition code, which
        may run while the mode is on (an aten op called directly, the planner's patches)
        and must see the fake tensors' real device."""
        return frame is None or not frame.f_code.co_filename.startswith(_INTERNAL_CODE)

    # ------------------------------------------------------------ where in the user's code
    def _is_user_file(self, filename: str) -> bool:
        if filename == self.script:
            return True
        return (filename.startswith(self.user_dir) and not filename.startswith(_HELPERS_DIR)
                and not filename.startswith(_TORCH_DIR) and "site-packages" not in filename)

    def user_line(self, frame=None) -> CodeLine | None:
        frame = frame if frame is not None else sys._getframe(1)
        while frame is not None:
            filename = os.path.abspath(frame.f_code.co_filename)
            if self._is_user_file(filename):
                lineno = frame.f_lineno
                return CodeLine(filename, lineno, linecache.getline(filename, lineno).strip())
            frame = frame.f_back
        return None

    def called_from_user(self, frame) -> bool:
        """Is ``frame`` (skipping torch's own override plumbing) in the user's code?"""
        while frame is not None and (frame.f_code.co_filename.startswith(_HELPERS_DIR) or
                                     frame.f_code.co_filename == _OVERRIDES_FILE):
            frame = frame.f_back
        return frame is not None and self._is_user_file(
            os.path.abspath(frame.f_code.co_filename))

    # ------------------------------------------------------------ the peak
    def _phase(self) -> str:
        """Forward, backward, optimizer (step) or elsewhere, from cheap state: autograd's
        graph task, the optimizer hooks, the depth of module calls."""
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        if self._in_optimizer:
            return "optimizer"
        return "forward" if self._depth > 0 else "elsewhere"

    def _on_alloc(self) -> None:
        """The most memory allocated during each phase."""
        phase = self._phase()
        allocated = self.gpu._allocator.allocated_bytes
        if allocated > self.phase_peaks.get(phase, 0):
            self.phase_peaks[phase] = allocated
        # a card runs out of memory where the caching allocator's reserved bytes first pass
        # its capacity less the context (the verdict's basis)
        reserved = self.gpu._allocator.reserved_bytes
        while self._limits and reserved > self._limits[0][0]:
            _, name = self._limits.pop(0)
            self._crossings[name] = (self.user_line(sys._getframe(1)), phase)

    def _on_new_peak(self) -> None:
        eng = self.engine
        self._snapshot = list(eng.live.values())
        self.peak_line = self.user_line(sys._getframe(1))
        self.peak_phase = self._phase()
        op = eng.current_op
        self.peak_op = f"aten.{op._overloadpacket.__name__}" if hasattr(op, "_overloadpacket") \
            else str(op or "")
        if time.monotonic() > self._deadline:
            raise _Stop("time")

    def _sample_rss(self) -> None:
        """Host memory: this process's resident size, sampled at each forward pass and
        optimizer step (the process's own peak counter is left alone: a notebook's memory
        budget reads it)."""
        if self._ram.available:
            self.rss_peak = max(self.rss_peak, self._ram.read())

    def _label_step_tensors(self) -> None:
        """After each optimizer step: the records of the gradients and the optimizer state are
        labelled as such (records are shared with the peak's snapshot, so a peak reached in a
        later forward pass still knows the last step's gradients)."""
        lookup = self.engine.lookup
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if (rec := lookup(p)) is not None:
                        rec.label = "parameters"
                    if p.grad is not None and (rec := lookup(p.grad)) is not None \
                            and rec.label != "parameters":
                        rec.label = "gradients"
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor) and (rec := lookup(v)) is not None \
                            and rec.label not in ("parameters", "gradients"):
                        rec.label = "optimizer state"

    def _classify(self) -> None:
        """Sort the records alive at the peak into categories, by their labels."""
        out = {"parameters": 0, "gradients": 0, "optimizer state": 0, "buffers": 0,
               "inputs": 0, "activations and temporaries": 0}
        for rec in self._snapshot:
            cat = rec.label if rec.label in out else "activations and temporaries"
            out[cat] += rec.nbytes
        self.categories = out

    # ------------------------------------------------------------ tensors onto the "GPU"
    def on_device(self, t) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        if self.fake:
            return isinstance(t, self._fake_type)
        return self.engine.lookup(t) is not None

    def to_device(self, t: torch.Tensor, dtype=None, memory_format=None) -> torch.Tensor:
        """``t`` on the card, as ``t.to("cuda", dtype, memory_format=...)`` makes it."""
        fmt = memory_format or torch.preserve_format
        if self.on_device(t):
            return t if dtype is None and memory_format is None else \
                t.to(dtype=dtype or t.dtype, memory_format=fmt)
        if self.fake:
            # shape and strides from a meta copy: handing the real tensor to the fake mode
            # would put a weak reference on it (the converter's memo), and a parameter with
            # one cannot be swapped in place (torch.utils.swap_tensors) by a module's move
            meta = torch.empty_like(t, device="meta", dtype=dtype or t.dtype,
                                    memory_format=fmt)
            with self.fake_mode:
                out = torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype,
                                          device="cpu")
            if t.requires_grad and out.is_floating_point():
                out.requires_grad_(True)
        else:
            with self.gpu.paused():
                out = t.to(dtype=dtype or t.dtype, memory_format=fmt, copy=True)
        label = "parameters" if isinstance(t, nn.Parameter) else "inputs"
        self.engine.adopt([out], label, op="a tensor's move to the GPU (.to/.cuda)")
        return out

    def make_on_device(self, func, args, kwargs):
        kwargs = dict(kwargs, device="cpu")
        if self.fake:
            with self.fake_mode:
                out = func(*args, **kwargs)
        else:
            with self.gpu.paused():
                out = func(*args, **kwargs)
        self.engine.adopt([out], "inputs",
                          op=f"torch.{getattr(func, '__name__', 'tensor')}(device='cuda')")
        return out

    def read(self, func, what: str, args, kwargs):
        """A value read from a GPU tensor: a stand-in for fake tensors, listed either way."""
        if self.fake and func is _T.item and hasattr(args[0], "_planner_value"):
            return args[0]._planner_value  # a known value (GradScaler's found_inf: 0.0)
        where = self.user_line(sys._getframe(2))
        if self.strict and self.fake:
            raise PlanError(
                f"--strict: the script reads a value from a GPU tensor ({what}) at "
                f"{where or 'a library call'}; fake tensors have no values. Without --strict "
                "the planner answers with a stand-in value and lists the line.",
                kind="strict")
        t = args[0]
        if not self.fake:
            with self.gpu.paused():
                return func(*args, **kwargs)
        value = _stand_in(func, t)
        key = (what, where)
        if key in self.stand_ins:
            self.stand_ins[key].count += 1
        else:
            self.stand_ins[key] = StandIn(what, where, value if isinstance(
                value, (bool, int, float)) else f"zeros{tuple(t.shape)}")
        if func is _T.__format__:
            spec = args[1] if len(args) > 1 else kwargs.get("format_spec", "")
            return format(value, spec)
        if func is _T.__repr__:
            return repr(value)
        if func is _T.__array__:
            import numpy as np

            return np.asarray(value)
        return value

    def note(self, text_: str) -> None:
        if text_ not in self.notes:
            self.notes[text_] = self.user_line(sys._getframe(2))

    # ------------------------------------------------------------ hooks
    def _step_pre_hook(self, optimizer, args, kwargs) -> None:
        self._in_optimizer = True

    def _step_hook(self, optimizer, args, kwargs) -> None:
        self._in_optimizer = False
        key = id(optimizer)
        if key not in self.step_counts:
            self.optimizers.append(optimizer)
            self.step_counts[key] = 0
            self.created.setdefault(key, optimizer)
            self.created_at.setdefault(key, type(optimizer).__name__)
        self.step_counts[key] += 1
        if self.step_counts[key] <= self.steps and max(self.step_counts.values()) >= \
                self.steps:
            self._waiting_since = self.n_forwards  # progress: wait again from here
        self.n_steps += 1
        self._sample_rss()
        self._label_step_tensors()
        if self.done_stepping():
            raise _Stop("steps")

    def lagging(self) -> list[int]:
        """The optimizers (ids) made or stepped so far that have not yet stepped ``steps``
        times (an optimizer made late, a GAN's generator, one that never steps)."""
        keys = set(self.step_counts) | set(self.created.keys())
        return sorted(k for k in keys if self.step_counts.get(k, 0) < self.steps)

    def done_stepping(self) -> bool:
        """The stop rule: every optimizer seen (made or stepped) has stepped ``steps``
        times. Once one has, the others get at most ``max_forwards`` forward passes between
        their steps (:meth:`_forward_pre`): an optimizer that never steps ends the wait."""
        return bool(self.step_counts) and not self.lagging()

    def _optimizer_made(self, optimizer) -> None:
        key = id(optimizer)
        if key not in self.created and key not in self.step_counts:
            self.created[key] = optimizer
            where = self.user_line(sys._getframe(1))
            self.created_at[key] = type(optimizer).__name__ + (
                f" ({_short(where.file)}:{where.line})" if where else "")

    def _forward_pre(self, module, args) -> None:
        self._depth += 1
        # a forward pass run by the backward pass (checkpointing's recomputation) is not one
        # of the script's forward passes
        if self._depth == 1 and torch._C._current_graph_task_id() == -1:
            self.n_forwards += 1
            self._sample_rss()
            if time.monotonic() > self._deadline:
                raise _Stop("time")
            if self.n_forwards > self.max_forwards and self.n_steps == 0:
                raise _Stop("forwards")
            if self._waiting_since is not None and \
                    self.n_forwards - self._waiting_since > self.max_forwards:
                names = ", ".join(f"{self.created_at.get(k, '?')} with "
                                  f"{self.step_counts.get(k, 0)}" for k in self.lagging())
                self.notes[f"not every optimizer stepped {self.steps} times: {names} "
                           f"step(s) after {self.max_forwards} more forward passes; the "
                           "plan stopped there (raise --max-forwards to wait longer)"] = None
                raise _Stop("steps")
            if self.amp is not None and not torch.is_autocast_enabled("cpu"):
                ac = torch.autocast("cpu", dtype=_AMP_DTYPES[self.amp])
                ac.__enter__()
                self._autocasts.append(ac)

    def _forward_post(self, module, args, output) -> None:
        self._depth -= 1
        if self._depth == 0 and self._autocasts:
            self._autocasts.pop().__exit__(None, None, None)

    # ------------------------------------------------------------ running
    def run(self) -> None:
        sandbox.run_started()
        old_argv = sys.argv
        self._deadline = time.monotonic() + self.time_limit
        self._sample_rss()
        t0 = time.perf_counter()
        alarm = self.time_limit < math.inf and threading.current_thread() is \
            threading.main_thread() and hasattr(signal, "SIGALRM")
        old_handler = None
        if alarm:
            def on_alarm(signum, frame):
                raise _Stop("time")
            old_handler = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.time_limit)
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(_Patches(self))
                sys.argv = [self.script, *self.argv]
                stack.enter_context(self.gpu)
                stack.enter_context(_DeviceMode(self))
                try:
                    runpy.run_path(self.script, run_name="__main__")
                    self.stopped = "ended"
                except _Stop as stop:
                    self.stopped = stop.reason
                except SystemExit as exc:
                    if exc.code not in (None, 0):
                        raise PlanError(
                            f"the script exited with status {exc.code!r} before its "
                            f"{_nth(self.steps)} optimizer step (status 2 is argparse's for "
                            "arguments it does not accept: see the usage above)",
                            kind="script") from None
                    self.stopped = "ended"
                finally:
                    while self._autocasts:
                        self._autocasts.pop().__exit__(None, None, None)
        except PlanError:
            raise
        except Exception as exc:  # the script's own error, or an op fake tensors cannot run
            raise self._explain(exc) from None
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old_handler)
            sys.argv = old_argv
            self.seconds = time.perf_counter() - t0
            self._sample_rss()
            # the whole process's peak (building the model on the host included), read, not
            # reset; in a notebook it also holds what the notebook did before
            self.rss_peak = max(self.rss_peak, _process_peak_rss())
        self._classify()

    def _explain(self, exc: BaseException) -> PlanError:
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
            UnsupportedOperatorException,
        )

        tb = exc.__traceback__
        user = None
        while tb is not None:
            filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
            if self._is_user_file(filename):
                user = CodeLine(filename, tb.tb_lineno,
                                linecache.getline(filename, tb.tb_lineno).strip())
            tb = tb.tb_next
        where = f" at {user}" if user else ""
        if isinstance(exc, torch.OutOfMemoryError):
            return PlanError(f"the script ran out of memory{where}: {exc}", kind="script")
        if isinstance(exc, (UnsupportedOperatorException, DynamicOutputShapeException,
                            DataDependentOutputException)):
            op = getattr(exc, "func", None)
            name = f"aten.{op._overloadpacket.__name__}" if hasattr(op, "_overloadpacket") \
                else str(op)
            why = ("its output's shape depends on the data" if isinstance(
                exc, (DynamicOutputShapeException, DataDependentOutputException))
                else "fake tensors have no implementation of it")
            return PlanError(
                f"the planner cannot run {name}{where}: {why}. Fake tensors have shapes but "
                "no values. Plan the script with this line replaced by a fixed-shape "
                "equivalent, or measure it on a real GPU.", kind="fake-op")
        hint = ""
        if isinstance(exc, AssertionError) and user is not None and re.search(
                r"is_cuda|is_cpu|\.device\b|get_device\(", user.code):
            hint = (" (in the planner, a tensor on the virtual card answers is_cuda, "
                    ".device and get_device() as on a GPU, cuda:0; a tensor the script made "
                    "on the host, without device='cuda', .cuda() or .to(device), answers "
                    "cpu, as it would on a GPU)")
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        # show the user's traceback: drop the planner's and runpy's frames before the script
        text_ = "".join(lines)
        start = text_.find(f'File "{self.script}"')
        if start > 0:
            text_ = "Traceback (most recent call last):\n  " + text_[start:]
        return PlanError(
            f"the script raised {type(exc).__name__}{where} before its "
            f"{_nth(self.steps)} optimizer step: {exc}{hint}", kind="script", details=text_)


def _process_peak_rss() -> int:
    """This process's peak resident size so far (Linux ``VmHWM``; elsewhere
    ``getrusage``'s ``ru_maxrss``), 0 where neither can be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except (ImportError, OSError):
        return 0


def _margin_text(fraction: float, min_bytes: int) -> str:
    percent = f"{100 * fraction:.4g} %"
    if fraction and min_bytes:
        return f"max({percent}, {fmt_bytes(min_bytes)})"
    return percent if fraction else fmt_bytes(min_bytes)


def _check_margin(margin) -> tuple[float, int]:
    """``margin`` as (fraction of the card, least bytes): None for the lessons' rule
    max(15 %, 2 GiB), a percentage ("20%", "20 %") or a size (bytes, "4 GiB")."""
    if margin is None:
        return DEFAULT_MARGIN
    if isinstance(margin, str) and margin.strip().endswith("%"):
        number = margin.strip()[:-1].strip()
        try:
            percent = float(number)
        except ValueError:
            percent = math.nan
        if not (0 <= percent < 100):  # also NaN
            raise ValueError(f"margin must be a percentage from 0 % to below 100 % of the "
                             f"card (e.g. '15%') or a size (e.g. '4 GiB'), got {margin!r}")
        return percent / 100, 0
    if isinstance(margin, float) and not math.isfinite(margin):
        raise ValueError(f"margin must be a percentage such as '15%' or a size such as "
                         f"'4 GiB', got {margin!r}")
    try:
        return 0.0, resolve_capacity(margin, what="margin", allow_zero=True)[1]
    except ValueError as exc:
        raise ValueError(f"{exc} (margin: a percentage of the card such as '15%', or a "
                         "size such as '4 GiB'; None for max(15 %, 2 GiB))") from None


_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|\d+-\d+")


def _slurm_time(value) -> str:
    """``value`` as SLURM's ``--time``: a string in one of its formats or a whole number of
    minutes; ValueError (TypeError for another type) naming time_limit otherwise."""
    formats = ('"MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS" or a whole '
               "number of minutes")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"time_limit must be a string ({formats}), got "
                        f"{type(value).__name__}: {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value) or value <= 0:
            raise ValueError(f"time_limit must be {formats}, got {value!r}")
        value = int(value)
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"time_limit must be a positive number of minutes, got {value}")
        return str(value)
    value = value.strip()
    if not _SLURM_TIME.fullmatch(value) or not any(ch in "123456789" for ch in value):
        raise ValueError(f"time_limit must be {formats}, got {value!r}")
    return value


def _default_device_mode():
    """The device of the DeviceContext mode that ``torch.set_default_device`` or ``with
    torch.device(...)`` put at the bottom of the TorchFunctionMode stack, or None. (Not
    ``torch.utils._device.CURRENT_DEVICE``: ``torch.utils.checkpoint``'s recomputation
    re-enters the DeviceContext, which leaves that variable stale after it is removed.)"""
    for i in range(torch._C._len_torch_function_stack()):
        mode = torch._C._get_function_stack_at(i)
        if isinstance(mode, _default_device.DeviceContext):
            return mode.device
    return None


def _put_back_default_device(saved) -> None:
    device, current = saved
    torch.set_default_device(device)
    _default_device.CURRENT_DEVICE = current


def _nth(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _stand_in(func, t):
    if func in (_T.numpy, _T.__array__, _T.tolist, _T.cpu) or (
            func is _T.__repr__ and t.dim() > 0):
        real = torch.zeros(t.shape, dtype=t.dtype)  # a tensor copied to the host: zeros
        if func is _T.numpy or func is _T.__array__:
            return real.numpy()
        if func is _T.tolist:
            return real.tolist()
        return real
    if t.dtype == torch.bool:
        return bool(getattr(t, "_planner_truth", False))
    if t.is_floating_point() or t.is_complex():
        return 1.0
    return 1


class _KeepForBackward(torch.autograd.Function):
    """Passes a tensor through and saves ``kept`` for backward: memory that lives from here
    until backward reaches this point (or the graph is dropped)."""

    @staticmethod
    def forward(ctx, tensor, kept):
        ctx.save_for_backward(kept)
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


_NOT_MODELLED = object()
_SDPA = torch.nn.functional.scaled_dot_product_attention
_RNNS = (torch._VF.lstm, torch._VF.gru, torch._VF.rnn_tanh, torch._VF.rnn_relu)
_CUDA_REFUSES = {"binary_cross_entropy"}
_AUTOCAST_TEXT = {
    "fp32": ("float32 (CUDA autocast)", "CUDA casts its inputs to float32"),
    "fp32_out": ("float32 output (CUDA autocast)", "CUDA writes a float32 output"),
    "promote": ("the widest input type (CUDA autocast)", "CUDA casts its inputs to the "
                "widest of their types"),
    "lower": ("low precision (CUDA autocast)", "CUDA casts its inputs down"),
    "as_is": ("its input type (CUDA autocast)", "CUDA runs it in its inputs' type, the CPU's "
              "autocast in float32"),
}


def _any_tensor(args, kwargs, kind) -> bool:
    def walk(obj) -> bool:
        if isinstance(obj, kind):
            return True
        if isinstance(obj, (list, tuple)):
            return any(walk(o) for o in obj)
        if isinstance(obj, dict):
            return any(walk(o) for o in obj.values())
        return False
    return walk(args) or walk(kwargs)


class _DeviceMode(TorchFunctionMode):
    """Sends what the script puts on the GPU to fake (or counted) tensors, and answers reads."""

    def __init__(self, run: _Run):
        super().__init__()
        self.run = run
        run.device_mode = self

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        run = self.run
        if func in _READS and args and run.on_device(args[0]):
            return run.read(func, _READS[func], args, kwargs)
        if func in _DEVICE_ANSWERS and args and run.on_device(args[0]) and \
                run.asks_as_script(sys._getframe(1)):
            return _DEVICE_ANSWERS[func]  # x.device, x.is_cuda...: as on the GPU
        if func is _T.cuda:
            t = args[0]
            return run.to_device(t)
        if func is _T.to:
            return self._to(func, args, kwargs)
        if func is _T.pin_memory:
            return args[0]
        if func is _T.is_pinned:
            return False
        device = kwargs.get("device")
        if device is None and func in _default_device._device_constructors():
            # torch.set_default_device("cuda") / `with torch.device("cuda"):` in the script:
            # its DeviceContext mode sits below this one and would fill in "cuda" next
            device = _default_device_mode()
        if _is_cuda(device):
            return run.make_on_device(func, args, kwargs)
        if run.fake and (out := self._as_on_cuda(func, args, kwargs)) is not _NOT_MODELLED:
            return out
        out = func(*args, **kwargs)
        if run.fake and isinstance(out, run._fake_type) and out.dtype == torch.bool:
            name = getattr(func, "__name__", "")
            if name == "isfinite":
                out._planner_truth = True
            elif name in ("all", "any", "logical_not", "__invert__") and args and \
                    hasattr(args[0], "_planner_truth"):
                truth = args[0]._planner_truth
                out._planner_truth = (not truth) if name in ("logical_not", "__invert__") \
                    else truth
        return out

    # ------------------------------------------------------------ CUDA's dispatch
    def _as_on_cuda(self, func, args, kwargs):
        """Run ``func`` as CUDA would where its memory differs from the CPU kernel's
        (:mod:`.cuda_dispatch`), or return ``_NOT_MODELLED``."""
        run = self.run
        fake = run._fake_type
        if func is _SDPA:
            a = cuda_dispatch.sdpa_args(args, kwargs)
            if isinstance(a["query"], fake):
                return self._sdpa(a)
            return _NOT_MODELLED
        if func in _RNNS:
            if args and isinstance(args[0], fake):
                return self._rnn(func, args, kwargs)
            return _NOT_MODELLED
        if torch.is_autocast_enabled("cpu"):
            low = torch.get_autocast_dtype("cpu")
            name = getattr(func, "__name__", "")
            if low not in _LOW or not _any_tensor(args, kwargs, fake):
                return _NOT_MODELLED
            if name in _CUDA_REFUSES:
                run.note(f"CUDA autocast refuses {name} (\"unsafe to autocast\"): on a GPU "
                         "this line raises; use binary_cross_entropy_with_logits")
            policy = cuda_dispatch.autocast_policy(name)
            if policy is None:
                return _NOT_MODELLED
            out, copies, differs = cuda_dispatch.run_autocast(policy, func, args, kwargs, low)
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            if differs and isinstance(first, torch.Tensor):
                model, detail = _AUTOCAST_TEXT[policy]
                extra = copies
                if policy in ("fp32", "fp32_out") and first.dtype == torch.float32:
                    extra += first.numel() * (4 - torch.finfo(low).bits // 8)
                self._record(name, model, f"{detail}; the CPU's autocast would run it "
                             "otherwise", extra)
                if policy in ("fp32", "fp32_out"):
                    where = run.user_line(sys._getframe(2))
                    entry = run.autocast_diffs.setdefault((name, where), [0, 0])
                    entry[0] += 1
                    entry[1] += extra
            return out
        return _NOT_MODELLED

    def _record(self, op: str, model: str, detail: str, extra: int = 0) -> None:
        run = self.run
        where = run.user_line(sys._getframe(2))
        key = (op, where, model, detail)
        if key in run.dispatches:
            run.dispatches[key].count += 1
            run.dispatches[key].extra_bytes += extra
        else:
            run.dispatches[key] = cuda_dispatch.Dispatch(op, where, model, detail, 1, extra)

    def _sdpa(self, a: dict):
        run = self.run
        q, k, v = a["query"], a["key"], a["value"]
        autocast = torch.is_autocast_enabled("cpu")
        if autocast:  # CUDA autocast casts SDPA's floating inputs to the low type
            low = torch.get_autocast_dtype("cpu")
            q, k, v = (t.to(low) if t.is_floating_point() and t.dtype == torch.float32
                       else t for t in (q, k, v))
            m = a["attn_mask"]
            if isinstance(m, torch.Tensor) and m.dtype == torch.float32:
                a["attn_mask"] = m.to(low)
        dropout = float(a["dropout_p"])
        cc = COMPUTE_CAPABILITY[run.card]
        backend, why = cuda_dispatch.sdpa_backend(
            q, k, v, attn_mask=a["attn_mask"], dropout_p=dropout, is_causal=a["is_causal"],
            enable_gqa=a["enable_gqa"], cc=cc)
        if backend == "error":
            raise PlanError(f"no attention backend of CUDA can run this call on the "
                            f"{run.card}: {why} (torch would raise 'No available kernel')",
                            kind="script")
        cpu = cuda_dispatch.cpu_sdpa_backend(dict(a, query=q, key=k, value=v))
        mask = "no mask" if a["attn_mask"] is None else "a mask"
        detail = (f"{cuda_dispatch._dt(q.dtype)}, head {q.shape[-1]}, "
                  f"{'causal' if a['is_causal'] else mask}, dropout {dropout:g}, on the "
                  f"{run.card} (sm{cc[0]}{cc[1]}); the CPU would use its "
                  f"{cuda_dispatch.SDPA_BACKENDS[cpu]}")
        if why:
            detail += f"; not taken: {why}"
        self._record("scaled_dot_product_attention",
                     f"CUDA's {cuda_dispatch.SDPA_BACKENDS[backend]}", detail)
        with torch.autocast("cpu", enabled=False):
            mask = cuda_dispatch.prepare_mask(backend, q, k, a["attn_mask"])
            call = (backend, q, k, v, mask, dropout, a["is_causal"], a["scale"],
                    a["enable_gqa"])
            if backend == "math":
                return cuda_dispatch.run_sdpa(*call)[0]
            # the fused kernels' RNG seed and offset live on the host: count only the
            # output and the log-sum-exp
            with run.gpu.paused():
                out, lse = cuda_dispatch.run_sdpa(*call)
            run.engine.adopt([out, lse], "activations and temporaries",
                             op=f"aten.scaled_dot_product_attention ({backend})")
            return out

    def _rnn(self, func, args, kwargs):
        """cuDNN's RNN: the CPU's kernel gives the outputs, and a reserve space of the
        modelled size is saved for backward, as cuDNN's is: made before the call, freed when
        backward has gone through the RNN (it hangs on a weight's or the input's way back)."""
        run = self.run
        name = func.__name__
        packed = len(args) > 1 and isinstance(args[1], torch.Tensor) and \
            args[1].dtype == torch.int64 and args[1].dim() == 1
        hx_at, params_at = (2, 3) if packed else (1, 2)
        hx, params = args[hx_at], list(args[params_at])
        h = hx[1] if isinstance(hx, (tuple, list)) else hx  # an LSTM's cell: hidden size
        x = args[0]
        carrier = next((i for i, w in enumerate(params) if isinstance(w, torch.Tensor)
                        and w.requires_grad), None)
        if not torch.is_grad_enabled() or (carrier is None and not x.requires_grad):
            return _NOT_MODELLED  # nothing to go back through: cuDNN keeps no reserve
        if not torch.backends.cudnn.enabled:
            self._record(name, "PyTorch's native RNN (cudnn.enabled is False)",
                         "the CPU's kernel stands in for it")
            return _NOT_MODELLED
        steps_batch = x.shape[0] if packed or x.dim() < 3 else x.shape[0] * x.shape[1]
        bidirectional = bool(args[params_at + 5])
        dirs = 2 if bidirectional else 1
        dtype = x.dtype
        if torch.is_autocast_enabled("cpu") and dtype == torch.float32:
            dtype = torch.get_autocast_dtype("cpu")  # AutocastRNN.cpp: _cudnn_rnn casts
        nbytes = cuda_dispatch.rnn_reserve_bytes(
            name, steps=steps_batch, batch=1, hidden=h.shape[-1], layers=h.shape[0] // dirs,
            directions=dirs, itemsize=torch.finfo(dtype).bits // 8)
        with run.fake_mode:
            reserve = torch.empty(nbytes, dtype=torch.uint8)
        run.engine.adopt([reserve], "activations and temporaries",
                         op=f"cuDNN's {name} reserve space")
        args = list(args)
        if carrier is not None:
            params[carrier] = _KeepForBackward.apply(params[carrier], reserve)
            args[params_at] = params
        else:
            args[0] = _KeepForBackward.apply(x, reserve)
        del reserve
        per = cuda_dispatch.RNN_KEPT_PER_STEP[name]
        self._record(name, "cuDNN's RNN with a reserve space (a lower bound)",
                     f"{fmt_bytes(nbytes)} kept for backward: {per} x hidden "
                     f"{h.shape[-1]} per layer, direction, step and batch row, as PyTorch's "
                     "fused CUDA cells keep; cuDNN's exact size is known only on a GPU; "
                     "the CPU's oneDNN path keeps none on fake tensors", nbytes)
        return func(*args, **kwargs)

    def _to(self, func, args, kwargs):
        run = self.run
        t = args[0]
        # a bare ordinal (.to(0), device=0) is a CUDA device; _parse_to would ask the
        # (absent) accelerator for it
        rest, named = _ordinals_named(args[1:], kwargs)
        copy = bool(named.pop("copy", False))  # not one of _parse_to's arguments
        if len(rest) > 3 and isinstance(rest[-1], bool):  # .to(device, dtype, nb, copy)
            copy, rest = rest[-1], rest[:-1]
        try:
            device, dtype, _non_blocking, fmt = torch._C._nn._parse_to(*rest, **named)
        except (TypeError, RuntimeError):
            return func(*args, **kwargs)  # not valid arguments: PyTorch's own error
        if rest and isinstance(rest[0], torch.Tensor) and run.on_device(rest[0]):
            device = _CUDA0  # .to(other): other's device and dtype, the card here
        if _is_cuda(device):
            if copy and run.on_device(t):  # a copy on the card (GradScaler's per device)
                return t.to(dtype=dtype or t.dtype, memory_format=fmt or torch.preserve_format,
                            copy=True)
            return run.to_device(t, dtype, fmt)
        if _device_kind(device) == "cpu" and run.on_device(t) and \
                run.called_from_user(sys._getframe(1)):
            # the user's code moving a GPU tensor to the host; a library's `.to("cpu")` on a
            # card's tensor (foreach grouping's keys are the fake tensors' real device, the
            # CPU) is a no-op, as `.to(t.device)` is on the GPU
            return run.read(func, "to('cpu')", args, kwargs)
        return func(*args, **kwargs)


# ---------------------------------------------------------------------------------- patches
class _Stream:
    """``torch.accelerator.current_stream()`` / ``torch.cuda.current_stream()`` on the planner's
    card: one stream, never capturing a graph, nothing to wait for."""

    device = torch.device("cuda", 0)

    def is_capturing(self) -> bool:
        return False

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event


class _Patches:
    """Everything the script sees differently while it is planned; all restored on exit."""

    def __init__(self, run: _Run):
        self.run = run
        self._saved: list[tuple[object, str, object]] = []
        self._handles: list = []
        self._cuda = None
        self._made_group = False

    def _set(self, owner, name, value) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name, None))))
        setattr(owner, name, value)

    def _save_global_state(self) -> None:
        """What a script may change for the whole process (seeds, TF32 and cuDNN switches,
        the default dtype, threads, environment variables, the working folder): put back on
        exit, so a notebook that plans a script
        goes on as before."""
        import random

        import numpy as np

        state = [(torch.set_rng_state, torch.get_rng_state()),
                 (random.setstate, random.getstate()),
                 (np.random.set_state, np.random.get_state()),
                 (torch.set_default_dtype, torch.get_default_dtype()),
                 (torch.set_grad_enabled, torch.is_grad_enabled()),
                 (torch.set_num_threads, torch.get_num_threads()),
                 (lambda v: torch.use_deterministic_algorithms(*v),
                  (torch.are_deterministic_algorithms_enabled(),
                   torch.is_deterministic_algorithms_warn_only_enabled()))]
        for owner, name in ((torch.backends.cudnn, "enabled"),
                            (torch.backends.cudnn, "benchmark"),
                            (torch.backends.cudnn, "deterministic"),
                            (torch.backends.cuda.matmul, "fp32_precision"),
                            (torch.backends.cudnn.conv, "fp32_precision"),
                            (torch.backends.cudnn.rnn, "fp32_precision")):
            try:
                value = getattr(owner, name)
            except (AttributeError, RuntimeError):
                continue
            state.append((lambda v, o=owner, n=name: setattr(o, n, v), value))
        environ = dict(os.environ)  # ddp_train.py sets RANK, WORLD_SIZE, MASTER_ADDR...

        def put_back_environ(saved):
            os.environ.clear()
            os.environ.update(saved)

        state.append((put_back_environ, environ))
        # the script's torch.set_default_device("cuda"): its DeviceContext mode removed
        state.append((_put_back_default_device, (_default_device_mode(),
                                                 _default_device.CURRENT_DEVICE)))
        state.append((os.chdir, os.getcwd()))
        # the legacy switch last, so that it is put back first and the fp32_precision values
        # after it (mixing the two APIs otherwise makes torch's legacy getters raise)
        state.append((torch.set_float32_matmul_precision, torch.get_float32_matmul_precision()))
        self._global_state = state

    def _restore_global_state(self) -> None:
        for setter, value in reversed(getattr(self, "_global_state", [])):
            try:
                setter(value)
            except (RuntimeError, ValueError, TypeError):
                pass  # a switch this torch build refuses to set back: leave it
        self._global_state = []

    def __enter__(self):
        run = self.run
        self._save_global_state()
        try:
            self._cuda = SimulatedCuda(run.gpu)
            self._cuda.__enter__()
            self._patch_accelerator()
            self._patch_autocast()
            self._patch_save_and_compile()
            self._patch_loader()
            self._patch_module_to()
            self._patch_module_moves()
            self._patch_fake_device()
            self._patch_data_parallel()
            self._patch_grad_scaler()
            self._patch_foreach()
            self._patch_distributed()
            self._patch_optimizer_init()
            if run.fake:
                self._patch_sdpa()
            if run.checkpoint_every:
                self._patch_sequential()
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            self._handles.append(register_optimizer_step_pre_hook(run._step_pre_hook))
            self._handles.append(register_optimizer_step_post_hook(run._step_hook))
            self._handles.append(nn.modules.module.register_module_forward_pre_hook(
                run._forward_pre))
            self._handles.append(nn.modules.module.register_module_forward_hook(
                run._forward_post, always_call=True))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self._made_group:
            import torch.distributed as dist

            self._made_group = False
            if dist.is_initialized():
                dist.destroy_process_group()
        for handle in reversed(self._handles):
            handle.remove()
        self._handles.clear()
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()
        if self._cuda is not None:
            self._cuda.__exit__(None, None, None)
            self._cuda = None
        self._restore_global_state()
        return False

    def _patch_accelerator(self) -> None:
        acc = getattr(torch, "accelerator", None)
        if acc is None:
            return
        gpu = self.run.gpu
        answers = {
            "is_available": lambda: True,
            "device_count": lambda: 1,
            "current_accelerator": lambda check_available=False: torch.device("cuda"),
            "current_device_index": lambda: 0,
            "current_device_idx": lambda: 0,
            "set_device_index": lambda device, /: None,
            "set_device_idx": lambda device, /: None,
            "synchronize": lambda device=None, /: None,
            "empty_cache": lambda: None,
            "memory_allocated": lambda device_index=None, /: gpu.allocated_bytes,
            "max_memory_allocated": lambda device_index=None, /: gpu.peak_allocated_bytes,
            "memory_reserved": lambda device_index=None, /: gpu.reserved_bytes,
            "max_memory_reserved": lambda device_index=None, /: gpu.peak_reserved_bytes,
            "reset_peak_memory_stats": lambda device_index=None, /: gpu.reset_peak(),
            "get_memory_info": lambda device_index=None, /: (gpu.free_bytes,
                                                              gpu.capacity_bytes),
            "current_stream": lambda device=None, /: _Stream(),
        }
        for name, fn in answers.items():
            if hasattr(acc, name):
                self._set(acc, name, fn)
        for name in ("current_stream", "default_stream"):
            self._set(torch.cuda, name, lambda device=None: _Stream())

    def _patch_autocast(self) -> None:
        run = self.run
        cls = torch.amp.autocast_mode.autocast
        original = cls.__init__

        def __init__(ac, device_type, dtype=None, enabled=True, cache_enabled=None):  # noqa: N807
            if device_type == "cuda" and enabled:
                run.note(f"torch.autocast('cuda', {_dtype_name(dtype or torch.float16)}) ran "
                         "as CPU autocast with that dtype, and the ops whose type CUDA's "
                         "autocast sets otherwise ran as on CUDA (under 'Run as CUDA would', if "
                         "the script has any)")
            if device_type == "cuda":
                device_type, dtype = "cpu", dtype or torch.float16
                if enabled and dtype == torch.bfloat16:
                    run.bf16 = True
            original(ac, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        self._set(cls, "__init__", __init__)

    def _patch_save_and_compile(self) -> None:
        run = self.run

        def save(obj, f, *args, **kwargs):
            run.saves.append(run.user_line(sys._getframe(1)))
            sandbox.skipped_save(f)  # an empty stand-in file, so os.replace(tmp, path) works

        def compile_(model=None, *args, **kwargs):
            run.note("torch.compile was skipped: the plan is for eager mode (compiled code "
                     "often needs less memory)")
            if model is None:
                return lambda m: m
            return model

        self._set(torch, "save", save)
        original_load = torch.load

        def load(f, map_location=None, *args, **kwargs):
            # a checkpoint the script resumes from: its tensors load on the host (this torch
            # may have no CUDA), and load_state_dict copies them into the fake parameters
            if map_location is not None and not callable(map_location) and not isinstance(
                    map_location, dict) and _is_cuda(map_location):
                run.note(f"torch.load(map_location={map_location!r}) loaded on the host")
                map_location = "cpu"
            sandbox.check_load(f)
            return original_load(f, map_location, *args, **kwargs)

        self._set(torch, "load", load)

        def exit_(status=0):
            run.note(f"the script called os._exit({status}): the planner ended its run there")
            raise _Stop("ended")

        self._set(os, "_exit", exit_)
        self._set(torch, "compile", compile_)

    def _patch_loader(self) -> None:
        run = self.run
        cls = torch.utils.data.DataLoader
        original = cls.__init__

        def __init__(loader, dataset, *args, **kwargs):  # noqa: N807
            workers = kwargs.get("num_workers", 0)
            if workers:
                run.used_workers = max(run.used_workers, workers)
                run.note(f"DataLoader(num_workers={workers}) ran with num_workers=0 (the same "
                         "batches; the planner keeps the data in this process)")
                kwargs["num_workers"] = 0
                kwargs.pop("prefetch_factor", None)
                kwargs["persistent_workers"] = False
            if kwargs.get("pin_memory"):
                run.note("DataLoader(pin_memory=True) ran without pinned memory (it only "
                         "speeds up copies; GPU memory is the same)")
                kwargs["pin_memory"] = False
            original(loader, dataset, *args, **kwargs)

        self._set(cls, "__init__", __init__)

    def _patch_module_to(self) -> None:
        original = nn.Module.to

        def to(module, *args, **kwargs):
            # Module.to parses its arguments itself, before any tensor's .to
            args, kwargs = _ordinals_named(args, kwargs)
            return original(module, *args, **kwargs)

        self._set(nn.Module, "to", to)

    def _patch_module_moves(self) -> None:
        """A module's move (``.to``, ``.cuda``, ``.half``, ``.float``...) keeps its Parameter
        objects, as on a GPU, where ``Module._apply`` sets ``param.data`` in place: so tied
        weights stay tied, an optimizer built before ``.cuda()`` keeps its parameters, and a
        second move finds fake parameters. A fake tensor cannot be put into a real Parameter
        with ``.data =``, so each parameter takes its moved tensor's place with
        ``torch.utils.swap_tensors`` (PyTorch's other in-place way, the one
        ``torch.__future__.set_swap_module_params_on_conversion(True)`` selects; that switch
        itself is not used: it also changes ``load_state_dict``). Buffers are replaced, as
        ``Module._apply`` does on a GPU, and labelled "buffers"."""
        run = self.run
        original = nn.Module._apply

        def _apply(module, fn, recurse=True):
            if not run.fake:  # real tensors: PyTorch's own `param.data =` keeps them
                out = original(module, fn, recurse)
            else:
                out = _apply_in_place(run, module, fn, recurse)
            run.engine.relabel([b for b in module._buffers.values() if b is not None],
                               "buffers")
            return out

        self._set(nn.Module, "_apply", _apply)
        register = nn.Module.register_buffer

        def register_buffer(module, name, tensor, persistent=True):
            register(module, name, tensor, persistent)
            if isinstance(tensor, torch.Tensor):  # made on the card (device=, default device)
                run.engine.relabel([tensor], "buffers")

        self._set(nn.Module, "register_buffer", register_buffer)

    def _patch_fake_device(self) -> None:
        """FakeTensor's own ``device`` property (which the TorchFunctionMode does not see)
        answers "cuda:0" while the script's code runs, and its real (CPU) device inside the
        planner, the fake mode and the engine, where the mode is not on the stack."""
        run = self.run
        # nn.LSTM's flatten_parameters asks cudnn.is_acceptable of weights that now answer
        # is_cuda: this CPU build would warn "compiled without cuDNN" on each RNN. No:
        # the weights stay as they are (cuDNN's flat copy is the same bytes on a GPU)
        self._set(torch.backends.cudnn, "is_acceptable", lambda tensor: False)
        if not run.fake:
            return
        from torch._subclasses.fake_tensor import FakeTensor

        original = FakeTensor.__dict__["device"]

        def device(t):
            if run.mode_is_on() and run.asks_as_script(sys._getframe(1)):
                return _CUDA0
            return original.__get__(t)

        self._set(FakeTensor, "device", property(device))

    def _patch_data_parallel(self) -> None:
        """``nn.DataParallel`` over the one card runs its module, as PyTorch's forward does
        with one device (its scatter would copy to a real GPU); over more cards: refused."""
        run = self.run
        cls = nn.DataParallel
        init = cls.__init__

        def __init__(dp, module, device_ids=None, output_device=None, dim=0):  # noqa: N807
            if device_ids is not None and len(device_ids) > 1:
                raise PlanError(
                    f"nn.DataParallel(device_ids={list(device_ids)!r}) splits each batch over "
                    f"{len(device_ids)} GPUs in one process: the planner plans one card. Plan "
                    "it with one GPU (DataParallel then runs the module itself: the memory of "
                    "the card that holds the whole model, the gradients and the optimizer "
                    "state), or use DistributedDataParallel and --ddp N", kind="ddp")
            init(dp, module, device_ids, output_device, dim)
            run.note("nn.DataParallel ran on the one virtual card: with one GPU it runs the "
                     "module itself (PyTorch's DataParallel.forward); on N GPUs the first "
                     "card also gathers the outputs")

        def forward(dp, *inputs, **kwargs):
            return dp.module(*inputs, **kwargs)

        self._set(cls, "__init__", __init__)
        self._set(cls, "forward", forward)

    def _patch_grad_scaler(self) -> None:
        """GradScaler's found-inf flags are on the card (``device=self._scale.device``, as
        on a GPU): read for ``scaler.step``, they answer 0.0 (no inf/NaN gradient), so the
        optimizer steps, as in a healthy run."""
        if not self.run.fake:
            return
        cls = torch.amp.GradScaler
        original = cls._unscale_grads_

        def _unscale_grads_(scaler, *args, **kwargs):
            per_device = original(scaler, *args, **kwargs)
            for found_inf in per_device.values():
                found_inf._planner_value = 0.0
            return per_device

        self._set(cls, "_unscale_grads_", _unscale_grads_)

    def _patch_foreach(self) -> None:
        for module, name, value in foreach_patches(fake=self.run.fake):
            self._set(module, name, value)

    def _patch_distributed(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return

        original = dist.init_process_group
        run = self.run

        def init_process_group(*args, **kwargs):
            run.script_ddp = True  # the script sets up DDP itself
            world = int(os.environ.get("WORLD_SIZE", "1"))
            if world == 1 and not dist.is_initialized():
                run.note("init_process_group ran as a one-process gloo group in the planner "
                         "(its collectives do nothing with one rank); give --ddp N for the "
                         "memory of each of N ranks")
                self._made_group = True
                return original("gloo", store=dist.HashStore(), rank=0, world_size=1)
            raise PlanError(
                "the script starts a process group (torch.distributed.init_process_group): "
                "plan it as one process (without torchrun, so that it skips that branch) and "
                "give --ddp N for the memory of each of N ranks", kind="ddp")

        self._set(dist, "init_process_group", init_process_group)
        ddp = torch.nn.parallel.DistributedDataParallel
        ddp_init = ddp.__init__

        def __init__(wrapper, module, device_ids=None, output_device=None, *args,  # noqa: N807
                     **kwargs):
            # the module's (fake) parameters report "cpu": device_ids would be refused
            run.script_ddp = run.ddp_wrapped = True
            ddp_init(wrapper, module, None, None, *args, **kwargs)

        self._set(ddp, "__init__", __init__)

    def _patch_sdpa(self) -> None:
        """``F.scaled_dot_product_attention`` as a Python function that takes CUDA's backend:
        ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``,
        ``nn.TransformerEncoderLayer``) calls it by this name while no torch-function mode is
        active, so the device mode alone would not see those calls."""
        run = self.run
        original = _SDPA

        def scaled_dot_product_attention(*args, **kwargs):
            a = cuda_dispatch.sdpa_args(args, kwargs)
            if run.device_mode is not None and isinstance(a["query"], run._fake_type):
                return run.device_mode._sdpa(a)
            return original(*args, **kwargs)

        self._set(nn.functional, "scaled_dot_product_attention", scaled_dot_product_attention)

    def _patch_optimizer_init(self) -> None:
        """Each optimizer the script makes is seen at once (the stop rule waits for every
        one of them, also for one that has not stepped yet)."""
        run = self.run
        cls = torch.optim.Optimizer
        original = cls.__init__

        def __init__(optimizer, *args, **kwargs):  # noqa: N807
            original(optimizer, *args, **kwargs)
            run._optimizer_made(optimizer)

        self._set(cls, "__init__", __init__)

    def _patch_sequential(self) -> None:
        run = self.run
        every = run.checkpoint_every
        original = nn.Sequential.forward
        from torch.utils.checkpoint import checkpoint_sequential

        def forward(seq, input):  # noqa: A002 - nn.Sequential's own argument name
            local = run._ckpt_local
            if getattr(local, "inside", False) or len(seq) < 2 or not seq.training or \
                    not torch.is_grad_enabled():
                return original(seq, input)
            local.inside = True
            run.n_checkpointed += 1
            try:
                # checkpoint_sequential's segments have len // segments children each
                # (the last one runs without a checkpoint): K children per checkpoint
                segments = max(1, len(seq) // every)
                return checkpoint_sequential(seq, segments, input, use_reentrant=False)
            finally:
                local.inside = False

        self._set(nn.Sequential, "forward", forward)


def _dtype_name(dtype) -> str:
    return str(dtype)


def _apply_in_place(run: _Run, module: nn.Module, fn, recurse: bool) -> nn.Module:
    """``nn.Module._apply`` (torch/nn/modules/module.py) for a module on the planner's card:
    each parameter whose tensor ``fn`` changes (moved, cast, another memory format) keeps
    its Python object, as ``param.data = fn(param)`` keeps it on a GPU; buffers are replaced
    as PyTorch does."""
    if recurse:
        for child in module.children():
            child._apply(fn)
    for key, param in module._parameters.items():
        if param is None:
            continue
        with torch.no_grad():
            applied = fn(param)
        if applied is param:  # already there (a second .to("cuda"), a tied weight)
            continue
        grad = param.grad
        if grad is not None:
            param.grad = None  # the gradient holds a use of the tensor: swap without it
        if not _swap_in(run, param, applied):
            param = nn.Parameter(applied, requires_grad=param.requires_grad)
            module._parameters[key] = param
            run.note("a parameter could not keep its object when it moved (something holds "
                     "a weak reference to it): what refers to the old one (an optimizer, "
                     "a tied weight) is not moved with it")
        if grad is not None:
            with torch.no_grad():
                param.grad = fn(grad)
    for key, buf in module._buffers.items():
        if buf is not None:
            module._buffers[key] = fn(buf)
    return module


def _fake_tensor_keys(run: _Run) -> frozenset:
    """The attributes a FakeTensor keeps in its ``__dict__`` (its fake mode, device, memos)
    and the planner's own: not carried over to what replaces a fake parameter."""
    with run.fake_mode:
        probe = torch.empty(0, device="cpu")
    return frozenset([*probe.__dict__, "_planner_truth", "_planner_value"])


def _swap_in(run: _Run, param: torch.Tensor, applied: torch.Tensor) -> bool:
    """Make ``param`` (the same Python object) hold ``applied``'s tensor: its attributes
    (``_is_param``, the script's own) kept. False when ``torch.utils.swap_tensors`` refuses
    (a weak reference or another use of either tensor)."""
    import weakref

    applied.requires_grad_(param.requires_grad)
    internal = _fake_tensor_keys(run) if run.fake_mode is not None and \
        isinstance(param, run._fake_type) else ()
    for name, value in param.__dict__.items():  # the script's own attributes, if any
        if name not in internal:
            applied.__dict__.setdefault(name, value)
    applied._is_param = True
    if run.fake_mode is not None and (weakref.getweakrefs(param) or
                                      weakref.getweakrefs(applied)):
        # the fake mode's converter memo keeps weak references to fake tensors it made (an
        # operation on a fake tensor outside the fake mode adds one: requires_grad_ above)
        memo = run.fake_mode.fake_tensor_converter.meta_converter.tensor_memo
        for k in [k for k, ref in memo.data.items() if ref() is applied or ref() is param]:
            del memo[k]
    try:
        torch.utils.swap_tensors(param, applied)
    except RuntimeError:
        return False
    return True


# ---------------------------------------------------------------------------------- the plan
@dataclasses.dataclass(repr=False)
class Plan(ShownAsTable):
    """What the planner found: see :func:`will_it_fit`.

    The verdict for each card (``cards``, ``table()``) is judged on ``needed_bytes``: the
    caching allocator's peak *reserved* bytes + the context allowance (+ DDP's buckets), with
    a margin (``margin_bytes(capacity)``: ``margin_fraction`` of the card, at least
    ``margin_min_bytes``; by default the lessons' rule, max(15 %, 2 GiB)).
    ``needed_allocated_bytes`` is the same sum with allocated bytes, shown beside it."""

    script: str
    args: list
    card: str
    steps: int
    stopped: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    context_bytes: int
    categories: dict
    peak_phase: str
    peak_line: CodeLine | None
    peak_op: str
    stand_ins: list
    saves: list
    notes: dict
    autocast_differences: list
    cards: list
    host_peak_bytes: int
    seconds: float
    fixes: dict = dataclasses.field(default_factory=dict)
    batch_arg: str | None = None
    ddp: int | None = None
    ddp_bucket_bytes: int = 0
    parameter_bytes: int = 0
    torch_cuda: str | None = None
    workers: int = 0
    batch_runs: int = 0
    phase_peaks: dict = dataclasses.field(default_factory=dict)
    margin_fraction: float = DEFAULT_MARGIN[0]
    margin_min_bytes: int = DEFAULT_MARGIN[1]
    optimizer_steps: dict = dataclasses.field(default_factory=dict)  # "Adam #1" -> steps
    script_ddp: bool = False  # the script sets up DDP itself (init_process_group / DDP)
    uses_bf16: bool = False  # the script computes in bfloat16 (autocast or bf16 weights)
    fixes_reserved: dict = dataclasses.field(default_factory=dict)  # fix -> peak reserved
    fix_notes: dict = dataclasses.field(default_factory=dict)  # fix -> why it changed nothing
    #: the ops run as CUDA would (:class:`~.cuda_dispatch.Dispatch`: op, where, model, detail)
    dispatch: list = dataclasses.field(default_factory=list)

    @property
    def needed_bytes(self) -> int:
        """Peak reserved + the context allowance (+ DDP's buckets): what a card must hold,
        the verdict's basis."""
        return self.peak_reserved_bytes + self.context_bytes + self.ddp_extra_bytes

    @property
    def needed_allocated_bytes(self) -> int:
        """Peak allocated + the context allowance (+ DDP's buckets): shown beside the
        verdict; a card with only this much would run out of memory in the caching
        allocator's model."""
        return self.peak_allocated_bytes + self.context_bytes + self.ddp_extra_bytes

    @property
    def ddp_extra_bytes(self) -> int:
        return self.ddp_bucket_bytes if self.ddp else 0

    def margin_bytes(self, capacity_bytes: int) -> int:
        """The margin kept free on a card of this capacity."""
        return max(int(self.margin_fraction * capacity_bytes), self.margin_min_bytes)

    @property
    def margin_text(self) -> str:
        return _margin_text(self.margin_fraction, self.margin_min_bytes)

    def card_fit(self, card: str) -> CardFit:
        name = card_name(card)
        for c in self.cards:
            if c.card == name:
                return c
        raise ValueError(f"card {card!r} is not in this plan")

    @property
    def smallest_card(self) -> str | None:
        """The smallest card that fits with the margin and that this torch build can
        drive."""
        fitting = [c for c in self.cards if c.fits_with_margin and c.drivable]
        return min(fitting, key=lambda c: c.capacity_bytes).card if fitting else None

    def table(self) -> Table:
        rows = []
        for c in self.cards:
            verdict = c.verdict
            if not c.drivable:
                verdict += " (this torch cannot drive it)"
            row = [c.card, fmt_bytes(c.capacity_bytes), f"{c.share:.0%}", verdict,
                   fmt_bytes(c.headroom_bytes) if c.fits else "-"]
            if self.batch_arg:
                capped = ">= " if c.batch_capped else ""
                row.append("-" if c.largest_batch is None else f"{capped}{c.largest_batch}")
                row.append("-" if c.recommended_batch is None else
                           f"{capped if c.recommended_batch == c.largest_batch else ''}"
                           f"{c.recommended_batch}")
            rows.append(row)
        headers = ["card", "capacity", "needs", "verdict", "headroom"]
        if self.batch_arg:
            headers += [f"largest {self.batch_arg}", "recommended"]
        return Table(headers, rows, title=f"{_short(self.script)} on each card (reserved + "
                     f"context; margin {self.margin_text})")

    def text(self) -> str:
        return "\n".join(self._lines())

    def _lines(self) -> list[str]:
        out = [f"Plan for {_short(self.script)} {' '.join(self.args)}".rstrip(),
               f"  ran until {self._stopped_text()} in ~{self.seconds:.1f} s on a virtual "
               f"{self.card} with fake tensors",
               f"  peak: {fmt_bytes(self.peak_reserved_bytes)} reserved by the caching "
               f"allocator ({fmt_bytes(self.peak_allocated_bytes)} allocated)",
               f"  + {fmt_bytes(self.context_bytes)} context allowance"]
        if self.ddp:
            if self.script_ddp:
                out.append(f"  DDP with {self.ddp} ranks: the script wraps its model itself, "
                           "so its buckets are in the peak; NCCL's buffers lie outside "
                           "PyTorch's allocator and are not counted")
            else:
                out.append(f"  DDP with {self.ddp} ranks: + {fmt_bytes(self.ddp_bucket_bytes)}"
                           " of gradient buckets per rank (a copy of the gradients unless "
                           "gradient_as_bucket_view=True); NCCL's buffers lie outside "
                           "PyTorch's allocator and are not counted")
        out.append(f"  = {fmt_bytes(self.needed_bytes)} per GPU: what each card is judged on "
                   f"({fmt_bytes(self.needed_allocated_bytes)} with allocated bytes)")
        out.append(f"  margin: {self.margin_text} of each card")
        out.append(f"  at the peak: {self.peak_phase}, {self.peak_op}, line "
                   f"{self.peak_line or '(not in the script)'}")
        if self.phase_peaks:
            out.append("  peak by phase: " + ", ".join(
                f"{phase} {fmt_bytes(self.phase_peaks[phase])}"
                for phase in ("forward", "backward", "optimizer", "elsewhere")
                if phase in self.phase_peaks))
        total = sum(self.categories.values()) or 1
        for cat, n in self.categories.items():
            if n:
                out.append(f"    {cat:<28} {fmt_bytes(n):>12}  {n / total:4.0%}")
        out.append("")
        out.append(self.table().text())
        for c in self.cards:
            if not c.fits and c.oom_at is not None:
                phase = _PHASE_TEXT.get(c.oom_phase, "")
                out.append(f"  {c.card}: out of memory {phase} at {c.oom_at}".replace(
                    "  at", " at"))
        if self.fixes or self.fix_notes:
            out.append("")
            out.append("Predicted peak with fixes the planner applied (script unchanged):")
            for name in {**self.fixes, **self.fix_notes}:
                if name in self.fix_notes:
                    out.append(f"  {name:<28} {self.fix_notes[name]}")
                    continue
                peak = self.fixes[name]
                change = (peak - self.peak_allocated_bytes) / self.peak_allocated_bytes
                reserved = self.fixes_reserved.get(name)
                needs = "" if reserved is None else \
                    f"needs {fmt_bytes(reserved + self.context_bytes + self.ddp_extra_bytes)}, "
                out.append(f"  {name:<28} {needs}allocated + context "
                           f"{fmt_bytes(peak + self.context_bytes)} ({change:+.0%} allocated)")
        if self.stand_ins:
            out.append("")
            out.append("Values read from GPU tensors (answered with stand-ins):")
            for s in self.stand_ins:
                out.append(f"  {s.where or '(library)'}  [{s.what} -> {s.value!r}, "
                           f"{s.count}x]")
        if self.saves:
            out.append("torch.save calls skipped:")
            for line in self.saves:
                out.append(f"  {line or '(library)'}")
        if self.dispatch:
            out.append("Run as CUDA would (the CPU's kernels keep other memory):")
            if any(d.op == "scaled_dot_product_attention" for d in self.dispatch):
                out.append(f"  (attention's backend is the {self.card}'s; another card may "
                           "take another: plan it with --gpu)")
            for d in self.dispatch:
                out.append(f"  {d.text()}")
        if self.notes:
            out.append("Notes:")
            for note, where in self.notes.items():
                out.append(f"  {note}" + (f" ({_short(where.file)}:{where.line})"
                                          if where else ""))
        return out

    def _html(self) -> str:
        import html

        return (f"<pre style='font-family: monospace; white-space: pre'>"
                f"{html.escape(self.text())}</pre>")

    def _stopped_text(self) -> str:
        if self.stopped == "steps" and len(self.optimizer_steps) > 1:
            counts = ", ".join(f"{name} {n}" for name, n in self.optimizer_steps.items())
            return f"every optimizer's {_nth(self.steps)} step (steps: {counts})"
        return {"steps": f"its {_nth(self.steps)} optimizer step",
                "ended": "the end of the script"}.get(self.stopped, self.stopped)

    def slurm(self, *, card: str | None = None, time_limit="01:00:00") -> str:
        """A SLURM batch script for the smallest card that fits with the margin (or
        ``card``), each line with its reason; lines marked ``SITE`` use names that differ
        between clusters.

        Args:
            card: the card to ask for (default: :attr:`smallest_card`).
            time_limit: ``--time``, in one of SLURM's formats ("MM", "MM:SS", "HH:MM:SS",
                "D-HH", "D-HH:MM", "D-HH:MM:SS") or a whole number of minutes.
        """
        time_limit = _slurm_time(time_limit)
        fit = self.card_fit(card) if card is not None else None
        if fit is None:
            name = self.smallest_card
            if name is None:
                raise ValueError(f"no known card fits this script with the margin "
                                 f"({self.margin_text}): apply a fix (a smaller batch, --amp, "
                                 "--checkpoint-every) first, or name a card")
            fit = self.card_fit(name)
        if not fit.drivable:
            raise ValueError(f"{fit.card} cannot run this torch build: pick another card")
        n = self.ddp if self.ddp and self.script_ddp else 1
        gres = fit.card.split("-")[0].lower()
        constraint = SLURM_FEATURES[fit.card]
        mem_gib, mem_why = self._slurm_mem(n)
        cpus = (self.workers or 3) + 1
        cpu_why = (f"the DataLoader's {self.workers} workers + the main process" if self.workers
                   else "a GUESS: the script uses no DataLoader workers; 3 more cores help "
                   "if it loads data")
        args = " ".join(_quote(a) for a in self.args)
        launch = (f"torchrun --standalone --nproc_per_node={n} {_short(self.script)} {args}"
                  if n > 1 else f"python {_short(self.script)} {args}").rstrip()
        verdict = ("fits with the margin" if fit.fits_with_margin else
                   f"{fit.verdict.upper()}: less than the margin ({self.margin_text}) left"
                   if fit.fits else "OUT OF MEMORY: it does not fit")
        directives = [
            ("--job-name=train", "any name"),
            ("--partition=gpu", "SITE: your cluster's GPU partition (sinfo lists them)"),
            ("--nodes=1", f"one node{f': {n} GPUs on it' if n > 1 else ''}"),
            ("--ntasks-per-node=1",
             "one launcher" + (" (torchrun starts the ranks)" if n > 1 else "")),
            (f"--gpus-per-node={n}", f"SITE: some clusters want --gres=gpu:{gres}:{n}"),
            (f"--constraint={constraint}", f"SITE: your cluster's feature name for the "
             f"{fit.card} (sinfo -o '%f'): {fit.share:.0%} of it needed, "
             f"{fmt_bytes(fit.headroom_bytes)} headroom, {verdict}"),
            (f"--cpus-per-task={cpus * n}", cpu_why),
            (f"--mem={mem_gib}G", mem_why),
            (f"--time={time_limit}", "your estimate: the planner does not time training"),
        ]
        width = max(len(d) for d, _ in directives) + len("#SBATCH ") + 2
        lines = ["#!/bin/bash"]
        lines += [f"{'#SBATCH ' + d:<{width}}# {why}" for d, why in directives]
        lines.insert(3, f"{'##SBATCH --account=ACCOUNT':<{width}}# SITE: remove one # and name "
                     "your project's account where the cluster asks for one")
        if self.ddp and not self.script_ddp:
            lines += ["", f"# --ddp {self.ddp}: this script does not set up DDP (no "
                      "init_process_group or DistributedDataParallel was seen), so torchrun "
                      "would run", f"# {self.ddp} independent copies: make it a DDP script "
                      "first (lesson 03); this request is for one GPU"]
        major, minor = COMPUTE_CAPABILITY[fit.card]
        # torch.cuda.is_bf16_supported(): native bf16 from compute capability 8.0; below it
        # only "including_emulation" (torch/cuda/__init__.py)
        if self.uses_bf16 and (major, minor) < (8, 0):
            lines += ["", f"# NOTE: the script computes in bfloat16, and the {fit.card} "
                      f"(compute capability {major}.{minor}) has no bfloat16 tensor cores",
                      "# (torch.cuda.is_bf16_supported() needs 8.0): bf16 is emulated and "
                      "slow there; use float16 with a GradScaler"]
        lines += ["", f"{'source .venv/bin/activate':<{width}}# SITE: your environment "
                  "(or `module load` / `conda activate` your site's PyTorch); a pip "
                  "torch brings its own CUDA",
                  # SLURM 22.05's release notes: srun no longer reads SLURM_CPUS_PER_TASK
                  "# srun does not pass --cpus-per-task on to the step since SLURM 22.05:",
                  f"srun --cpus-per-task=$SLURM_CPUS_PER_TASK {launch}"]
        return "\n".join(lines) + "\n"

    def _slurm_mem(self, n: int) -> tuple[int, str]:
        """``--mem`` in GiB and the comment that explains it."""
        if not self.host_peak_bytes:
            return 16, "SITE-SPECIFIC GUESS: host memory was not measured here"
        per_rank = (self.host_peak_bytes + CUDA_HOST_BYTES
                    + self.workers * WORKER_HOST_BYTES)
        mem_gib = max(4, math.ceil(1.25 * n * per_rank / GiB))
        parts = [f"{fmt_bytes(self.host_peak_bytes)} (this plan's process peak RSS, "
                 "building the model included)",
                 f"{fmt_bytes(CUDA_HOST_BYTES)} (an allowance for the CUDA libraries' host "
                 "memory)"]
        if self.workers:
            parts.append(f"{self.workers} DataLoader workers x "
                         f"{fmt_bytes(WORKER_HOST_BYTES)} (an allowance per worker)")
        ranks = f"{n} ranks x " if n > 1 else ""
        return mem_gib, f"host memory: {ranks}({' + '.join(parts)}) + 25 %, rounded up"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["needed_bytes"] = self.needed_bytes
        d["needed_allocated_bytes"] = self.needed_allocated_bytes
        d["smallest_card"] = self.smallest_card
        d["margin"] = self.margin_text
        for c, card in zip(d["cards"], self.cards, strict=True):
            c["verdict"] = card.verdict
            c["fits_with_margin"] = card.fits_with_margin
        return d


_PHASE_TEXT = {"forward": "in the forward pass", "backward": "in the backward pass",
               "optimizer": "in the optimizer step"}


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


# ---------------------------------------------------------------------------------- checks
def _check_script(script) -> str:
    if not isinstance(script, (str, os.PathLike)):
        raise TypeError(f"script must be the path of a Python file (a str), got "
                        f"{type(script).__name__}")
    path = os.fspath(script)
    if not os.path.isfile(path):
        raise PlanError(f"script {path!r} does not exist (or is not a file): give the path "
                        "of your training script, e.g. `python -m helpers.fit train.py`",
                        kind="missing")
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"script {path!r} cannot be read: {exc}", kind="missing") from None
    uses_torch = re.search(r"^\s*(import torch|from torch)", source, re.M)
    uses_tf = re.search(r"^\s*(import tensorflow|from tensorflow|import keras|from keras)",
                        source, re.M)
    if uses_tf and not uses_torch:
        raise PlanError(
            f"{path} is a TensorFlow/Keras script: the planner runs PyTorch scripts. For "
            "Keras, read a step's peak with tf.config.experimental.reset_memory_stats and "
            "get_memory_info (lessons 05b, 08b) or fit a memory line with "
            "helpers.measure_keras_memory (lesson 08b).", kind="tensorflow")
    return os.path.abspath(path)


def _check_card(gpu) -> str:
    if not isinstance(gpu, str):
        raise TypeError(f"gpu must be a card name (str), one of {', '.join(KNOWN_GPUS)}; "
                        f"got {type(gpu).__name__}")
    try:
        name, _ = resolve_capacity(gpu)
    except ValueError:
        name = None
    if name is None or name not in KNOWN_GPUS:
        raise ValueError(f"gpu={gpu!r} is not a known card; known cards: "
                         f"{', '.join(KNOWN_GPUS)}")
    return name


def _drivable(card: str, arch_list=None, cuda_version=None) -> bool:
    """Can this torch build run on ``card``?  A CUDA build lists its architectures
    (``sm_80``: binary code for 8.0-8.x; ``compute_90``: PTX for 9.0 and newer). A CPU build
    is judged as PyPI's CUDA build of the same torch: CUDA 13 has no Volta (7.0)."""
    major, minor = COMPUTE_CAPABILITY[card]
    cc = major * 10 + minor
    if arch_list is None:
        arch_list = torch.cuda.get_arch_list() if torch.version.cuda else []
    cuda_version = torch.version.cuda if cuda_version is None else cuda_version
    if arch_list:
        for a in arch_list:
            kind, _, num = a.partition("_")
            if not num.isdigit():
                continue
            n = int(num)
            if kind == "sm" and n // 10 == major and n <= cc:
                return True
            if kind == "compute" and n <= cc:
                return True
        return False
    cuda_major = int(str(cuda_version).split(".")[0]) if cuda_version else 13
    return cc >= (75 if cuda_major >= 13 else 50)


def _batch_argv(argv: list[str], name: str, value: int) -> list[str]:
    out = list(argv)
    for i, a in enumerate(out):
        if a == name and i + 1 < len(out):
            out[i + 1] = str(value)
            return out
        if a.startswith(name + "="):
            out[i] = f"{name}={value}"
            return out
    return [*out, name, str(value)]


def _batch_value(argv: list[str], name: str) -> int | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.startswith(name + "=") and a.split("=", 1)[1].isdigit():
            return int(a.split("=", 1)[1])
    return None


# ---------------------------------------------------------------------------------- API
def will_it_fit(script, args=(), *, gpu: str = "A100-40GB", steps: int = 2,
                strict: bool = False, batch_arg: str | None = None, multiple_of: int = 8,
                max_batch: int = 65536, amp: str | None = None,
                checkpoint_every: int | None = None, ddp: int | None = None,
                gradient_as_bucket_view: bool = False, context=DEFAULT_CONTEXT,
                max_forwards: int = 50, time_limit: float = 600.0,
                fake: bool = True, margin=None) -> Plan:
    """Plan a GPU job from an unmodified PyTorch training script (``python -m helpers.fit``).

    Args:
        script: path of the training script; it runs as ``__main__`` in a process of its
            own (:mod:`.sandbox`), with its writes sent to a throw-away folder.
        args: the script's own command-line arguments (a list of strings).
        gpu: the card the script sees (``torch.cuda.get_device_name()``, ``mem_get_info``...);
            one of ``KNOWN_GPUS``. The peak is compared with every known card either way.
        steps: stop when every optimizer the script made has stepped this many times
            (default 2: Adam's state exists from the first; the second is the steady state;
            a GAN's two optimizers both reach it). An optimizer that does not step within
            ``max_forwards`` forward passes of the others' last step is not waited for.
        strict: stop at the first value the script reads from a GPU tensor instead of
            answering it with a stand-in.
        batch_arg: the script's batch-size option (e.g. ``"--batch-size"``): also find the
            largest batch that fits each card, re-running the script.
        multiple_of: batch sizes searched are multiples of this (default 8).
        max_batch: the largest batch size searched.
        amp: ``"bf16"`` or ``"fp16"``: also predict the peak with autocast around the top
            model's forward.
        checkpoint_every: also predict the peak with activation checkpointing of every
            ``nn.Sequential`` (one checkpoint per this many children).
        ddp: also plan each rank of this many DDP processes (the script's batch per rank).
        gradient_as_bucket_view: DDP's option: True puts the gradients in the buckets
            (about no extra memory); False (DDP's default) adds a copy of the gradients.
        context: memory a card loses to the CUDA context (bytes or a size; 500 MiB).
        max_forwards: stop a script that never calls ``optimizer.step()`` after this many
            forward passes of its model (then a PlanError says so; raise it for gradient
            accumulation over more forward passes).
        time_limit: seconds one run of the script may take (at most a week); a run that
            swallows the planner's stop (a bare ``except:``) is killed a grace later.
        fake: True (default): fake tensors (full scale, nothing computed). False: real CPU
            tensors counted the same way (a reference run at small sizes, for tests).
        margin: what each card keeps free for what the planner cannot see: a percentage
            of the card (``"20%"``) or a size (``"4 GiB"``, bytes); None (default): the
            lessons' rule, max(15 %, 2 GiB). Verdicts are judged on peak reserved + context
            (+ DDP's buckets): "fits", "fits, inside the margin" or "out of memory";
            ``smallest_card``, ``slurm()`` and each card's ``recommended_batch`` keep the
            margin.

    Returns:
        A :class:`Plan`: ``needed_bytes`` (reserved + context), ``peak_allocated_bytes``,
        ``categories``, ``peak_line``, ``cards`` (verdict, headroom, the line at the
        out-of-memory error, largest and recommended batch), ``stand_ins``,
        ``saves``, ``fixes``, ``slurm()``, ``text()``.

    Raises:
        PlanError (a ValueError): the script is missing, is TensorFlow, raises its own error
            (``.details`` holds its traceback), never calls ``optimizer.step()``, uses an
            operation fake tensors cannot run, or reads a value under ``strict``.
        TypeError, ValueError: an argument is of the wrong kind or out of range.
    """
    call = dict(locals())  # every argument, for the planner's own process (sandbox.py)
    path = _check_script(script)
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise TypeError("args must be a list of strings (the script's arguments), e.g. "
                        "['--batch-size', '64']")
    card = _check_card(gpu)
    steps = positive_int(steps, "steps", 1000)
    strict = flag(strict, "strict")
    fake = flag(fake, "fake")
    if batch_arg is not None:
        batch_arg = text(batch_arg, "batch_arg")
        if not batch_arg.startswith("-"):
            raise ValueError(f"batch_arg must be the script's option, such as '--batch-size' "
                             f"(got {batch_arg!r})")
    multiple_of = positive_int(multiple_of, "multiple_of", 4096)
    max_batch = positive_int(max_batch, "max_batch")
    if amp is not None:
        amp = choice(amp, "amp", list(_AMP_DTYPES))
    if checkpoint_every is not None:
        checkpoint_every = positive_int(checkpoint_every, "checkpoint_every", 10_000)
    if ddp is not None:
        ddp = whole_number(ddp, "ddp", 1, 1024)
    gradient_as_bucket_view = flag(gradient_as_bucket_view, "gradient_as_bucket_view")
    context = resolve_capacity(context, what="context", allow_zero=True)[1]
    max_forwards = positive_int(max_forwards, "max_forwards", 100_000)
    time_limit = real_number(time_limit, "time_limit", minimum=0.1, maximum=_MAX_TIME_LIMIT)
    margin_fraction, margin_min = _check_margin(margin)
    args = list(args)
    if not sandbox.in_child():
        # the script runs in a process of its own: nothing it does reaches this one
        return sandbox.plan_in_child(call, time_limit)

    def run_once(argv, *, amp_=None, ckpt=None, quiet=False) -> _Run:
        r = _Run(path, argv, card=card, steps=steps, fake=fake, strict=strict, amp=amp_,
                 checkpoint_every=ckpt, max_forwards=max_forwards, time_limit=time_limit,
                 context=context)
        # the script prints once, in the first run; re-runs (fixes, batch sizes) are quiet
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            r.run()
        if r.stopped == "forwards":
            raise PlanError(
                f"the script never called optimizer.step() in {max_forwards} forward passes "
                "of its model: the planner plans training steps. (It stopped after those "
                f"forward passes; the peak so far was {fmt_bytes(r.gpu.peak_allocated_bytes)}.)"
                " If it accumulates gradients over more forward passes than that, raise "
                "--max-forwards (max_forwards=).", kind="no-step")
        if r.stopped == "time":
            raise PlanError(
                f"the script did not reach its {_nth(steps)} optimizer step within "
                f"time_limit={time_limit:g} s (it made {r.n_steps}); the peak so far was "
                f"{fmt_bytes(r.gpu.peak_allocated_bytes)}", kind="no-step")
        if r.n_steps == 0:
            raise PlanError("the script ended without calling optimizer.step(): the planner "
                            "plans training steps. (Did its data loader yield a batch? With "
                            "drop_last=True, a data set smaller than the batch yields none.)",
                            kind="no-step")
        return r

    main = run_once(args)
    params = {}
    bf16 = main.bf16
    for opt in main.optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    params[id(p)] = p.numel() * p.element_size()
                    bf16 = bf16 or p.dtype == torch.bfloat16
    optimizer_steps = {}
    for opt in main.optimizers:
        name = type(opt).__name__
        label = name if name not in optimizer_steps else \
            f"{name} #{sum(k.split(' #')[0] == name for k in optimizer_steps) + 1}"
        optimizer_steps[label] = main.step_counts[id(opt)]
    param_bytes = sum(params.values())
    plan = Plan(
        script=path, args=args, card=card, steps=steps, stopped=main.stopped,
        peak_allocated_bytes=main.gpu.peak_allocated_bytes,
        peak_reserved_bytes=main.gpu.peak_reserved_bytes, context_bytes=context,
        categories=main.categories, peak_phase=main.peak_phase, peak_line=main.peak_line,
        peak_op=main.peak_op, stand_ins=list(main.stand_ins.values()), saves=main.saves,
        notes=main.notes,
        autocast_differences=[(name, where, c, extra) for (name, where), (c, extra)
                              in main.autocast_diffs.items()],
        cards=[], host_peak_bytes=main.rss_peak, seconds=main.seconds, batch_arg=batch_arg,
        ddp=ddp, ddp_bucket_bytes=0 if gradient_as_bucket_view or main.ddp_wrapped
        else param_bytes,
        parameter_bytes=param_bytes, torch_cuda=torch.version.cuda,
        workers=main.used_workers, phase_peaks=dict(main.phase_peaks),
        margin_fraction=margin_fraction, margin_min_bytes=margin_min,
        optimizer_steps=optimizer_steps, script_ddp=main.script_ddp, uses_bf16=bf16,
        dispatch=list(main.dispatches.values()))
    if ddp and main.script_ddp and main.ddp_wrapped:
        plan.notes["the script wraps its model in DistributedDataParallel itself: its "
                   "buckets are in the measured peak, so --ddp adds nothing more"] = None
    if ddp and not main.script_ddp:
        plan.notes[f"--ddp {ddp}: the script does not set up DDP (no init_process_group or "
                   "DistributedDataParallel was seen): the plan is each rank's memory once "
                   "it does (lesson 03); the SLURM request is for one GPU"] = None
    for name, cap in KNOWN_GPUS.items():
        line, phase = main._crossings.get(name, (None, ""))
        needed = plan.needed_bytes
        plan.cards.append(CardFit(card=name, capacity_bytes=cap, needed_bytes=needed,
                                  fits=needed <= cap, drivable=_drivable(name),
                                  oom_at=line, oom_phase=phase,
                                  needed_allocated_bytes=plan.needed_allocated_bytes,
                                  margin_bytes=plan.margin_bytes(cap)))
    if amp is not None:
        r = run_once(args, amp_=amp, quiet=True)
        plan.fixes[f"--amp {amp}"] = r.gpu.peak_allocated_bytes
        plan.fixes_reserved[f"--amp {amp}"] = r.gpu.peak_reserved_bytes
    if checkpoint_every is not None:
        name = f"--checkpoint-every {checkpoint_every}"
        try:
            r = run_once(args, ckpt=checkpoint_every, quiet=True)
        except PlanError as exc:  # e.g. an in-place op at a segment's edge: the plan stands
            r = None
            why = (" (an in-place operation, such as ReLU(inplace=True), at the edge of a "
                   "checkpointed segment breaks its recomputation)"
                   if "inplace operation" in str(exc) else "")
            plan.fix_notes[name] = f"could not be applied (no prediction): {exc}{why}"
        if r is not None:
            plan.fixes[name] = r.gpu.peak_allocated_bytes
            plan.fixes_reserved[name] = r.gpu.peak_reserved_bytes
        if r is not None and r.n_checkpointed == 0:
            plan.fix_notes[name] = (
                "nothing was wrapped: no nn.Sequential with 2 or more children ran in "
                "training mode (a model built from an nn.ModuleList, such as most "
                "transformers, needs torch.utils.checkpoint in its own forward)")
    if batch_arg is not None:
        _search_batches(plan, args, batch_arg, multiple_of, max_batch,
                        lambda argv: run_once(argv, quiet=True).gpu.peak_reserved_bytes)
    return plan


def _search_batches(plan: Plan, args, name, multiple_of, max_batch, measure) -> None:
    """The largest batch (a multiple of ``multiple_of``) that fits each card, and the
    largest that fits with the plan's margin (``recommended_batch``), by re-running the
    script (``measure`` gives the peak reserved bytes). Memory is close to a line in the
    batch size, so each card's next size is the line's prediction through the two measured
    sizes nearest its capacity (a secant step), kept inside the bracket known so far; a
    card is done when a size fits and the next multiple does not. Sizes are measured once
    for all cards together."""
    memo: dict[int, int] = {}
    extra = plan.context_bytes + plan.ddp_extra_bytes
    m = multiple_of
    top = max_batch // m * m

    def needed(b: int) -> int:
        if b not in memo:
            memo[b] = measure(_batch_argv(args, name, b)) + extra
        return memo[b]

    given = _batch_value(args, name)
    a = max(m, min(top, (given or 32) // m * m))
    b = min(top, a + max(m, a // m * m))
    if b == a:
        b = a - m if a > m else a
    na, nb = needed(a), needed(b)
    if a != b and nb == na:
        raise PlanError(f"changing {name} from {a} to {b} did not change the peak: is it the "
                        "script's batch-size option, and is the data set larger than the "
                        "batch?", kind="batch-arg")
    saturated: set[int] = set()

    def largest(cap: int) -> int | None:
        """The largest measured size whose need is at most ``cap``, measuring more."""
        lo = hi = None
        for _ in range(30):
            fits = sorted(x for x, n in memo.items() if n <= cap)
            fails = sorted(x for x, n in memo.items() if n > cap)
            lo = fits[-1] if fits else None
            hi = next((x for x in fails if lo is None or x > lo), None)
            if lo is not None and (lo >= top or (hi is not None and hi - lo <= m)):
                break
            if lo is None and hi is not None and hi <= m:
                break
            # the two measured sizes nearest the capacity give the line's prediction
            near = sorted(memo, key=lambda x: abs(memo[x] - cap))[:2]
            x0, x1 = sorted(near)
            slope = (memo[x1] - memo[x0]) / (x1 - x0) if x1 != x0 else 0
            if slope <= 0:
                if lo is not None and hi is None:
                    saturated.add(lo)  # a larger batch cost nothing more
                    break
                guess = (lo + hi) // 2 if lo is not None else hi // 2
            else:
                guess = int(x0 + (cap - memo[x0]) / slope)
            x = max(m, min(top, guess // m * m))
            if lo is not None and x <= lo:
                x = lo + m
            if hi is not None and x >= hi:
                x = hi - m
            if x in memo:  # nothing new to learn: halve the bracket instead
                x = ((lo or 0) + (hi or 2 * top)) // 2 // m * m
                if x in memo or x < m or x > top:
                    break
            needed(x)
        half = (lo or 0) // 2 // m * m
        if lo is not None and lo > b and half >= m and needed(lo) <= needed(half):
            saturated.add(half)  # twice the batch cost nothing more: the data set limits it
            lo = None
        return lo

    for c in plan.cards:
        c.largest_batch = largest(c.capacity_bytes)
        c.batch_capped = c.largest_batch is not None and c.largest_batch + m > top
        c.recommended_batch = largest(c.capacity_bytes - c.margin_bytes) \
            if c.largest_batch is not None else None
    plan.batch_runs = len(memo)
    if saturated:
        plan.notes[f"beyond {name} {min(saturated)}, a larger {name} did not change the "
                   "peak: the data set (or the script) limits the batch, so cards with room "
                   "for more show no largest batch"] = None
