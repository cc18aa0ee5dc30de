"""Synthetic data sets shared by the lessons: no downloads, deterministic under a seed.

The generators return NumPy arrays (so TensorFlow lessons can use them without torch);
:func:`torch_dataset` and :func:`torch_loader` wrap them for PyTorch.  Sizes are small
enough that every lesson runs in well under a minute on two CPU cores.
"""

from __future__ import annotations

import os

import numpy as np

from .checks import flag, positive_int, real_number, whole_number

__all__ = ["classification_data", "image_data", "torch_dataset", "torch_loader"]

_MOST_NUMBERS = 2**30  # the most numbers a generator makes (4 GiB of float32)


def _seed(seed) -> int:
    return whole_number(seed, "seed", 0, 2**63 - 1)  # torch.Generator's largest seed


def _size_check(shape: tuple[int, ...], names: str) -> None:
    if np.prod(shape, dtype=object) > _MOST_NUMBERS:
        raise ValueError(f"{names} = {shape} would make more than {_MOST_NUMBERS:,} numbers; "
                         "the lessons' data sets are far smaller")


def classification_data(
    n_samples: int = 2048, n_features: int = 32, n_classes: int = 4, *, seed: int = 0,
    noise: float = 4.0,
):
    """Gaussian blobs: ``n_classes`` clusters in ``n_features`` dimensions.

    Learnable in a few dozen steps by a small MLP, so loss curves visibly fall.

    Returns:
        ``(x, y)``: float32 array ``(n_samples, n_features)`` and int64 labels ``(n_samples,)``.
    """
    n_samples = positive_int(n_samples, "n_samples")
    n_features = positive_int(n_features, "n_features")
    n_classes = positive_int(n_classes, "n_classes")
    if n_classes < 2:
        raise ValueError(f"n_classes must be at least 2, got {n_classes}")
    noise = real_number(noise, "noise", 0)
    _size_check((n_samples, n_features), "n_samples, n_features")
    _size_check((n_classes, n_features), "n_classes, n_features")  # one centre per class
    rng = np.random.default_rng(_seed(seed))
    centres = rng.normal(0.0, 2.0, size=(n_classes, n_features))
    y = rng.integers(0, n_classes, size=n_samples)
    x = centres[y] + rng.normal(0.0, noise, size=(n_samples, n_features))
    return x.astype(np.float32), y.astype(np.int64)


def image_data(
    n_samples: int = 512, *, channels: int = 3, size: int = 32, n_classes: int = 10,
    seed: int = 0, channels_last: bool = False,
):
    """Small synthetic images whose class sets a pattern the network can pick up.

    Returns:
        ``(x, y)``: float32 images ``(N, C, H, W)`` (or ``(N, H, W, C)`` with
        ``channels_last=True``, TensorFlow's layout) and int64 labels.
    """
    n_samples = positive_int(n_samples, "n_samples")
    channels = positive_int(channels, "channels")
    size = positive_int(size, "size")
    n_classes = positive_int(n_classes, "n_classes")
    flag(channels_last, "channels_last")
    _size_check((n_samples, channels, size, size), "n_samples, channels, size, size")
    rng = np.random.default_rng(_seed(seed))
    y = rng.integers(0, n_classes, size=n_samples)
    grid = np.linspace(0.0, 2.0 * np.pi, size, dtype=np.float32)
    # class k: stripes of frequency k+1 at an angle set by k, plus noise
    angle = (np.pi * y / n_classes)[:, None, None]
    freq = (1 + y % 5)[:, None, None]
    gx, gy = np.meshgrid(grid, grid, indexing="xy")
    pattern = np.sin(freq * (np.cos(angle) * gx[None] + np.sin(angle) * gy[None]))
    x = pattern[:, None, :, :] + 0.5 * rng.normal(size=(n_samples, channels, size, size))
    x = x.astype(np.float32)
    if channels_last:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return x, y.astype(np.int64)


def torch_dataset(x, y):
    """Wrap NumPy arrays ``(x, y)`` as a ``torch.utils.data.TensorDataset``."""
    import torch
    from torch.utils.data import TensorDataset

    tensors = []
    for name, value in (("x", x), ("y", y)):
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name} must be an array of numbers, got "
                            f"{type(value).__name__}") from None
        if tensor.dim() == 0:
            raise ValueError(f"{name} must have one entry per sample, got a single number")
        tensors.append(tensor)
    if len(tensors[0]) != len(tensors[1]):
        raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
    return TensorDataset(*tensors)


def most_workers() -> int:
    """The most ``num_workers`` :func:`torch_loader` accepts: 4 per CPU core, at least 8.
    Each worker is a process with a copy of the data set; more only wait for a core."""
    return max(8, 4 * (os.cpu_count() or 1))


def torch_loader(x, y, batch_size: int = 64, *, shuffle: bool = True, seed: int = 0, **kwargs):
    """A ``DataLoader`` over ``(x, y)`` with a seeded shuffle (same order every run).

    Other keyword arguments go to ``DataLoader``; ``num_workers`` (worker processes) is at most
    :func:`most_workers` (4 per CPU core, at least 8) and ``prefetch_factor`` (batches each
    worker holds ready) at most 64."""
    import torch
    from torch.utils.data import DataLoader

    batch_size = positive_int(batch_size, "batch_size")
    flag(shuffle, "shuffle")
    if "num_workers" in kwargs:
        most = most_workers()
        kwargs["num_workers"] = whole_number(kwargs["num_workers"], "num_workers", 0, most)
    if kwargs.get("prefetch_factor") is not None:
        kwargs["prefetch_factor"] = positive_int(kwargs["prefetch_factor"], "prefetch_factor",
                                                 64)
    generator = torch.Generator().manual_seed(_seed(seed))
    return DataLoader(
        torch_dataset(x, y), batch_size=batch_size, shuffle=shuffle, generator=generator,
        **kwargs,
    )
