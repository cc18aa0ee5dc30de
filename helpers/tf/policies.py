"""Mixed precision in Keras: the policy for this device, set and restored (lesson 07).

* :func:`keras_mixed_policy`: the same choice as ``helpers.amp_settings`` makes for PyTorch:
  ``"mixed_bfloat16"`` on NVIDIA GPUs of compute capability 8.0 and newer (no loss scaling
  needed) and on CPUs (fp16 on a CPU is slow, pathologically so with oneDNN),
  ``"mixed_float16"`` on older GPUs (T4, V100), which compute bf16 only by emulation;
* :func:`keras_policy`: ``with keras_policy("mixed_bfloat16"): ...`` sets Keras' global
  dtype policy and restores the previous one afterwards, even after an error;
* :func:`onednn_setting`: the ``TF_ENABLE_ONEDNN_OPTS`` setting TensorFlow runs under, to
  print next to CPU timings (it changes bf16 and fp16 speed).

TensorFlow is imported on use, with the kit's quiet environment.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

__all__ = ["keras_mixed_policy", "keras_policy", "onednn_setting", "POLICIES"]

BF16_CAPABILITY = (8, 0)  # NVIDIA Ampere: bf16 (and TF32) tensor cores
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16", "float64")
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"


def tensorflow():
    """TensorFlow, imported with the kit's quiet environment (set before its first import)."""
    if "tensorflow" not in sys.modules:
        from ..core.environment import quiet_tensorflow_env

        quiet_tensorflow_env()
    import tensorflow as tf

    return tf


def keras_mixed_policy(device: str | None = None, capability=None) -> str:
    """The Keras mixed-precision policy to use, chosen as ``helpers.amp_settings`` chooses.

    Args:
        device: "GPU" or "CPU" (also "GPU:0", "/device:CPU:0"); by default "GPU" when
            TensorFlow sees one, else "CPU".
        capability: the GPU's ``(major, minor)`` compute capability; by default TensorFlow's
            ``get_device_details`` of the first GPU (ignored for a CPU).

    Returns:
        ``"mixed_bfloat16"`` for a GPU of compute capability 8.0 or newer (Ampere, Hopper,
        ...: bf16 tensor cores, fp32's range, no loss scaling) and for a CPU (bf16 is fast
        only with AVX512-BF16 or AMX instructions and oneDNN on; fp16 is slower still);
        ``"mixed_float16"`` for an older GPU, or a GPU whose capability is unknown (every
        NVIDIA GPU computes fp16; use ``keras.optimizers.LossScaleOptimizer``).
    """
    tf = None
    if device is None:
        tf = tensorflow()
        kind = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    elif isinstance(device, str):
        kind = device.upper().removeprefix("/").removeprefix("DEVICE:").split(":")[0]
        if kind not in ("GPU", "CPU"):
            raise ValueError(f"device must be 'GPU' or 'CPU' (or 'GPU:0', ...), got {device!r}")
    else:
        raise TypeError(f"device must be a string such as 'GPU' or 'CPU', got {device!r}")
    if kind == "CPU":
        return "mixed_bfloat16"
    if capability is None:
        capability = gpu_capability(tf or tensorflow())
    elif (not isinstance(capability, tuple) or len(capability) != 2
          or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                     for c in capability)):
        raise ValueError(f"capability must be a (major, minor) tuple of whole numbers, got "
                         f"{capability!r}")
    if capability is not None and capability >= BF16_CAPABILITY:
        return "mixed_bfloat16"
    return "mixed_float16"


def gpu_capability(tf, index: int = 0) -> tuple[int, int] | None:
    """The compute capability TensorFlow reports for GPU ``index``, or None if unknown."""
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) <= index:
        return None
    details = tf.config.experimental.get_device_details(gpus[index])
    capability = details.get("compute_capability")
    return tuple(capability) if capability else None


@contextmanager
def keras_policy(name: str):
    """Set Keras' global dtype policy to ``name`` inside the block, then restore the old one.

    Layers created inside the block keep the policy they were made with.
    """
    if not isinstance(name, str) or name not in POLICIES:
        raise ValueError(f"name must be one of {', '.join(POLICIES)}, got {name!r}")
    keras = tensorflow().keras
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield keras.mixed_precision.global_policy()
    finally:
        keras.mixed_precision.set_global_policy(previous)


def onednn_setting() -> str:
    """``TF_ENABLE_ONEDNN_OPTS`` as TensorFlow sees it, in words (no TensorFlow import)."""
    value = os.environ.get(ONEDNN_ENV)
    if value is None:
        return f"{ONEDNN_ENV} unset (TensorFlow's default: oneDNN on, on x86 CPUs)"
    state = {"0": "off", "false": "off", "1": "on", "true": "on"}.get(value.lower(), "unknown")
    origin = " (helpers.setup's default)" if value == "0" else ""
    return f"{ONEDNN_ENV}={value}: oneDNN {state}{origin}"
