"""GPU check of virtual_cuda's memory snapshots: the same keys as the real allocator's.

``helpers.virtual_cuda`` answers ``torch.cuda.memory._record_memory_history``/``_snapshot``
with the simulated allocator's events (lesson 06). On a CUDA GPU this records one small step
for real and on a virtual card, and checks that every key the virtual snapshot writes is one
the real snapshot has too (so ``torch.cuda._memory_viz`` and pytorch.org/memory_viz read both
alike). ``python -m pytest tests/gpu/test_snapshot_gpu.py -q``; without a GPU it skips.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import helpers

pytestmark = pytest.mark.gpu
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def _snapshot_of_a_step():
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to("cuda")
    x = torch.randn(4096, 1024, device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    model(x).sum().backward()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return snapshot


def _keys(snapshot):
    segs = snapshot["segments"]
    trace = snapshot["device_traces"][0]
    return ({k for s in segs for k in s}, {k for s in segs for b in s["blocks"] for k in b},
            {(e["action"], k) for e in trace for k in e},
            {k for e in trace for f in e["frames"] for k in f})


@requires_cuda
def test_virtual_snapshot_keys_are_real_snapshot_keys():
    real = _keys(_snapshot_of_a_step())
    with helpers.virtual_cuda("L40S"):
        virtual = _keys(_snapshot_of_a_step())
    for what, v, r in zip(("segment", "block", "trace entry", "frame"), virtual, real,
                          strict=True):
        extra = v - r
        if what == "trace entry":  # an action the short real run may not have taken
            extra = {(a, k) for a, k in extra if any(a == b for b, _ in r)}
        assert not extra, f"{what} keys only the virtual snapshot writes: {sorted(extra)}"
