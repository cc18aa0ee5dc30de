"""Out-of-memory errors: which errors are one, and releasing what a failed step held.

Used by the batch-size finder, the out-of-memory challenge (lesson 08) and the GPU tests.
Nothing here imports torch or TensorFlow until it is called.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import traceback

__all__ = ["is_oom_error", "warm_up_cuda", "release_after_error"]

# Messages of out-of-memory errors that are not (or not always) torch.OutOfMemoryError: the
# CUDA runtime's (torch.AcceleratorError), and cuBLAS's and cuDNN's own allocation failures,
# which do not go through the caching allocator ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when
# calling ...", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED" in cuDNN 8, the two
# CUDNN_STATUS_INTERNAL_ERROR_*_ALLOCATION_FAILED statuses in cuDNN 9).  Only these: a
# version mismatch, an unsupported input or a sticky CUDA error ("illegal memory access",
# "device-side assert") is a broken run, and the batch-size search must stop on it.
_OOM_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    "MPS backend out of memory",
    "XPU out of memory",
    "DefaultCPUAllocator: can't allocate memory",
)


def is_oom_error(exc: BaseException) -> bool:
    """Is ``exc`` an out-of-memory error of PyTorch (CUDA, virtual GPU, ...) or TensorFlow?

    True for ``torch.OutOfMemoryError``, TensorFlow's ``ResourceExhaustedError`` and a
    ``RuntimeError`` (``torch.AcceleratorError`` included) whose message is one of CUDA's,
    cuBLAS's or cuDNN's allocation failures; False for every other error.
    """
    if not isinstance(exc, BaseException):
        raise TypeError(f"exc must be an exception, got {type(exc).__name__}")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    for cls in type(exc).__mro__:  # without importing TensorFlow
        if cls.__name__ == "ResourceExhaustedError" and cls.__module__.startswith("tensorflow"):
            return True
    if isinstance(exc, RuntimeError) and exc.args and isinstance(exc.args[0], str):
        return any(text in exc.args[0] for text in _OOM_MESSAGES)
    return False


def warm_up_cuda(device=None, *, streams=None) -> None:
    """Create cuBLAS's workspaces before reading a memory baseline on a CUDA device.

    The first matrix multiplication on a (thread, stream) takes a cuBLAS(Lt) workspace from
    the caching allocator, and the first backward takes another on autograd's device thread.
    ``torch.cuda.memory_allocated()`` counts them and ``torch.cuda.empty_cache()`` never
    frees them, so a "memory is back where it started" check must read its baseline after
    them.  This runs a small matmul and a ``Linear`` with bias (cuBLASLt), forward and
    backward, on each stream in ``streams`` (default: the current stream), then synchronises.
    Used by :func:`find_batch_size` and the GPU tests.

    Args:
        device: a CUDA device (default: the current one).
        streams: the ``torch.cuda.Stream`` objects the code to be measured uses.
    """
    import torch

    from ..core.checks import device_arg

    if isinstance(device, int) and not isinstance(device, bool):
        device = f"cuda:{device}" if device >= 0 else str(device)
    device = device_arg("cuda" if device is None else device, "device")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for stream in [None] if streams is None else list(streams):
        with (torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()), \
                torch.enable_grad():
            w = torch.ones(16, 16, device=device, requires_grad=True)
            bias = torch.zeros(16, device=device, requires_grad=True)
            (torch.nn.functional.linear(w, w, bias) @ w).sum().backward()
            del w, bias
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_after_error(exc: BaseException | None, empty_cache=None, *,
                        last_error: bool = True) -> None:
    """Free what a failed step still holds, then return cached blocks.

    The frames of an error's traceback (and of the errors it was raised from or during)
    keep the step's tensors alive: their frames are cleared, the garbage collected, then
    ``empty_cache`` (a memory source's method, or ``None``) is called.

    Args:
        exc: the error a step raised, or ``None``.
        empty_cache: called last, to hand cached blocks back.
        last_error: also release the error that ended an earlier notebook cell, which
            IPython keeps for ``%debug``: ``sys.last_exc`` (Python 3.12 and later, read with
            ``getattr`` so that 3.11 works too) and ``sys.last_value``/``last_traceback``.
            Their frames are cleared and the four names set to ``None``.
    """
    errors = [exc]
    if last_error:
        errors += [getattr(sys, "last_exc", None), getattr(sys, "last_value", None)]
        tb = getattr(sys, "last_traceback", None)
        if tb is not None:
            traceback.clear_frames(tb)
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name):  # last_exc: Python >= 3.12 (or IPython) only
                setattr(sys, name, None)
    seen = set()
    for exc in errors:
        while isinstance(exc, BaseException) and id(exc) not in seen:
            seen.add(id(exc))
            traceback.clear_frames(exc.__traceback__)
            exc.__traceback__ = None
            exc = exc.__cause__ or exc.__context__
    gc.collect()
    if empty_cache is not None:
        empty_cache()
