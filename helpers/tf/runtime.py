"""The TensorFlow side of ``helpers.setup()`` and ``helpers.device_report()``.

The core layer never imports TensorFlow. Importing this module (the ``helpers`` package does
it before it hands out ``setup`` or ``device_report``) installs it as
:data:`helpers.core.environment.tensorflow_support`; ``setup`` and ``device_report`` call
:func:`configure` and :func:`describe` through that hook.
TensorFlow itself is imported only when one of them runs, so ``import helpers`` stays cheap.
"""

from __future__ import annotations

import sys

from ..core import environment

__all__ = ["configure", "describe", "memory_growth"]


def _import_tensorflow():
    """TensorFlow, imported quietly (its environment variables set first), or None."""
    environment.quiet_tensorflow_env()
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return tf


def configure(seed: int) -> str | None:
    """Quiet TensorFlow's logger, seed it and let it grow GPU memory on demand.

    Returns what happened to GPU memory, in the words of the setup report, or None when
    TensorFlow is not installed.
    """
    tf = _import_tensorflow()
    if tf is None:
        return None
    tf.get_logger().setLevel("ERROR")
    tf.keras.utils.set_random_seed(seed)
    return memory_growth(tf)


def memory_growth(tf) -> str:
    """Ask TensorFlow (the module ``tf``) to grow GPU memory on demand; says what happened."""
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


def describe() -> tuple[str, bool, list[str]] | None:
    """TensorFlow's version, whether it was built with CUDA, and its physical devices; None
    when TensorFlow is not installed."""
    tf = _import_tensorflow()
    if tf is None:
        return None
    return (tf.__version__, bool(tf.test.is_built_with_cuda()),
            [d.name for d in tf.config.list_physical_devices()])


environment.tensorflow_support = sys.modules[__name__]
