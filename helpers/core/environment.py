"""One call at the top of every lesson: seeds, deterministic flags, quiet TensorFlow.

Used by the Setup cell of every notebook: ``helpers.setup(seed=0)`` where results must repeat
exactly, ``helpers.setup(seed=0, deterministic=False)`` where a lesson times GPU work.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass, field

from .checks import choice, flag, whole_number
from .fmt import ShownAsTable

__all__ = ["SetupReport", "setup", "pick_device", "quiet_tensorflow_env"]

# Environment variables that must be set *before* TensorFlow is imported:
# no C++ INFO/WARNING banners, no oneDNN notice (this also fixes CPU bf16/fp16 speed), and
# TensorFlow grows GPU memory on demand instead of reserving the whole card at start-up, so
# torch and TensorFlow can share one kernel and learners can share one GPU.
TF_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    # with oneDNN off, tf.config.experimental.get_memory_info("CPU:0") has no statistics
    # unless the CPU allocator is TensorFlow's BFC allocator (lessons 02, 04, 06, 07 use them)
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
}

# cuBLAS needs a fixed workspace to be deterministic. Set only in deterministic mode: it
# changes cuBLAS's workspace (and so memory and speed) for every matmul in the process.
CUBLAS_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
# the CUBLAS_ENV values setup() itself put into os.environ (so deterministic=False can undo them
# without touching a value the user set)
_SET_BY_SETUP: dict[str, str] = {}

# The TensorFlow side of setup() and device_report(). The core layer never imports TensorFlow:
# helpers.tf.runtime installs itself here when it is imported (the helpers package imports it
# before it hands out setup or device_report).
# It has configure(seed) -> str | None (what happened to GPU memory) and
# describe() -> (version, built with CUDA, device names) | None; None: TensorFlow is not
# installed.
tensorflow_support = None


def quiet_tensorflow_env() -> dict[str, str]:
    """Set TensorFlow's environment variables (unless the user set them) and return them."""
    for key, value in TF_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in TF_ENV}


@dataclass(repr=False)
class SetupReport(ShownAsTable):
    """What :func:`setup` did, in the order it did it."""

    seed: int
    deterministic: bool
    benchmark: bool = False
    seeded: list[str] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        s = self.settings
        lines = [f"seed {self.seed} for: {', '.join(self.seeded)}"]
        if "torch deterministic algorithms" in s:
            lines.append(f"torch: deterministic algorithms {s['torch deterministic algorithms']}"
                         f", cuDNN benchmark {s['cuDNN benchmark']}, {s['cuBLAS']}")
        tf_line = (f"TensorFlow: quiet start (TF_CPP_MIN_LOG_LEVEL={s['TF_CPP_MIN_LOG_LEVEL']}, "
                   f"TF_ENABLE_ONEDNN_OPTS={s['TF_ENABLE_ONEDNN_OPTS']}), GPU memory grows "
                   f"on demand (TF_FORCE_GPU_ALLOW_GROWTH={s['TF_FORCE_GPU_ALLOW_GROWTH']}), "
                   f"CPU memory statistics (TF_CPU_ALLOCATOR_USE_BFC="
                   f"{s['TF_CPU_ALLOCATOR_USE_BFC']})")
        lines.append(tf_line)
        if "tensorflow GPU memory" in s:
            lines.append(f"TensorFlow GPUs: {s['tensorflow GPU memory']}")
        return "\n".join(lines)


def setup(seed: int = 0, *, deterministic: bool = True, benchmark: bool = False,
          tensorflow: bool | None = None, torch: bool | None = None):
    """Seed every framework in use and choose between repeatable and fast GPU kernels.

    Deterministic mode (the default) makes reruns give the same numbers, which lessons 02 and
    03 rely on. On a GPU it costs speed: torch picks deterministic (often slower) kernels,
    cuDNN does not search for the fastest convolution algorithm, cuBLAS runs with a fixed
    workspace (``CUBLAS_WORKSPACE_CONFIG``), and ops without a deterministic CUDA kernel (the
    backward of ``adaptive_avg_pool2d``, in every ResNet) print a warning. Timed lessons call
    ``setup(seed=0, deterministic=False)``: they measure the kernels a real training run uses.

    Args:
        seed: non-negative integer seed for Python, NumPy, torch and (if used) TensorFlow.
        deterministic: True: ask torch for deterministic algorithms with ``warn_only=True``
            (a non-deterministic CUDA kernel warns instead of raising), cuDNN deterministic
            and not benchmarking, and set ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (unless already
            set), which cuBLAS needs to be deterministic. False: turn all of that off again,
            and leave ``CUBLAS_WORKSPACE_CONFIG`` unset (removing it if an earlier ``setup``
            call set it; a value set outside helpers stays, and the report says so). torch
            sizes cuBLAS's workspace at the first GPU matmul, so choose the mode before that.
        benchmark: ``torch.backends.cudnn.benchmark`` when not deterministic. Off by
            default, even for timing: benchmark mode times several convolution algorithms
            on the first call at each new input shape, so that call is slow and its memory
            peak includes the trial algorithms' workspaces. The kit's lessons vary batch
            sizes and measure peaks, so they leave it off. Turn it on
            (``deterministic=False, benchmark=True``) for long runs at fixed shapes, as a
            performance engineer would; ``benchmark=True`` with ``deterministic=True`` is a
            ValueError (the chosen algorithm depends on timings).
        tensorflow: ``True`` imports and configures TensorFlow now; ``None`` (default)
            configures it only if it is already imported; ``False`` leaves it alone. Its
            environment variables are set in every case, so a later ``import tensorflow`` is
            quiet and grows GPU memory on demand.
        torch: ``None`` (default) imports, seeds and configures PyTorch if it is installed;
            ``True`` insists on it (ImportError without it); ``False`` leaves it alone unless
            it is already imported. A notebook that trains only Keras models passes
            ``torch=False``: importing PyTorch costs a kernel about 0.25 GiB of memory.

    Returns:
        A :class:`SetupReport` listing what was seeded and set.
    """
    seed = whole_number(seed, "seed", 0, 2**32 - 1)
    # every argument is checked (and NumPy bools made plain bools, which torch's setters
    # insist on) before anything is set: a refused call changes nothing
    deterministic = flag(deterministic, "deterministic")
    benchmark = flag(benchmark, "benchmark")
    if benchmark and deterministic:
        raise ValueError("benchmark=True picks cuDNN algorithms by timing them, which is not "
                         "repeatable; use it with deterministic=False")
    if tensorflow is not None:
        tensorflow = flag(tensorflow, "tensorflow")
    if torch is not None:
        torch = flag(torch, "torch")
    pt = _torch_module(torch)  # ImportError (torch=True without PyTorch) before any change

    report = SetupReport(seed=seed, deterministic=deterministic, benchmark=benchmark)
    report.settings.update(quiet_tensorflow_env())
    report.settings["cuBLAS"] = _cublas_env(deterministic)

    random.seed(seed)
    report.seeded.append("python")
    import numpy as np

    np.random.seed(seed)
    report.seeded.append("numpy")

    if pt is not None:
        pt.manual_seed(seed)  # also seeds every CUDA device
        report.seeded.append("torch")
        if deterministic:
            pt.use_deterministic_algorithms(True, warn_only=True)
        else:
            pt.use_deterministic_algorithms(False)
        pt.backends.cudnn.deterministic = deterministic
        pt.backends.cudnn.benchmark = benchmark
        report.settings["torch deterministic algorithms"] = (
            "on (warn_only)" if deterministic else "off")
        report.settings["cuDNN benchmark"] = "on" if benchmark else "off"

    use_tf = tensorflow if tensorflow is not None else "tensorflow" in sys.modules
    if use_tf and tensorflow_support is None:
        report.settings["tensorflow"] = "not configured (helpers.tf.runtime is not imported)"
    elif use_tf:
        grown = tensorflow_support.configure(seed)
        if grown is None:
            report.settings["tensorflow"] = "not installed"
        else:
            report.seeded.append("tensorflow")
            report.settings["tensorflow GPU memory"] = grown
    return report


def _torch_module(use: bool | None):
    """PyTorch for :func:`setup` to seed, or None: ``use=None`` imports it if installed,
    True insists (ImportError without it), False takes it only if already imported."""
    if use is False:
        return sys.modules.get("torch")
    try:
        import torch
    except ImportError:
        if use:
            raise
        return None
    return torch


def _cublas_env(deterministic: bool) -> str:
    """Set (or undo) ``CUBLAS_WORKSPACE_CONFIG`` for the mode; returns the report's words."""
    (key, value), = CUBLAS_ENV.items()
    current = os.environ.get(key)
    if deterministic:
        if current is None:
            os.environ[key] = _SET_BY_SETUP[key] = value
        return f"{key}={os.environ[key]}"
    if current is not None and _SET_BY_SETUP.get(key) == current:
        del os.environ[key]  # an earlier setup(deterministic=True) set it
        current = None
    _SET_BY_SETUP.pop(key, None)
    if current is None:
        return f"{key} not set"
    return f"{key}={current} (set outside helpers, left as is)"


_DEVICE_KINDS = ("auto", "cuda", "mps", "cpu")


def pick_device(prefer: str = "auto"):
    """The best torch device here: ``cuda`` if a GPU is usable, else ``mps`` (Apple), else ``cpu``.

    Args:
        prefer: "auto" (default) or one of "cuda", "mps", "cpu" to insist on a kind; asking for
            a kind this machine does not have falls back to the best available one.

    Returns:
        A ``torch.device``.
    """
    choice(prefer, "prefer", _DEVICE_KINDS)
    import torch

    mps = getattr(torch.backends, "mps", None)
    available = [kind for kind, usable in (("cuda", torch.cuda.is_available()),
                                           ("mps", mps is not None and mps.is_available()))
                 if usable] + ["cpu"]
    return torch.device(prefer if prefer in available else available[0])
