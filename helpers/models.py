"""Small PyTorch models shared by the lessons (imports torch: load it through ``helpers``).

Sized so a training step takes milliseconds on a CPU, yet large enough that memory and
speed effects are visible.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLP", "SmallCNN", "count_parameters"]


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class MLP(nn.Module):
    """``depth`` hidden Linear+ReLU layers of width ``hidden`` and a classifier head.

    ``self.layers`` is an ``nn.Sequential`` so it can be checkpointed segment by segment.
    """

    def __init__(self, in_features: int = 32, hidden: int = 128, depth: int = 3,
                 n_classes: int = 4):
        super().__init__()
        _positive(in_features, "in_features")
        _positive(hidden, "hidden")
        _positive(depth, "depth")
        _positive(n_classes, "n_classes")
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head, for ``(N, C, 32, 32)``-sized images."""

    def __init__(self, in_channels: int = 3, n_classes: int = 10, width: int = 16):
        super().__init__()
        _positive(in_channels, "in_channels")
        _positive(n_classes, "n_classes")
        _positive(width, "width")

        def block(cin, cout):
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.MaxPool2d(2),
            )

        self.layers = nn.Sequential(
            block(in_channels, width), block(width, 2 * width), block(2 * width, 4 * width)
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(4 * width, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
