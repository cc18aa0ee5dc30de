"""``keras_resnet``: the Keras track's ResNet, built from ``keras.layers`` only (no weights to
download), so that :func:`helpers.measure_keras_memory` can also measure it in a fresh
process (``isolate=True`` saves it to a ``.keras`` file and loads it there).

The layout is He et al.'s CIFAR ResNet: a 3x3 stem, then stages of two-convolution residual
blocks whose first block halves the resolution and doubles the width (a 1x1 projection on
the shortcut), global average pooling and a dense classifier. ``keras_resnet()`` (32 px,
widths 16/32/64, two blocks per stage: 176,378 parameters) is the model of lesson 05's Keras
section and of the tests of the memory line.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.checks import positive_int
from .policies import tensorflow

__all__ = ["keras_resnet"]


def keras_resnet(image_size: int = 32, width: int = 16, blocks: Sequence[int] = (2, 2, 2),
                 classes: int = 10, *, optimizer=None, name: str | None = None):
    """A new Keras ResNet, compiled for training (``jit_compile=False``: see
    :func:`helpers.measure_keras_memory`).

    Args:
        image_size: the side of its square RGB inputs, in pixels (8 to 1024).
        width: the channels of the first stage (1 to 1024); each later stage doubles them.
        blocks: residual blocks per stage, e.g. ``(2, 2, 2)``; 1 to 8 stages.
        classes: output classes (logits; the loss is sparse categorical cross-entropy).
        optimizer: a new Keras optimizer (its state must not be shared between models),
            default ``keras.optimizers.Adam()``.
        name: the model's name (default ``resnet{image_size}``).

    Raises:
        TypeError, ValueError: an argument of the wrong kind or out of range (named).
    """
    image_size = positive_int(image_size, "image_size", 1024)
    if image_size < 8:
        raise ValueError(f"image_size must be at least 8 pixels, got {image_size}")
    width = positive_int(width, "width", 1024)
    classes = positive_int(classes, "classes", 1_000_000)
    if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Sequence):
        raise TypeError(f"blocks must be a list of blocks per stage such as (2, 2, 2), got "
                        f"{type(blocks).__name__}")
    if not 1 <= len(blocks) <= 8:
        raise ValueError(f"blocks must give 1 to 8 stages, got {len(blocks)}")
    blocks = [positive_int(b, "blocks", 64) for b in blocks]
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    tensorflow()  # the kit's quiet environment before TensorFlow's first import
    import keras

    if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer must be a new Keras optimizer such as "
                        f"keras.optimizers.Adam(), got {type(optimizer).__name__}")
    layers = keras.layers

    def conv_bn(h, filters, kernel, stride=1, relu=True):
        h = layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False)(h)
        h = layers.BatchNormalization()(h)
        return layers.ReLU()(h) if relu else h

    inputs = keras.Input((image_size, image_size, 3))
    h = conv_bn(inputs, width, 3)
    for stage, n in enumerate(blocks):
        filters = width * 2**stage
        for block in range(n):
            stride = 2 if stage and not block else 1
            y = conv_bn(conv_bn(h, filters, 3, stride), filters, 3, relu=False)
            shortcut = h if stride == 1 and h.shape[-1] == filters else \
                conv_bn(h, filters, 1, stride, relu=False)
            h = layers.ReLU()(layers.Add()([y, shortcut]))
    outputs = layers.Dense(classes)(layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inputs, outputs, name=name or f"resnet{image_size}")
    model.compile(optimizer=optimizer if optimizer is not None else keras.optimizers.Adam(),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    return model
