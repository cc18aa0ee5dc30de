"""Library workspaces on a virtual GPU: what cuBLAS and cuDNN take through PyTorch's allocator.

On a real GPU two libraries take memory that no tensor of yours holds, and both take it
through PyTorch's caching allocator, so ``memory_allocated()`` and ``memory_reserved()`` count
it (it is *not* part of the CUDA context):

* **cuBLAS** (matrix products: ``mm``, ``addmm``, ``bmm``, ... so every ``nn.Linear``): PyTorch
  gives each (cuBLAS handle, CUDA stream) pair one workspace, allocated by the first matrix
  product that runs on it and kept afterwards (``torch._C._cuda_clearCublasWorkspaces()``
  frees them).  Handles are per thread, and autograd runs a GPU's backward pass on its own
  device thread, so a training step holds two: one for the forward pass, one for the
  backward pass.  cuBLASLt shares the cuBLAS workspace (``TORCH_CUBLASLT_UNIFIED_WORKSPACE``
  is on by default in open-source CUDA builds; see ``torch.backends.cuda.blas_workspace_size``).
* **cuDNN** (convolutions): each convolution allocates the workspace its chosen cuDNN engine
  asks for, for the duration of the call, and frees it again.  PyTorch sets no fixed size:
  an engine asks for anything from 0 to hundreds of MiB; when its workspace does not fit,
  PyTorch tries the next engine instead of failing (``aten/src/ATen/native/cudnn/Conv_v8.cpp``,
  ``try_configs``).  The documented environment variable ``CUDNN_CONV_WSCAP_DBG`` (MiB) caps
  it.  The virtual GPU charges a stated allowance per convolution, an upper bound when the
  real run sets the same cap.

Sizes (PyTorch ``aten/src/ATen/cuda/CublasHandlePool.cpp``, ``parseChosenWorkspaceSize``):
``CUBLAS_WORKSPACE_CONFIG`` is a list of ``:SIZE:COUNT`` pairs, ``SIZE`` in KiB, summed
(``":4096:8"`` is 32 MiB, ``":4096:2:16:8"`` is 8 MiB + 128 KiB, ``":0:0"`` turns the
workspace off).  Unset, PyTorch uses ``4096 KiB x 8`` = 32 MiB on compute capability 9.x
(Hopper: H100, H200) and ``:4096:2:16:8`` = 8,519,680 bytes on earlier cards (the
8,519,680 bytes that a single ``nn.Linear`` leaves in ``memory_allocated()`` on an A10G,
pytorch/pytorch issue 95668).  Recent sources use 32 MiB on Blackwell (10.x-12.x) too.

The engine (:mod:`.engine`) charges these sizes when a VirtualGPU has ``workspaces=True``
(``measure_step`` reports them as the category ``"workspace"``, in every peak);
:func:`first_matmul_memory` measures the cuBLAS workspace on a real GPU or a virtual one.
torch is imported only inside :func:`first_matmul_memory`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..core.checks import positive_int, shown

__all__ = ["Workspaces", "CUBLAS_OPS", "CUDNN_OPS", "parse_cublas_workspace_config",
           "default_cublas_workspace", "DEFAULT_CUDNN_WORKSPACE", "KiB", "MiB",
           "FirstMatmul", "first_matmul_memory", "cublas_workspace_bytes"]

KiB = 1024
MiB = 1024**2

#: ATen operations that run through a cuBLAS handle on a GPU (``nn.Linear`` is ``addmm`` or
#: ``mm``; ``matmul`` and ``einsum`` reach ``mm``/``bmm``; attention's math path uses ``bmm``).
CUBLAS_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
    "_addmm_activation", "_scaled_mm", "_int_mm",
})
#: ATen operations that run cuDNN convolutions on a GPU (forward and backward).
CUDNN_OPS = frozenset({
    "convolution", "convolution_backward", "_convolution", "cudnn_convolution",
    "cudnn_convolution_transpose", "cudnn_convolution_relu", "cudnn_convolution_add_relu",
})

#: The kit's cuDNN allowance per convolution when neither ``cudnn_workspace=`` nor
#: ``CUDNN_CONV_WSCAP_DBG`` gives one: 64 MiB (run the real GPU with
#: ``CUDNN_CONV_WSCAP_DBG=64`` and the allowance is an upper bound there too).
DEFAULT_CUDNN_WORKSPACE = 64 * MiB

_PAIR = re.compile(r":(\d+):(\d+)")
_CONFIG = re.compile(r"(?::\d+:\d+)+")
_PRE_HOPPER_DEFAULT = 4096 * KiB * 2 + 16 * KiB * 8  # ":4096:2:16:8" = 8,519,680 bytes
_HOPPER_DEFAULT = 4096 * KiB * 8  # 32 MiB


def parse_cublas_workspace_config(text, name: str = "CUBLAS_WORKSPACE_CONFIG") -> int:
    """Bytes of cuBLAS workspace for a ``CUBLAS_WORKSPACE_CONFIG`` value (``":4096:8"``).

    ``:SIZE:COUNT`` pairs, ``SIZE`` in KiB, summed as PyTorch sums them.  TypeError for a
    non-string; ValueError (naming the variable) for anything that is not one or more pairs:
    PyTorch would only warn and fall back to its default, which hides the typo.
    """
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string such as ':4096:8', got "
                        f"{type(text).__name__}: {shown(text)}")
    value = text.strip()
    if not _CONFIG.fullmatch(value):
        raise ValueError(
            f"{name}={shown(text)} is not a list of ':SIZE:COUNT' pairs (SIZE in KiB), e.g. "
            "':4096:8' (32 MiB) or ':4096:2:16:8' (8 MiB + 128 KiB); ':0:0' turns the "
            "workspace off. PyTorch would warn and use its default size instead."
        )
    return sum(int(size) * KiB * int(count) for size, count in _PAIR.findall(value))


def default_cublas_workspace(compute_capability=None) -> int:
    """PyTorch's cuBLAS workspace when ``CUBLAS_WORKSPACE_CONFIG`` is unset: 32 MiB on
    compute capability 9.x-12.x (Hopper, Blackwell), ``:4096:2:16:8`` = 8,519,680 bytes on
    earlier cards or when the card is not known (``None``)."""
    if compute_capability is not None and 9 <= compute_capability[0] <= 12:
        return _HOPPER_DEFAULT
    return _PRE_HOPPER_DEFAULT


def _cudnn_cap(raw, name: str = "CUDNN_CONV_WSCAP_DBG") -> int:
    """Bytes for a ``CUDNN_CONV_WSCAP_DBG`` value (whole MiB); ValueError naming it."""
    text = raw.strip()
    if not text.isdigit():
        raise ValueError(f"{name}={shown(raw)} must be a whole number of MiB, e.g. 64")
    return int(text) * MiB


class Workspaces:
    """The workspace sizes a virtual GPU charges, and the cuBLAS workspaces it holds.

    Args:
        cublas_bytes: one cuBLAS workspace (bytes).
        cudnn_bytes: the allowance per convolution (bytes).
        sources: where each size came from, for messages (``{"cublas": ..., "cudnn": ...}``).
    """

    def __init__(self, cublas_bytes: int, cudnn_bytes: int, sources: dict):
        self.cublas_bytes = cublas_bytes
        self.cudnn_bytes = cudnn_bytes
        self.sources = dict(sources)
        self.held: dict = {}  # key ("forward thread <id>" / "backward") -> allocator handle
        self.cudnn_fallbacks = 0  # convolutions whose allowance did not fit

    @classmethod
    def resolve(cls, *, compute_capability=None, cublas=None, cudnn=None,
                environ=None) -> Workspaces:
        """Sizes from the arguments (bytes, already validated), else the environment
        (``CUBLAS_WORKSPACE_CONFIG``, ``CUDNN_CONV_WSCAP_DBG``), else the defaults."""
        env = os.environ if environ is None else environ

        def cublas_default():
            cc = "" if compute_capability is None else \
                f" for compute capability {compute_capability[0]}.{compute_capability[1]}"
            return default_cublas_workspace(compute_capability), f"PyTorch's default{cc}"

        def cudnn_from_env(raw):
            cap = _cudnn_cap(raw)
            return cap, f"CUDNN_CONV_WSCAP_DBG={cap // MiB}"

        sources = {}
        cublas_bytes, sources["cublas"] = _first_set(
            cublas, "cublas_workspace=", env, "CUBLAS_WORKSPACE_CONFIG",
            lambda raw: (parse_cublas_workspace_config(raw), f"CUBLAS_WORKSPACE_CONFIG={raw}"),
            cublas_default)
        cudnn_bytes, sources["cudnn"] = _first_set(
            cudnn, "cudnn_workspace=", env, "CUDNN_CONV_WSCAP_DBG", cudnn_from_env,
            lambda: (DEFAULT_CUDNN_WORKSPACE, "the kit's allowance"))
        return cls(cublas_bytes, cudnn_bytes, sources)

    @property
    def held_bytes(self) -> int:
        """Bytes of cuBLAS workspaces held now."""
        return self.cublas_bytes * len(self.held)

    def __repr__(self) -> str:
        return (f"Workspaces(cublas={self.cublas_bytes} bytes ({self.sources['cublas']}), "
                f"cudnn={self.cudnn_bytes} bytes ({self.sources['cudnn']}), "
                f"held={len(self.held)})")


def _first_set(value, argument: str, env, variable: str, from_env, default) -> tuple[int, str]:
    """``(bytes, where they came from)``: the argument if given, else the environment variable
    (``from_env(raw)``), else ``default()``."""
    if value is not None:
        return value, argument
    raw = env.get(variable)
    return from_env(raw) if raw is not None else default()


def cublas_workspace_bytes(device=None) -> int:
    """Bytes of one cuBLAS workspace on a CUDA ``device`` (default: the current one), as this
    torch sizes it: its own answer (``torch.backends.cuda.cublas_workspace_size()``, torch
    2.13 and later), else ``CUBLAS_WORKSPACE_CONFIG``, else PyTorch's default for the card's
    compute capability. The GPU checks give a virtual GPU the real card's workspaces with it
    (``VirtualGPU(..., workspaces=True, cublas_workspace=cublas_workspace_bytes())``).
    TypeError/ValueError for a device that is not a CUDA device of this machine.
    """
    import torch

    from ..core.checks import device_arg

    device = device_arg("cuda" if device is None else device, "device")
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device (cuBLAS runs there), got "
                         f"{str(device)!r}")
    try:
        return int(torch.backends.cuda.cublas_workspace_size())
    except (AttributeError, RuntimeError):  # torch < 2.13 has no such binding
        props = torch.cuda.get_device_properties(device)
        return Workspaces.resolve(compute_capability=(props.major, props.minor)).cublas_bytes


@dataclass(frozen=True)
class FirstMatmul:
    """What one matrix product added to ``memory_allocated()`` on a fresh cuBLAS workspace.

    ``workspace_bytes``: the size PyTorch (or the virtual GPU) says it uses (None if this
    torch cannot say); ``output_bytes``: the product's own tensor; ``peak_extra_bytes`` and
    ``held_extra_bytes``: what the allocator counted beyond the tensors, at the peak and
    after the product; ``source``: the counter read (``"cuda:0"``, ``"virtual GPU L40S"``).
    """

    workspace_bytes: int | None
    output_bytes: int
    peak_extra_bytes: int
    held_extra_bytes: int
    source: str

    def __str__(self) -> str:
        size = "unknown" if self.workspace_bytes is None else f"{self.workspace_bytes:,} bytes"
        return (f"{self.source}: first matrix product added {self.output_bytes:,} bytes of "
                f"output + {self.peak_extra_bytes:,} bytes more at its peak "
                f"({self.held_extra_bytes:,} still held after it); cuBLAS workspace: {size}")


def first_matmul_memory(device=None, n: int = 1024) -> FirstMatmul:
    """Measure the cuBLAS workspace: what one ``n x n`` float32 product adds to
    ``memory_allocated()`` beyond its output, after the cuBLAS workspaces are freed.

    Inside ``with VirtualGPU(..., workspaces=True)``: on the virtual GPU (its workspaces are
    cleared first). Otherwise on the CUDA ``device`` (default: the current one): PyTorch's
    cached workspaces are freed first (``torch._C._cuda_clearCublasWorkspaces``, where this
    torch has it) so that the product allocates one, and ``workspace_bytes`` is
    ``torch.backends.cuda.cublas_workspace_size()`` where this torch has it.
    ValueError without a CUDA device or an active virtual GPU.
    """
    import torch

    from .sources import CudaSource, memory_source
    from .state import current_virtual_gpu

    n = positive_int(n, "n", 16384)
    gpu = current_virtual_gpu()
    source = memory_source(device)
    if gpu is not None:
        where = torch.device(gpu.device_type)
        gpu.clear_workspaces()
        expected = gpu.workspaces.cublas_bytes if gpu.workspaces is not None else 0
    elif isinstance(source, CudaSource):
        where = source.device
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        try:
            expected = int(torch.backends.cuda.cublas_workspace_size())
        except (AttributeError, RuntimeError):  # an older torch, or no such binding here
            expected = None
    else:
        raise ValueError("first_matmul_memory needs a CUDA device or an active "
                         "helpers.VirtualGPU (e.g. `with helpers.VirtualGPU('L40S', "
                         "workspaces=True):`)")
    a = torch.randn(n, n, device=where)
    b = torch.randn(n, n, device=where)
    source.sync()
    source.reset()
    before = source.read()
    c = a @ b
    source.sync()
    peak, after = source.peak(), source.read()
    out = c.numel() * c.element_size()
    del a, b, c
    return FirstMatmul(expected, out, peak - before - out, after - before - out, source.name)
