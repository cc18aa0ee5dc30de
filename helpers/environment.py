"""One call at the top of every lesson: seeds, deterministic flags, quiet TensorFlow.

Used by the Setup cell of every notebook (``helpers.setup(seed=0)``).
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass, field

__all__ = ["SetupReport", "setup", "pick_device", "quiet_tensorflow_env"]

# Environment variables that must be set *before* TensorFlow is imported (see FACTS.md):
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

# cuBLAS needs a fixed workspace to be deterministic; harmless on CPU builds.
CUBLAS_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def quiet_tensorflow_env() -> dict[str, str]:
    """Set TensorFlow's environment variables (unless the user set them) and return them."""
    applied = {}
    for key, value in TF_ENV.items():
        os.environ.setdefault(key, value)
        applied[key] = os.environ[key]
    return applied


@dataclass
class SetupReport:
    """What :func:`setup` did, in the order it did it."""

    seed: int
    deterministic: bool
    seeded: list[str] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        s = self.settings
        lines = [f"seed {self.seed} for: {', '.join(self.seeded)}"]
        if "torch deterministic algorithms" in s:
            lines.append(f"torch: deterministic algorithms {s['torch deterministic algorithms']},"
                         f" CUBLAS_WORKSPACE_CONFIG={s['CUBLAS_WORKSPACE_CONFIG']}")
        tf_line = (f"TensorFlow: quiet start (TF_CPP_MIN_LOG_LEVEL={s['TF_CPP_MIN_LOG_LEVEL']}, "
                   f"TF_ENABLE_ONEDNN_OPTS={s['TF_ENABLE_ONEDNN_OPTS']}), GPU memory grows "
                   f"on demand (TF_FORCE_GPU_ALLOW_GROWTH={s['TF_FORCE_GPU_ALLOW_GROWTH']}), "
                   f"CPU memory statistics (TF_CPU_ALLOCATOR_USE_BFC="
                   f"{s['TF_CPU_ALLOCATOR_USE_BFC']})")
        lines.append(tf_line)
        if "tensorflow GPU memory" in s:
            lines.append(f"TensorFlow GPUs: {s['tensorflow GPU memory']}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()


def setup(seed: int = 0, *, deterministic: bool = True, tensorflow: bool | None = None):
    """Seed every framework in use and make runs repeatable without crashing on a GPU.

    Args:
        seed: non-negative integer seed for Python, NumPy, torch and (if used) TensorFlow.
        deterministic: ask torch for deterministic algorithms with ``warn_only=True`` (a
            non-deterministic CUDA kernel warns instead of raising) and turn off cuDNN
            benchmarking.
        tensorflow: ``True`` imports and configures TensorFlow now; ``None`` (default)
            configures it only if it is already imported; ``False`` leaves it alone. Its
            environment variables are set in every case, so a later ``import tensorflow`` is
            quiet and grows GPU memory on demand.

    Returns:
        A :class:`SetupReport` listing what was seeded and set.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}: {seed!r}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be between 0 and 2**32 - 1, got {seed}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True or False, got {deterministic!r}")
    if tensorflow not in (True, False, None):
        raise TypeError(f"tensorflow must be True, False or None, got {tensorflow!r}")

    report = SetupReport(seed=seed, deterministic=deterministic)
    report.settings.update(quiet_tensorflow_env())
    for key, value in CUBLAS_ENV.items():
        os.environ.setdefault(key, value)
        report.settings[key] = os.environ[key]

    random.seed(seed)
    report.seeded.append("python")
    try:
        import numpy as np

        np.random.seed(seed)
        report.seeded.append("numpy")
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.manual_seed(seed)  # also seeds every CUDA device
        report.seeded.append("torch")
        if deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
            report.settings["torch deterministic algorithms"] = "on (warn_only)"

    use_tf = tensorflow if tensorflow is not None else "tensorflow" in sys.modules
    if use_tf:
        try:
            import tensorflow as tf
        except ImportError:
            report.settings["tensorflow"] = "not installed"
        else:
            tf.get_logger().setLevel("ERROR")
            tf.keras.utils.set_random_seed(seed)
            report.seeded.append("tensorflow")
            grown = _tf_memory_growth(tf)
            report.settings["tensorflow GPU memory"] = grown
    return report


def _tf_memory_growth(tf) -> str:
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "no GPU (growth applies when one is present)"
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            # GPUs already initialised: TF_FORCE_GPU_ALLOW_GROWTH set before import covers it.
            return "already initialised (TF_FORCE_GPU_ALLOW_GROWTH decides)"
    return f"grow on demand on {len(gpus)} GPU(s)"


_DEVICE_KINDS = ("auto", "cuda", "mps", "cpu")


def pick_device(prefer: str = "auto"):
    """The best torch device here: ``cuda`` if a GPU is usable, else ``mps`` (Apple), else ``cpu``.

    Args:
        prefer: "auto" (default) or one of "cuda", "mps", "cpu" to insist on a kind; asking for
            a kind this machine does not have falls back to the best available one.

    Returns:
        A ``torch.device``.
    """
    if not isinstance(prefer, str) or prefer not in _DEVICE_KINDS:
        raise ValueError(f"prefer must be one of {', '.join(_DEVICE_KINDS)}; got {prefer!r}")
    import torch

    available = []
    if torch.cuda.is_available():
        available.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        available.append("mps")
    available.append("cpu")
    if prefer in available:
        return torch.device(prefer)
    return torch.device(available[0])
