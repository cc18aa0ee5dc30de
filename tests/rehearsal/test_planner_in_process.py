"""The planner's branches on "cuda" devices, run in this process so that coverage sees them.

``helpers.will_it_fit`` plans in a process of its own (``helpers/memory/sandbox.py``), which
coverage does not follow. The branches that test for a ``"cuda"`` device there (the script's
``.cuda()``, ``device="cuda"``, the default device, ``torch.load(map_location="cuda")``,
autocast("cuda"), attention and the DDP patches) are what the planner runs on every CPU; they
count as CUDA-only lines by their conditions (scripts/cuda_coverage.py). Here the plans run
in the calling process, as the planner's own process runs them (``sandbox.in_child()``), on
the realistic scripts of tests/planner_scripts/, in a temporary working folder (without the
sandbox, what a script writes would land there).
"""

from __future__ import annotations

import pytest
from planner_common import SCRIPTS

from helpers.memory import cuda_dispatch, planner, sandbox

CASES = {
    "mlp_cuda_everywhere.py": [],
    "default_device.py": [],
    "half_after_cuda.py": [],
    "resume_checkpoint.py": [],
    "sdpa_dropout.py": ["--amp", "bf16"],
    "groupnorm_amp.py": [],
    "gan_two_optimizers.py": [],
}


@pytest.fixture
def in_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sandbox, "_serving", True)  # plan here, as the planner's process does
    return tmp_path


@pytest.mark.parametrize("name", sorted(CASES))
def test_scripts_plan_in_this_process(name, in_process):
    plan = planner.will_it_fit(str(SCRIPTS / name), CASES[name], gpu="H100-80GB")
    assert plan.stopped in ("steps", "ended") and plan.peak_allocated_bytes > 0


def test_a_one_process_group_and_ddp_plan_in_this_process(in_process):
    script = in_process / "ddp_one.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "from torch import nn\n"
        "dist.init_process_group('nccl')\n"
        "model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64).cuda(), device_ids=[0])\n"
        "opt = torch.optim.Adam(model.parameters())\n"
        "for _ in range(3):\n"
        "    model(torch.randn(8, 64, device='cuda')).sum().backward()\n"
        "    opt.step()\n")
    plan = planner.will_it_fit(str(script), ddp=2)
    assert plan.script_ddp and "torchrun" in plan.slurm(card="H100-80GB")


def test_which_cards_a_cuda_build_drives():
    assert planner._drivable("A100-40GB", ["sm_80", "sm_90"], "12.8")
    assert not planner._drivable("V100-16GB", ["sm_80", "sm_90"], "12.8")
    assert planner._drivable("H200", ["sm_80", "compute_90"], "13.0")
    assert not planner._drivable("T4", ["bad", "sm_80"], "13.0")


@pytest.mark.parametrize("name, policy", [("einsum", "lower"), ("max_pool3d", "as_is"),
                                          ("addcmul", "promote"), ("relu", None)])
def test_cuda_autocast_policies(name, policy):
    assert cuda_dispatch.autocast_policy(name) == policy
