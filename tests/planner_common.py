"""What the planner's tests share: the realistic scripts' folder, a small training script and
a writer for the scripts a test makes (tests/unit/memory/test_planner*.py, the rehearsal)."""

from __future__ import annotations

import textwrap
from pathlib import Path

#: tests/planner_scripts/: scripts written the way people write them for a GPU cluster
SCRIPTS = Path(__file__).resolve().parent / "planner_scripts"

#: a two-layer MLP trained with Adam for 5 steps, everything put on the GPU with .cuda()
MLP = """\
import torch
from torch import nn

D, H, C, B = 256, 256, 10, 4
model = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, C)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(5):
    x = torch.randn(B, D).cuda()
    y = torch.randint(0, C, (B,)).cuda()
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
"""


def write(folder, text: str, name: str = "train.py") -> str:
    """Write ``text`` (dedented) as ``folder/name``; its path as a str."""
    path = Path(folder) / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def round512(n: int) -> int:
    """``n`` bytes as the caching allocator rounds a block (a multiple of 512)."""
    return -(-n // 512) * 512
