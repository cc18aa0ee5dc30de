"""TensorFlow's memory counters as a :class:`helpers.memory.sources.MemorySource`.

The memory layer never imports TensorFlow; this module hands it ``tf.config.experimental``.
Used by the batch-size finder's Keras path.
"""

from __future__ import annotations

from ..memory.sources import TensorFlowSource

__all__ = ["tensorflow_source"]


def tensorflow_source(device: str = "GPU:0", total: int | None = None) -> TensorFlowSource:
    """The allocator statistics of TensorFlow device ``device`` (``"GPU:0"``, ``"CPU:0"``);
    ``available`` is False where TensorFlow keeps none (its default CPU allocator)."""
    import tensorflow as tf

    return TensorFlowSource(tf.config.experimental, device, total)
