"""Mixed precision in Keras: the policy for this device, set and restored (lesson 07).

* :func:`keras_mixed_policy`: ``"mixed_float16"`` where TensorFlow sees a GPU and
  ``"mixed_bfloat16"`` on CPUs (fp16 on a CPU is slow, pathologically so with oneDNN);
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

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16", "float64")
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"


def tensorflow():
    """TensorFlow, imported with the kit's quiet environment (set before its first import)."""
    if "tensorflow" not in sys.modules:
        from ..core.environment import quiet_tensorflow_env

        quiet_tensorflow_env()
    import tensorflow as tf

    return tf


def keras_mixed_policy(device: str | None = None) -> str:
    """The Keras mixed-precision policy to use: fp16 on GPUs, bf16 on CPUs.

    Args:
        device: "GPU" or "CPU" (also "GPU:0", "/device:CPU:0"); by default "GPU" when
            TensorFlow sees one, else "CPU".

    Returns:
        ``"mixed_float16"`` for a GPU, ``"mixed_bfloat16"`` for a CPU.
    """
    if device is None:
        kind = "GPU" if tensorflow().config.list_physical_devices("GPU") else "CPU"
    elif isinstance(device, str):
        kind = device.upper().removeprefix("/").removeprefix("DEVICE:").split(":")[0]
        if kind not in ("GPU", "CPU"):
            raise ValueError(f"device must be 'GPU' or 'CPU' (or 'GPU:0', ...), got {device!r}")
    else:
        raise TypeError(f"device must be a string such as 'GPU' or 'CPU', got {device!r}")
    return "mixed_float16" if kind == "GPU" else "mixed_bfloat16"


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
