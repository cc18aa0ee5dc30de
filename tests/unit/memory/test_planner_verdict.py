"""The planner's verdict (reserved + context, with a margin), its stop rule (every optimizer
steps N times), the SLURM request, ``--ddp`` without DDP, ``--checkpoint-every`` with nothing
to wrap, and the CLI's split between the planner's options and the script's (issue 32)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from planner_common import MLP, SCRIPTS, write

from helpers.memory import planner
from helpers.memory.capacity import KNOWN_GPUS
from helpers.memory.planner import PlanError, will_it_fit

GAN = str(SCRIPTS / "gan_two_optimizers.py")
GiB = 1024**3
MiB = 1024**2


WIDE = """\
import argparse
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--gpu", type=int, default=None, help="the script's own: which GPU")
args = p.parse_args()
print("script's gpu:", args.gpu)
model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    x = torch.randn(args.batch_size, 1024, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------- the verdict
def test_the_verdict_is_on_reserved_plus_context(tmp_path):
    """A card with room for allocated + context but not for reserved + context runs out of
    memory in the caching allocator's model: the verdict says so (main said "fits")."""
    script = write(tmp_path, MLP)
    probe = will_it_fit(script, context=0)
    alloc, reserved = probe.peak_allocated_bytes, probe.peak_reserved_bytes
    assert alloc < reserved
    t4 = KNOWN_GPUS["T4"]
    context = t4 - (alloc + reserved) // 2  # between the two sums
    plan = will_it_fit(script, context=context)
    assert plan.needed_bytes == reserved + context
    assert plan.needed_allocated_bytes == alloc + context < t4 < plan.needed_bytes
    fit = plan.card_fit("T4")
    assert not fit.fits and fit.verdict == "out of memory"
    assert fit.needed_bytes == plan.needed_bytes
    assert fit.needed_allocated_bytes == plan.needed_allocated_bytes
    assert "reserved + context" in plan.table().title
    assert f"{planner.fmt_bytes(plan.needed_allocated_bytes)} with allocated" in plan.text()
    # the card's out-of-memory line: where reserved first passes capacity - context
    assert fit.oom_at is not None and "cuda()" in fit.oom_at.code
    data = plan.to_dict()
    assert data["needed_bytes"] == plan.needed_bytes and data["cards"][0]["verdict"]


def test_the_margin_makes_a_third_verdict_and_picks_the_card(tmp_path):
    script = write(tmp_path, MLP)
    plan = will_it_fit(script, context="14 GiB")  # needs a bit over 14 GiB
    t4 = plan.card_fit("T4")
    assert plan.margin_text == "max(15 %, 2.00 GiB)"
    assert t4.margin_bytes == max(int(0.15 * t4.capacity_bytes), 2 * GiB)
    assert t4.fits and not t4.fits_with_margin and t4.verdict == "fits, inside the margin"
    assert plan.card_fit("A100-40GB").verdict == "fits"
    assert "fits, inside the margin" in plan.table().text()
    assert plan.smallest_card == "A100-40GB"  # the V100-32GB cannot run this torch
    assert "--constraint=a100_40gb" in plan.slurm()
    # a margin of 0 %: the T4 is enough; 1 GiB: the T4 is left with less than that
    assert will_it_fit(script, context="14 GiB", margin="0%").smallest_card == "T4"
    sized = will_it_fit(script, context="14 GiB", margin="1 GiB")
    assert sized.card_fit("T4").margin_bytes == GiB and sized.margin_text == "1.00 GiB"
    assert sized.card_fit("T4").verdict == "fits, inside the margin"
    assert will_it_fit(script, context="14 GiB", margin=" 5 %").margin_fraction == 0.05
    # a card it fits only inside the margin is still given when asked for by name
    assert "inside the margin" in plan.slurm(card="T4").upper().lower()


@pytest.mark.parametrize("margin", ["lots", "150%", "nan%", "-5%", -1, math.nan, "%"])
def test_bad_margins_name_themselves(tmp_path, margin):
    with pytest.raises(ValueError, match="margin"):
        will_it_fit(write(tmp_path, MLP), margin=margin)


def test_bad_margin_type(tmp_path):
    with pytest.raises(TypeError, match="margin must be"):
        will_it_fit(write(tmp_path, MLP), margin=[15])


def test_the_batch_search_recommends_a_batch_inside_the_margin(tmp_path):
    script = write(tmp_path, WIDE)
    args = ["--batch-size", "64"]
    plan = will_it_fit(script, args, batch_arg="--batch-size", multiple_of=4096,
                       max_batch=10**7)
    t4 = plan.card_fit("T4")
    largest, recommended = t4.largest_batch, t4.recommended_batch
    assert recommended is not None and largest is not None and recommended < largest
    checks = {b: will_it_fit(script, planner._batch_argv(args, "--batch-size", b)).card_fit(
        "T4") for b in (recommended, recommended + 4096, largest, largest + 4096)}
    assert checks[recommended].fits_with_margin
    assert not checks[recommended + 4096].fits_with_margin
    assert checks[largest].fits and not checks[largest + 4096].fits
    assert checks[largest].verdict == "fits, inside the margin"
    assert "recommended" in plan.table().headers


# ------------------------------------------------------------------------- the stop rule
@pytest.mark.parametrize("n_critic, steps", [("1", {"Adam": 2, "Adam #2": 2}),
                                             ("5", {"Adam": 10, "Adam #2": 2})])
def test_a_gan_is_planned_after_each_optimizers_second_step(in_tmp, n_critic, steps):
    """The reference: the script run to its natural end after 2 generator steps (so each
    optimizer has stepped twice at least), real CPU tensors. The old rule (2 steps of all
    optimizers together) stopped at the generator's 1st step, 20 % low here."""
    args = ["--n-critic", n_critic]
    plan = will_it_fit(GAN, args)
    reference = will_it_fit(GAN, [*args, "--iters", "2"], steps=1000, fake=False)
    assert reference.stopped == "ended"
    assert plan.stopped == "steps" and plan.optimizer_steps == steps
    assert plan.peak_allocated_bytes == reference.peak_allocated_bytes
    assert plan.categories == reference.categories
    old_rule = will_it_fit(GAN, args, steps=1)  # each optimizer once: where the old rule was
    assert old_rule.peak_allocated_bytes < 0.9 * plan.peak_allocated_bytes
    assert "every optimizer's 2nd step" in plan.text()


def test_an_optimizer_that_never_steps_is_not_waited_for_forever(tmp_path):
    script = write(tmp_path, MLP.replace(
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)",
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "spare = torch.optim.SGD(model.parameters(), lr=1e-3)").replace(
        "range(5)", "range(100)"))
    plan = will_it_fit(script, max_forwards=5)
    # Adam's 2nd step, then 5 more forward passes (and steps) waiting for the SGD
    assert plan.stopped == "steps" and plan.optimizer_steps == {"Adam": 2 + 5}
    assert any(re.search(r"not every optimizer stepped 2 times: SGD \(\S*train.py:7\) "
                         r"with 0 step\(s\) after 5 more forward passes", n)
               for n in plan.notes), list(plan.notes)
    # the script ending first is fine too
    assert will_it_fit(script.replace("range(100)", "range(5)")).stopped in ("ended", "steps")


def test_an_optimizer_made_late_gets_its_steps(tmp_path):
    """A second optimizer made after the first one's 1st step, stepping from the next
    iteration on (a head trained later): the plan waits for its 2nd step."""
    script = write(tmp_path, MLP.replace("for step in range(5):", "for step in range(8):")
                   .replace("    opt.step()\n",
                            "    opt.step()\n    if step == 0:\n"
                            "        opt2 = torch.optim.AdamW(model[2].parameters())\n"
                            "    else:\n        opt2.step()\n"))
    plan = will_it_fit(script)
    assert plan.optimizer_steps == {"Adam": 3, "AdamW": 2}


def test_gradient_accumulation_past_max_forwards_points_to_the_option(tmp_path):
    script = write(tmp_path, MLP.replace("    opt.step()\n", "    if step % 80 == 79:\n"
                                         "        opt.step()\n").replace("range(5)",
                                                                          "range(200)"))
    with pytest.raises(PlanError, match=r"raise --max-forwards \(max_forwards=\)"):
        will_it_fit(script)
    assert will_it_fit(script, max_forwards=100).stopped == "steps"


# ------------------------------------------------------------------------- fixes
MODULELIST = """\
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))

class Net(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

model = Net(64, 4).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(32, 64).cuda()).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_checkpoint_every_says_when_nothing_was_wrapped(tmp_path):
    plan = will_it_fit(write(tmp_path, MODULELIST), checkpoint_every=2)
    note = plan.fix_notes["--checkpoint-every 2"]
    assert "nothing was wrapped" in note and "nn.ModuleList" in note
    text = plan.text()
    assert "nothing was wrapped" in text and "+0 %" not in text and "+0%" not in text
    wrapped = will_it_fit(write(tmp_path, MLP, "mlp.py"), checkpoint_every=2)
    assert "--checkpoint-every 2" not in wrapped.fix_notes


def test_a_fix_that_cannot_run_leaves_the_plan_standing(in_tmp):
    """The GAN's ReLU(inplace=True) at a segment's edge breaks checkpoint_sequential's
    recomputation: the plan is still made, and the fix says why it has no prediction."""
    plan = will_it_fit(GAN, checkpoint_every=2)
    assert "--checkpoint-every 2" not in plan.fixes
    note = plan.fix_notes["--checkpoint-every 2"]
    assert note.startswith("could not be applied") and "in-place" in note
    assert "could not be applied" in plan.text()


# ------------------------------------------------------------------------- slurm
def test_slurm_tells_the_memory_sizes_apart_and_says_what_is_site(tmp_path):
    plan = will_it_fit(write(tmp_path, MLP))
    constraint = {card: next(line.split("#")[1].strip() for line in
                             plan.slurm(card=card).splitlines() if "--constraint" in line)
                  for card in ("A100-40GB", "A100-80GB", "H100-80GB")}
    assert constraint == {"A100-40GB": "SBATCH --constraint=a100_40gb",
                          "A100-80GB": "SBATCH --constraint=a100_80gb",
                          "H100-80GB": "SBATCH --constraint=h100_80gb"}
    assert planner.SLURM_FEATURES["V100-16GB"] != planner.SLURM_FEATURES["V100-32GB"]
    assert set(planner.SLURM_FEATURES) == set(KNOWN_GPUS)
    text = plan.slurm(card="A100-80GB")
    assert "--gres=gpu:a100:1" in text  # the gres type stays the GPU's model
    lines = text.splitlines()
    for directive in ("--partition=", "--account=", "--constraint="):
        line = next(x for x in lines if directive in x)
        assert "# SITE" in line, line
    assert "srun --cpus-per-task=$SLURM_CPUS_PER_TASK python" in text
    assert "source .venv/bin/activate" in text and "module load cuda" not in text


def test_slurm_mem_counts_the_process_and_the_workers(tmp_path):
    plan = will_it_fit(write(tmp_path, MLP))
    assert plan.host_peak_bytes >= 100 * MiB  # the whole process: torch itself is > 100 MB
    plan.workers = 4
    mem = next(x for x in plan.slurm().splitlines() if "--mem=" in x)
    per_rank = plan.host_peak_bytes + planner.CUDA_HOST_BYTES + 4 * planner.WORKER_HOST_BYTES
    assert f"--mem={math.ceil(1.25 * per_rank / GiB)}G" in mem
    assert "process peak RSS" in mem and "4 DataLoader workers" in mem


@pytest.mark.parametrize("bad", ["nan", math.nan, "soon", "1:2:3:4", "", "0", 0, -5, 1.5,
                                 math.inf, "00:00:00"])
def test_slurm_time_limit_is_checked(tmp_path, bad):
    plan = will_it_fit(write(tmp_path, MLP))
    with pytest.raises(ValueError, match="time_limit"):
        plan.slurm(time_limit=bad)


def test_slurm_time_limit_formats(tmp_path):
    plan = will_it_fit(write(tmp_path, MLP))
    for good in ("30", "30:00", "01:00:00", "2-0", "2-12:00", "1-00:00:00"):
        assert f"--time={good} " in plan.slurm(time_limit=good)
    assert "--time=90 " in plan.slurm(time_limit=90)
    with pytest.raises(TypeError, match="time_limit"):
        plan.slurm(time_limit=None)


def test_slurm_warns_about_bf16_below_compute_capability_8(tmp_path):
    bf16 = write(tmp_path, MLP.replace("    loss = nn.functional",
                                       "    with torch.autocast('cuda', dtype=torch.bfloat16):"
                                       "\n        loss = nn.functional"), "bf16.py")
    plan = will_it_fit(bf16)
    assert plan.uses_bf16
    assert "bfloat16" in plan.slurm(card="T4") and "emulated" in plan.slurm(card="T4")
    assert "emulated" not in plan.slurm(card="A100-40GB")
    assert not will_it_fit(write(tmp_path, MLP)).uses_bf16


def test_ddp_without_a_ddp_script_asks_for_one_gpu(tmp_path):
    plan = will_it_fit(write(tmp_path, MLP), ddp=4)
    assert not plan.script_ddp
    text = plan.slurm()
    assert "torchrun --" not in text and "--gpus-per-node=1" in text
    assert "lesson 03" in text and "does not set up DDP" in text
    assert any("does not set up DDP" in n for n in plan.notes)


def test_ddp_with_a_ddp_script_writes_torchrun(in_tmp):
    path = Path(__file__).resolve().parents[3] / "scripts" / "ddp_train.py"
    plan = will_it_fit(str(path), ["--log-every", "1"], ddp=4)
    assert plan.script_ddp
    assert "torchrun --standalone --nproc_per_node=4" in plan.slurm()


# ------------------------------------------------------------------------- the CLI
def test_a_scripts_own_gpu_option_reaches_the_script(tmp_path, capsys):
    from helpers.fit import main, split_argv, split_argv_notes

    script = write(tmp_path, WIDE)
    # after the script, --gpu is the script's (its source defines it), with a note
    mine, theirs, notes = split_argv_notes([script, "--gpu", "0", "--slurm"])
    assert mine == [script, "--slurm"] and theirs == ["--gpu", "0"]
    assert notes and "--gpu" in notes[0] and "before the script" in notes[0]
    # before the script: the planner's
    mine, theirs = split_argv(["--gpu", "T4", script, "--gpu=1"])
    assert mine == [script, "--gpu=T4"] and theirs == ["--gpu=1"]
    # a script that does not define --gpu: the planner's wherever it is
    other = write(tmp_path, MLP, "mlp.py")
    assert split_argv([other, "--gpu", "T4"]) == ([other, "--gpu=T4"], [])
    assert main(["--gpu", "T4", script, "--gpu", "0"]) == 0
    captured = capsys.readouterr()
    assert "script's gpu: 0" in captured.out and "virtual T4" in captured.out
    assert "went to the script" in captured.err


def test_cli_margin_and_help(tmp_path, capsys):
    from helpers.fit import main, parser

    assert main([write(tmp_path, MLP), "--margin", "20%", "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["margin_fraction"] == 0.2 and data["margin"] == "20 %"
    assert main([write(tmp_path, MLP), "--margin", "lots"]) == 2
    assert "margin" in capsys.readouterr().err
    text = parser().format_help()
    for words in ("RESERVED", "--margin", "max(15 %, 2 GiB)", "7 B model", "bytes",
                  "recommended"):
        assert words in text, words
