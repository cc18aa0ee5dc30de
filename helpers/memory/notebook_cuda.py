"""``helpers.virtual_cuda``: plain CUDA code in a notebook, on a virtual card, on any machine.

::

    with helpers.virtual_cuda("L40S") as gpu:        # gpu: the helpers.VirtualGPU
        device = "cuda"
        model = nn.Linear(4096, 4096).to(device)
        x = torch.randn(512, 4096, device=device)
        torch.cuda.reset_peak_memory_stats()
        model(x).sum().backward()
        print(torch.cuda.max_memory_allocated())     # exact, from the virtual card
        torch.randn(10**12, device=device)           # torch.OutOfMemoryError, CUDA's message

The learner's lines are the ones they run on their cluster: ``device="cuda"``,
``.to(device)``, ``.cuda()``, ``torch.cuda.memory_allocated()/memory_reserved()/
max_memory_allocated()/max_memory_reserved()/reset_peak_memory_stats()/mem_get_info()/
memory_stats()/memory_summary()/empty_cache()/synchronize()``, ``torch.accelerator``'s
functions and ``except torch.OutOfMemoryError``; also a memory snapshot:
``torch.cuda.memory._record_memory_history(max_entries=..., stacks="python")`` starts
recording the simulated allocator's events, ``torch.cuda.memory._snapshot()`` returns them in
PyTorch's snapshot format (``segments``, ``device_traces``: ``alloc``, ``free_requested``,
``free_completed``, ``segment_alloc``, ``segment_free``, ``oom``, each with the Python frames
that made it), ``_dump_snapshot(path)`` pickles it for https://pytorch.org/memory_viz and
``_record_memory_history(enabled=None)`` stops and clears the history. On a machine with a
GPU, leave the block out (``contextlib.nullcontext()``) and the same lines run on the card.

This is the planner's device-scoped full scale (:mod:`helpers.memory.planner`, which runs
whole scripts this way for ``python -m helpers.fit``) made available to notebook cells:

* what the code puts on the GPU becomes a *fake* tensor: exact shape, dtype and bytes, no
  data and no compute (ResNet-50 at batch 1,024 takes milliseconds). The card's memory is
  PyTorch's caching allocator, simulated (512-byte blocks, 2 and 20 MiB segments), plus a
  CUDA context (500 MiB by default, as ``nvidia-smi`` shows after the first CUDA call);
* going over the card raises a real ``torch.OutOfMemoryError`` with CUDA's message;
* host tensors stay real and are not counted, as on a real GPU.

Its limits, which a lesson must respect: fake tensors have **no values**. A value read from a
GPU tensor (``loss.item()``, ``print(t)``, ``t.cpu()``) gets a stand-in (1.0, zeros), and each
cell line that asked is listed in :attr:`virtual_cuda.stand_ins`; so use it where memory is
the lesson, never where a loss must fall. Fake tensors report ``device='cpu'``. What the
planner cannot see (cuDNN/cuBLAS workspaces unless ``workspaces=True``, fragmentation over a
long run, CUDA-only kernels such as flash attention, NCCL's buffers) it cannot see here
either. ``torch.save`` inside the block is skipped (the tensors have no data) and listed;
``torch.compile`` returns the model unchanged; DataLoaders run without workers or pinned
memory. Seeds, TF32/cuDNN switches, the default dtype, the environment and the working folder
are put back on exit; tensors made inside are fake and must not be used after the block.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import pickle
import sys
import sysconfig
import time
from unittest import mock

import torch

from ..core.checks import flag
from .allocator import SMALL_BUFFER, SimulatedOOM
from .capacity import resolve_capacity
from .planner import (
    _HELPERS_DIR,
    _TORCH_DIR,
    DEFAULT_CONTEXT,
    StandIn,
    _DeviceMode,
    _Patches,
    _Run,
)

__all__ = ["virtual_cuda"]

_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_NEVER = sys.maxsize  # steps and forward passes: a notebook block never stops on a count
_SEGMENT_ALIGN = 2 * 1024**2  # simulated segment addresses: 2 MiB apart at least


class _CellRun(_Run):
    """The planner's run, for the cells inside one ``with`` block: no script, no step limit,
    and the card's own capacity as the limit (a real OutOfMemoryError past it)."""

    def __init__(self, card: str, context: int, workspaces: bool):
        super().__init__(os.path.join(os.getcwd(), "<notebook cells>"), [], card=card,
                         steps=_NEVER, fake=True, strict=False, amp=None,
                         checkpoint_every=None, max_forwards=_NEVER, time_limit=math.inf,
                         context=context, workspaces=workspaces)
        self.gpu._allocator.limit = self.gpu.capacity_bytes - self.gpu.context_bytes
        self._limits = []  # no per-card crossings: there is one card

    def _is_user_file(self, filename: str) -> bool:
        """A notebook cell (ipykernel's files) or the learner's own module: not the kit,
        torch, an installed package or the standard library."""
        return not (filename.startswith((_HELPERS_DIR, _TORCH_DIR, _STDLIB))
                    or "site-packages" in filename or "dist-packages" in filename)


class virtual_cuda:  # noqa: N801 - used like a function: ``with helpers.virtual_cuda(...):``
    """Run plain CUDA code on a virtual card (see the module's docstring).

    Args:
        card: a known card (``"L40S"``, ``"A100-80GB"``, ``"H100-80GB"``, ``"T4"``... see
            ``helpers.KNOWN_GPUS``) or a size (``"24 GiB"``).
        context_bytes: what the CUDA context takes before any tensor (bytes or a size
            string); default 500 MiB. ``torch.cuda.mem_get_info()`` counts it as used.
        workspaces: also charge cuBLAS/cuDNN workspaces as a real card does (default off).

    ``with virtual_cuda(...) as gpu`` gives the :class:`~helpers.VirtualGPU`; after the block
    :attr:`stand_ins` lists the values read from GPU tensors and :attr:`notes` what ran
    differently (a skipped ``torch.save``, a DataLoader without workers).
    """

    def __init__(self, card="L40S", *, context_bytes=DEFAULT_CONTEXT, workspaces=False):
        name, capacity = resolve_capacity(card)
        context = resolve_capacity(context_bytes, what="context_bytes", allow_zero=True)[1]
        if context >= capacity:
            raise ValueError(f"context_bytes ({context} bytes) must be smaller than the "
                             f"card ({capacity} bytes)")
        self.card = name if name is not None else card
        self._card_arg = card
        self.context_bytes = context
        self.workspaces = flag(workspaces, "workspaces")
        self._run: _CellRun | None = None
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self):
        if self._stack is not None:
            raise RuntimeError("this virtual_cuda block is already running; make a new "
                               "helpers.virtual_cuda(...) for another block")
        run = _CellRun(self._card_arg, self.context_bytes, self.workspaces)
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(_Patches(run))
            stack.enter_context(run.gpu)
            stack.enter_context(_DeviceMode(run))
            stack.enter_context(_MemoryHistory(run.gpu))
        except BaseException:
            stack.close()
            raise
        self._run, self._stack = run, stack
        return run.gpu

    def __exit__(self, *exc):
        stack, self._stack = self._stack, None
        if stack is None:
            raise RuntimeError("virtual_cuda.__exit__ without __enter__ (use `with "
                               "helpers.virtual_cuda(...) as gpu:`)")
        return stack.__exit__(*exc)

    @property
    def gpu(self):
        """The virtual card of the last block (None before the first)."""
        return None if self._run is None else self._run.gpu

    @property
    def stand_ins(self) -> list[StandIn]:
        """Values read from GPU tensors, which got stand-ins: what, the cell line, how often."""
        return [] if self._run is None else list(self._run.stand_ins.values())

    @property
    def notes(self) -> list[str]:
        """What ran differently from a real GPU (a skipped ``torch.save``, a DataLoader
        without workers), each with the cell line where it happened."""
        if self._run is None:
            return []
        run = self._run
        out = [f"{text} ({where})" if where else text for text, where in run.notes.items()]
        out += [f"torch.save skipped (fake tensors have no data) ({where})"
                for where in run.saves]
        return out

    def __repr__(self) -> str:
        state = "running" if self._stack is not None else "not running"
        return f"virtual_cuda({self.card!r}, {state})"


# ---------------------------------------------------------------------- memory history
_BASE_ADDRESS = 0x7F0000000000  # where the simulated card's first segment starts
_ENABLED = (None, "state", "all")
_CONTEXTS = (None, "state", "alloc", "all")
_STACKS = ("python", "all")
_NOT_USER_TORCH = tuple(os.path.join(_TORCH_DIR, part) for part in (
    "_subclasses", "_ops.py", "utils" + os.sep + "_python_dispatch.py", "_prims", "_refs",
    "_decomp", "_meta_registrations.py"))


class _MemoryHistory:
    """``torch.cuda.memory._record_memory_history``/``_snapshot``/``_dump_snapshot`` on the
    virtual card: the simulated allocator's events in PyTorch's snapshot format."""

    def __init__(self, gpu):
        self.alloc = gpu._allocator
        self.gpu = gpu
        self.enabled = None  # None, "state" or "all"
        self.context = None
        self.trace: collections.deque = collections.deque()
        self.live: dict[int, tuple] = {}  # id(block) -> (block, requested bytes, frames)
        self.addresses: dict[int, int] = {}  # segment id -> address
        self._next_address = _BASE_ADDRESS
        self._patches = contextlib.ExitStack()

    # -------------------------------------------------------------- patching
    def __enter__(self):
        a = self.alloc
        if not hasattr(a, "segments"):
            return self  # an exact allocator: no segments, no history
        memory = torch.cuda.memory
        with self._patches:  # closed (everything put back) only if a patch fails
            for owner, name, value in (
                    (a, "malloc", self._malloc), (a, "free", self._free),
                    (a, "empty_cache", self._empty_cache),
                    (memory, "_record_memory_history", self._record_memory_history),
                    (memory, "_snapshot", self._snapshot),
                    (memory, "_dump_snapshot", self._dump_snapshot),
                    (memory, "memory_snapshot", self.memory_snapshot),
                    (torch.cuda, "memory_snapshot", self.memory_snapshot)):
                self._patches.enter_context(mock.patch.object(owner, name, value))
            self._patches = self._patches.pop_all()
        return self

    def __exit__(self, *exc):
        self._patches.close()  # every patched name put back, in reverse order
        return False

    # -------------------------------------------------------------- the allocator's events
    def _frames(self, wanted: bool) -> list[dict]:
        if not wanted:
            return []
        out, frame = [], sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            if not (name.startswith(_HELPERS_DIR) or name.startswith(_NOT_USER_TORCH)):
                out.append({"filename": name, "line": frame.f_lineno,
                            "name": frame.f_code.co_name})
            frame = frame.f_back
        return out  # innermost first, as PyTorch records them

    def _address(self, segment: int) -> int:
        if segment not in self.addresses:
            size = self.alloc.segments.get(segment, 0)
            self.addresses[segment] = self._next_address
            self._next_address += -(-max(size, 1) // _SEGMENT_ALIGN) * _SEGMENT_ALIGN
        return self.addresses[segment]

    def _event(self, action: str, addr: int, size: int, frames: list, **extra) -> None:
        if self.enabled == "all":
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                               "time_us": time.time_ns() // 1000, "frames": frames, **extra})

    def _malloc(self, n_bytes: int, quiet: bool = False):
        a = self.alloc
        segments_before = a.n_segments  # a new segment counts here (cheaper than a copy)
        try:
            block = type(a).malloc(a, n_bytes, quiet)
        except SimulatedOOM as err:
            free = self.gpu.capacity_bytes - self.gpu.context_bytes - a.reserved_bytes
            self._event("oom", 0, err.alloc_size,
                        self._frames(self.context in ("alloc", "all")), device_free=free)
            raise
        if block is None:
            return None
        if a.n_segments != segments_before:  # at most one: the block's own
            self._event("segment_alloc", self._address(block.segment),
                        a._segment_sizes[block.segment],
                        self._frames(self.context in ("alloc", "all")))
        recording = self.enabled is not None and self.context is not None
        frames = self._frames(recording)
        self.live[id(block)] = (block, n_bytes, frames)
        self._event("alloc", self._address(block.segment) + block.offset, block.size,
                    frames if self.context in ("alloc", "all") else [])
        return block

    def _free(self, block) -> None:
        if block is None:
            return
        self.live.pop(id(block), None)
        addr, size = self._address(block.segment) + block.offset, block.size
        frames = self._frames(self.context == "all")
        type(self.alloc).free(self.alloc, block)
        self._event("free_requested", addr, size, frames)
        self._event("free_completed", addr, size, frames)

    def _empty_cache(self) -> None:
        a = self.alloc
        before = a.segments
        type(a).empty_cache(a)
        for seg in sorted(set(before) - set(a.segments)):
            self._event("segment_free", self._address(seg), before[seg],
                        self._frames(self.context == "all"))
            self.addresses.pop(seg)

    # -------------------------------------------------------------- torch.cuda.memory's API
    def _record_memory_history(self, enabled="all", context="all", stacks="all",
                               max_entries=sys.maxsize, device=None, clear_history=False,
                               compile_context=False, global_record_annotations=False,
                               skip_actions=None):
        """``torch.cuda.memory._record_memory_history`` on the virtual card."""
        if isinstance(enabled, bool):  # the legacy form: _record_memory_history(True)
            enabled = "all" if enabled else None
        for value, name, accepted in ((enabled, "enabled", _ENABLED),
                                      (context, "context", _CONTEXTS),
                                      (stacks, "stacks", _STACKS)):
            if value not in accepted:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, accepted))}, "
                                 f"not {value!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) \
                or max_entries < 1:
            raise ValueError(f"max_entries must be a whole number >= 1, not {max_entries!r}")
        self._check_device(device)
        flag(clear_history, "clear_history")
        if skip_actions:
            raise ValueError("skip_actions is not simulated on the virtual card; leave it out")
        self.enabled = enabled
        self.context = context if enabled is not None else None
        if enabled is None or clear_history:
            self.trace.clear()
        self.trace = collections.deque(self.trace, maxlen=max_entries)

    def _check_device(self, device) -> None:
        if device is None:
            return
        try:
            if isinstance(device, bool):
                raise TypeError
            d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        except (TypeError, RuntimeError, ValueError):
            d = None
        if d is None or d.type != "cuda" or d.index not in (None, 0):
            raise ValueError(f"the virtual card is cuda:0; device {device!r} is not it")

    def _segments(self) -> list[dict]:
        a = self.alloc
        heads: dict[int, object] = {}
        blocks = [b for b, _, _ in self.live.values()]
        for pool in (a._small, a._large):
            blocks += list(pool.blocks.values())
        for block in blocks:
            head = block
            while head.prev is not None:
                head = head.prev
            heads[block.segment] = head
        live = {id(b): (n, frames) for b, n, frames in self.live.values()}
        out = []
        for seg in sorted(a.segments, key=self._address):
            addr, total = self._address(seg), a.segments[seg]
            rows, block = [], heads.get(seg)
            while block is not None:
                n, frames = live.get(id(block), (block.size, []))
                state = "inactive" if block.free else "active_allocated"
                rows.append({"address": addr + block.offset, "size": block.size,
                             "requested_size": n if not block.free else block.size,
                             "state": state, "frames": [] if block.free else frames})
                block = block.next
            if not rows:  # a segment allocated outside the simulated pools' view
                rows = [{"address": addr, "size": total, "requested_size": total,
                         "state": "active_allocated", "frames": []}]
            used = sum(r["size"] for r in rows if r["state"] == "active_allocated")
            out.append({"device": 0, "address": addr, "total_size": total, "stream": 0,
                        "segment_type": "small" if total <= SMALL_BUFFER else "large",
                        "segment_pool_id": (0, 0), "allocated_size": used,
                        "active_size": used,
                        "requested_size": sum(r["requested_size"] for r in rows
                                              if r["state"] == "active_allocated"),
                        "is_expandable": False, "frames": [], "blocks": rows})
        return out

    def _snapshot(self, device=None, augment_with_fx_traces=False):
        """``torch.cuda.memory._snapshot``: ``{"segments": [...], "device_traces": [[...]]}``."""
        self._check_device(device)
        flag(augment_with_fx_traces, "augment_with_fx_traces")
        return {"segments": self._segments(), "device_traces": [list(self.trace)],
                "allocator_settings": {}, "external_annotations": []}

    def _dump_snapshot(self, filename="dump_snapshot.pickle", augment_with_fx_traces=False):
        """``torch.cuda.memory._dump_snapshot``: the snapshot, pickled (opens in
        https://pytorch.org/memory_viz)."""
        if not isinstance(filename, str | os.PathLike):
            raise TypeError(f"filename must be a path, not {type(filename).__name__}")
        snapshot = self._snapshot(augment_with_fx_traces=augment_with_fx_traces)
        with open(filename, "wb") as f:
            pickle.dump(snapshot, f)

    def memory_snapshot(self, mempool_id=None):
        """``torch.cuda.memory_snapshot``: the snapshot's segments."""
        return self._segments()
