"""The planner's DDP figures (``ddp=N``) against a real 2-rank DDP run over gloo on the CPU,
with a virtual GPU in each rank counting every tensor the rank makes.

DDP with ``gradient_as_bucket_view=False`` (its default) copies the gradients into its
buckets: a second set of gradients, the size of the parameters. With ``True`` the gradients
live in the buckets, so nothing is added. The planner adds exactly that; gloo's and NCCL's
own buffers lie outside PyTorch's allocator and are not counted in either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.memory.planner import will_it_fit

ROOT = Path(__file__).resolve().parents[3]

WORKER = textwrap.dedent('''\
import json, os, sys
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
import helpers

D, H, B = 512, 1024, 32

def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, 10))

def measure(ddp, view):
    with helpers.VirtualGPU("H200", device="cpu") as gpu:
        model = build()
        m = DDP(model, gradient_as_bucket_view=view) if ddp else model
        opt = torch.optim.Adam(m.parameters(), foreach=True)
        for _ in range(2):
            x = torch.randn(B, D)
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        peak = gpu.peak_allocated_bytes
        del m, model, opt, x, loss
    return peak

dist.init_process_group("gloo")
res = {"plain": measure(False, False), "ddp": measure(True, False), "view": measure(True, True),
       "params": sum(p.numel() * 4 for p in build().parameters())}
if dist.get_rank() == 0:
    print("RESULT", json.dumps(res), flush=True)
dist.barrier(); dist.destroy_process_group(); sys.stdout.flush(); os._exit(0)
''')

SCRIPT = """\
import torch
from torch import nn

D, H, B = 512, 1024, 32
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(),
                      nn.Linear(H, 10)).cuda()
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    x = torch.randn(B, D).cuda()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""


@pytest.mark.timeout(300)
def test_ddp_buckets_match_a_two_rank_gloo_run(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(worker)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=240)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-2000:]
    measured = json.loads(lines[0][len("RESULT "):])

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    plain = will_it_fit(str(script))
    ddp = will_it_fit(str(script), ddp=2)
    view = will_it_fit(str(script), ddp=2, gradient_as_bucket_view=True)
    assert plain.parameter_bytes == measured["params"]
    assert ddp.needed_bytes - plain.needed_bytes == measured["ddp"] - measured["plain"]
    assert view.needed_bytes - plain.needed_bytes == measured["view"] - measured["plain"] == 0
