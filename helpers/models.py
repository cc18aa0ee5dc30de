"""Small PyTorch models shared by the lessons (imports torch: load it through ``helpers``).

Sized so a training step takes milliseconds on a CPU, yet large enough that memory and
speed effects are visible.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLP", "SmallCNN", "ResNet", "TransformerBlock", "count_parameters"]

from .core.checks import positive_int, whole_number

_WIDEST = 2**20  # the largest width, channel or class count a constructor accepts


def _positive(value, name: str) -> int:
    return positive_int(value, name, _WIDEST)


class MLP(nn.Module):
    """``depth`` hidden Linear+ReLU layers of width ``hidden`` and a classifier head.

    ``self.layers`` is an ``nn.Sequential`` so it can be checkpointed segment by segment.
    """

    def __init__(self, in_features: int = 32, hidden: int = 128, depth: int = 3,
                 n_classes: int = 4):
        super().__init__()
        _positive(in_features, "in_features")
        _positive(hidden, "hidden")
        positive_int(depth, "depth", 1000)
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


class _Block(nn.Module):
    """A residual block: two 3x3 convolutions (``expansion`` 1, ResNet-18/34), or 1x1, 3x3 and
    1x1 convolutions with 4x wider output (``expansion`` 4, the bottleneck of ResNet-50+)."""

    def __init__(self, cin: int, width: int, stride: int, expansion: int):
        super().__init__()
        cout = width * expansion
        shapes = ([(cin, width, 3, stride), (width, cout, 3, 1)] if expansion == 1 else
                  [(cin, width, 1, 1), (width, width, 3, stride), (width, cout, 1, 1)])
        for i, (a, b, kernel, s) in enumerate(shapes, 1):
            setattr(self, f"conv{i}", nn.Conv2d(a, b, kernel, s, kernel // 2, bias=False))
            setattr(self, f"bn{i}", nn.BatchNorm2d(b))
        self.convs = len(shapes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(cin, cout, stride)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = x
        for i in range(1, self.convs + 1):
            out = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(out))
            out = self.relu(out + identity if i == self.convs else out)
        return out


def _downsample(cin: int, cout: int, stride: int):
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


_RESNET_LAYOUT = {  # depth: (block expansion, blocks per stage)
    18: (1, (2, 2, 2, 2)), 34: (1, (3, 4, 6, 3)), 50: (4, (3, 4, 6, 3)),
    101: (4, (3, 4, 23, 3)), 152: (4, (3, 8, 36, 3)),
    # ResNet-200 (He et al., 2016, "Identity Mappings in Deep Residual Networks"), with the
    # post-activation blocks of the others; lesson 08's LargeResNet
    200: (4, (3, 24, 36, 3)),
}


class ResNet(nn.Module):
    """The ResNet family of He et al. (2016), laid out like torchvision's.

    ``ResNet(152)`` has torchvision ``resnet152``'s 60,192,808 parameters; ``width`` scales
    every layer (``width=8`` makes a CPU-sized network with the same structure). The residual
    blocks are one flat ``nn.Sequential`` in ``self.layers`` (between ``self.stem`` and
    ``self.head``), so they can be checkpointed in segments with ``checkpoint_sequential``.
    Lessons 05, 06 and 08 use it (08's ``LargeResNet`` is ``ResNet(200)``); its full-size
    versions are measured with fake tensors.

    Args:
        depth: 18, 34, 50, 101, 152 or 200.
        n_classes: outputs of the final linear layer.
        in_channels: image channels.
        width: channels of the first stage (64 in the paper).
    """

    def __init__(self, depth: int = 50, n_classes: int = 1000, in_channels: int = 3,
                 width: int = 64):
        super().__init__()
        if whole_number(depth, "depth") not in _RESNET_LAYOUT:
            raise ValueError(f"depth must be one of {sorted(_RESNET_LAYOUT)}, got {depth!r}")
        _positive(n_classes, "n_classes")
        _positive(in_channels, "in_channels")
        _positive(width, "width")
        expansion, counts = _RESNET_LAYOUT[depth]
        self.depth = depth
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
        )
        blocks: list[nn.Module] = []
        cin = width
        for stage, count in enumerate(counts):
            w = width * 2**stage
            for i in range(count):
                blocks.append(_Block(cin, w, 2 if (i == 0 and stage > 0) else 1, expansion))
                cin = w * expansion
        self.layers = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(cin, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)))


class TransformerBlock(nn.Module):
    """A pre-norm transformer encoder block: self-attention and an MLP, each with a residual.

    ``x + attention(norm(x))`` then ``x + mlp(norm(x))`` on ``(batch, tokens, d_model)``
    inputs, with PyTorch's fused ``scaled_dot_product_attention`` (its memory grows with the
    number of tokens, not with its square) and no dropout.

    Args:
        d_model: width of the token vectors.
        n_heads: attention heads (must divide ``d_model``).
        d_ff: hidden width of the MLP (default ``4 * d_model``).
    """

    def __init__(self, d_model: int = 128, n_heads: int = 4, d_ff: int | None = None):
        super().__init__()
        _positive(d_model, "d_model")
        _positive(n_heads, "n_heads")
        if d_model % n_heads:
            raise ValueError(f"n_heads ({n_heads}) must divide d_model ({d_model})")
        d_ff = 4 * d_model if d_ff is None else _positive(d_ff, "d_ff")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        attn = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
