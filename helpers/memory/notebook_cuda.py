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
functions and ``except torch.OutOfMemoryError``. On a machine with a GPU, leave the block out
(``contextlib.nullcontext()``) and the same lines run on the card.

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

import contextlib
import math
import os
import sys
import sysconfig

from ..core.checks import flag
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
