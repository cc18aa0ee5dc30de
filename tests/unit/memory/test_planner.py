"""The planner (``helpers.will_it_fit``, ``python -m helpers.fit``): exact against a hand
computation and a real CPU run, the CUDA stand-ins, the report, the fixes, bad input."""

from __future__ import annotations

import os

import pytest
import torch
from planner_common import MLP, round512, write

import helpers
from helpers.memory import planner
from helpers.memory.capacity import KNOWN_GPUS
from helpers.memory.planner import PlanError, will_it_fit


# ------------------------------------------------------------------------- exactness
def test_hand_computed_mlp(tmp_path):
    """Adam's 2nd step: parameters P, gradients P, two moments 2P, the batch, and foreach
    Adam's square root of the second moments (P) alive at the peak: 5P + inputs + loss."""
    plan = will_it_fit(write(tmp_path, MLP))
    shapes = [(256, 256), (256,), (10, 256), (10,)]
    p_bytes = sum(4 * torch.Size(s).numel() for s in shapes)
    inputs = 4 * 256 * 4 + 8 * 4  # x (float32) and y (int64)
    assert plan.categories == {"parameters": p_bytes, "gradients": p_bytes,
                               "optimizer state": 2 * p_bytes, "buffers": 0,
                               "inputs": inputs, "activations and temporaries": p_bytes + 4}
    assert plan.peak_phase == "optimizer" and plan.peak_op == "aten._foreach_sqrt"
    assert plan.peak_line.line == 13 and plan.peak_line.code == "opt.step()"
    # the caching allocator's 512-byte blocks, tensor by tensor
    blocks = sum(round512(4 * torch.Size(s).numel()) for s in shapes)
    assert plan.peak_allocated_bytes == 5 * blocks + round512(4096) + round512(32) + 512
    assert plan.parameter_bytes == p_bytes
    assert plan.stopped == "steps" and plan.steps == 2
    # by phase: the optimizer step holds the peak; the forward pass less than the backward
    peaks = plan.phase_peaks
    assert peaks["optimizer"] == plan.peak_allocated_bytes == max(peaks.values())
    assert peaks["forward"] < peaks["backward"] < peaks["optimizer"]
    assert "peak by phase: forward" in plan.text()


def test_reference_run_without_fake_tensors_agrees(tmp_path):
    script = write(tmp_path, MLP)
    fake, real = will_it_fit(script), will_it_fit(script, fake=False)
    assert fake.peak_allocated_bytes == real.peak_allocated_bytes
    assert fake.categories == real.categories
    assert fake.peak_line == real.peak_line


def test_host_tensors_are_not_counted(tmp_path):
    """A big host tensor the script keeps (a data set in RAM) costs no GPU memory."""
    script = write(tmp_path, MLP.replace("for step", "table = torch.randn(4096, 4096)\nfor step"))
    assert will_it_fit(script).peak_allocated_bytes == \
        will_it_fit(write(tmp_path, MLP, "b.py")).peak_allocated_bytes


# ------------------------------------------------------------------------- stand-ins
STANDINS = """\
import torch
from torch import nn

assert torch.cuda.is_available(), "no GPU"
print(torch.cuda.get_device_name(0))
free, total = torch.cuda.mem_get_info()
device = torch.accelerator.current_accelerator()
model = nn.Linear(8, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(4, 8, device="cuda")
    loss = model(x).square().mean()
    if torch.isnan(loss):
        raise SystemExit("nan")
    if not torch.isfinite(loss).all():
        raise SystemExit("inf")
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.3f}", loss)
    torch.save(model.state_dict(), "model.pt")
"""


def test_stand_ins_are_listed_with_their_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = will_it_fit(write(tmp_path, STANDINS), gpu="L40S")
    out = capsys.readouterr().out
    assert "NVIDIA L40S" in out and "loss 1.000" in out
    got = {(s.what, s.where.line): s.value for s in plan.stand_ins}
    assert got == {("bool()", 13): False, ("bool()", 15): True, ("item()", 20): 1.0,
                   ("print/repr", 20): 1.0}
    assert [s.line for s in plan.saves] == [21]
    assert not (tmp_path / "model.pt").exists()  # torch.save was skipped
    text = plan.text()
    assert "train.py:13: if torch.isnan(loss):" in text and "torch.save calls skipped" in text


def test_strict_stops_at_the_first_value_read(tmp_path):
    with pytest.raises(PlanError, match=r"--strict.*bool\(\).*train.py:13"):
        will_it_fit(write(tmp_path, STANDINS), strict=True)


def test_everything_is_restored_afterwards(tmp_path):
    saved = (torch.save, torch.utils.data.DataLoader.__init__, torch.cuda.is_available(),
             torch.accelerator.is_available(), torch.amp.autocast_mode.autocast.__init__)
    will_it_fit(write(tmp_path, STANDINS))
    with pytest.raises(PlanError):
        will_it_fit(write(tmp_path, "import torch\ntorch.zeros(1).cuda()\n1 / 0\n"))
    assert saved == (torch.save, torch.utils.data.DataLoader.__init__,
                     torch.cuda.is_available(), torch.accelerator.is_available(),
                     torch.amp.autocast_mode.autocast.__init__)
    assert not torch.is_autocast_enabled("cpu")


def test_loader_workers_and_pinning_become_notes(tmp_path):
    script = write(tmp_path, """\
        import torch
        from torch import nn
        ds = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        dl = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True, num_workers=4,
                                         pin_memory=True, persistent_workers=True)
        model = nn.Linear(8, 1).cuda()
        opt = torch.optim.Adam(model.parameters())
        for x, y in dl:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """)
    plan = will_it_fit(script)
    assert plan.workers == 4
    notes = " ".join(plan.notes)
    assert "num_workers=4" in notes and "pin_memory" in notes
    assert plan.categories["inputs"] == 16 * 8 * 4 + 16 * 4


# ------------------------------------------------------------------------- autocast
def test_autocast_cuda_runs_and_lists_ops_that_cuda_keeps_in_fp32(tmp_path):
    script = write(tmp_path, """\
        import torch
        from torch import nn
        model = nn.Linear(64, 64).cuda()
        opt = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cuda")
        for _ in range(2):
            x = torch.randn(32, 64).cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                h = model(x)
                p = torch.softmax(h, dim=-1)
                loss = p.sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    """)
    plan = will_it_fit(script)
    names = {(name, where.line) for name, where, _, _ in plan.autocast_differences}
    assert ("softmax", 10) in names
    assert any("autocast('cuda'" in n for n in plan.notes)


# ------------------------------------------------------------------------- cards
BIG = """\
import argparse
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--width", type=int, default=4096)
args = parser.parse_args()
w = args.width
model = nn.Sequential(*[nn.Sequential(nn.Linear(w, w), nn.ReLU()) for _ in range(8)],
                      nn.Linear(w, 10)).cuda()
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    x = torch.randn(args.batch_size, w, device="cuda")
    loss = model(x).logsumexp(-1).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""


def test_cards_oom_line_and_slurm(tmp_path):
    plan = will_it_fit(write(tmp_path, BIG), ["--batch-size", "200000"])
    assert [c.card for c in plan.cards] == list(KNOWN_GPUS)
    fits = {c.card: c.fits for c in plan.cards}
    assert not fits["T4"] and fits["H200"]
    t4 = plan.card_fit("T4")
    assert t4.oom_at is not None and t4.oom_at.line == 15  # the forward pass
    assert t4.oom_phase == "forward"
    for c in plan.cards:
        assert c.fits == (plan.needed_bytes <= c.capacity_bytes)
        assert c.headroom_bytes == c.capacity_bytes - plan.needed_bytes
    # the verdict's basis: the caching allocator's reserved bytes, not the allocated ones
    assert plan.needed_bytes == plan.peak_reserved_bytes + planner.DEFAULT_CONTEXT
    assert plan.needed_allocated_bytes == plan.peak_allocated_bytes + planner.DEFAULT_CONTEXT
    smallest = plan.smallest_card
    assert smallest not in ("V100-16GB", "V100-32GB")
    slurm = plan.slurm()
    assert "#SBATCH --gpus-per-node=1" in slurm and "SITE" in slurm
    assert f"for the {smallest}" in slurm and "--mem=" in slurm
    assert "train.py --batch-size 200000" in slurm


def test_v100_is_never_recommended_for_a_cuda13_build():
    assert not planner._drivable("V100-32GB", [], "13.0")
    assert planner._drivable("V100-32GB", [], "12.8")
    assert planner._drivable("T4", [], "13.0")
    assert planner._drivable("H200", ["sm_75", "sm_80", "sm_90", "compute_90"], "13.0")
    assert not planner._drivable("V100-16GB", ["sm_75", "sm_80", "sm_90"], "13.0")
    assert planner._drivable("L40S", ["sm_80"], "12.8")  # 8.9 runs sm_80 code
    assert not planner._drivable("H100-80GB", ["sm_80"], "12.8")


def test_fixes_lower_the_predicted_peak(tmp_path):
    plan = will_it_fit(write(tmp_path, BIG), ["--batch-size", "4096", "--width", "512"],
                       amp="bf16", checkpoint_every=2)
    base = plan.peak_allocated_bytes
    assert plan.fixes["--amp bf16"] < base
    assert plan.fixes["--checkpoint-every 2"] < base


def test_batch_search_brackets_each_card(tmp_path):
    script = write(tmp_path, BIG)
    args = ["--batch-size", "64", "--width", "1024"]
    plan = will_it_fit(script, args, batch_arg="--batch-size", multiple_of=4096,
                       max_batch=10**6)
    t4 = plan.card_fit("T4")
    assert t4.largest_batch is not None and t4.largest_batch % 4096 == 0
    for b, fits in ((t4.largest_batch, True), (t4.largest_batch + 4096, False)):
        check = will_it_fit(script, planner._batch_argv(args, "--batch-size", b))
        assert check.card_fit("T4").fits is fits
    by_capacity = sorted(plan.cards, key=lambda c: c.capacity_bytes)
    sizes = [c.largest_batch for c in by_capacity]
    assert sizes == sorted(sizes) and None not in sizes
    assert plan.batch_runs < 8 * 6  # sizes are shared between cards
    assert "largest --batch-size" in plan.text() and not t4.batch_capped
    capped = will_it_fit(script, args, batch_arg="--batch-size", multiple_of=4096,
                         max_batch=8192)
    assert capped.card_fit("T4").largest_batch == 8192 and capped.card_fit("T4").batch_capped
    assert ">= 8192" in capped.text()


def test_ddp_adds_a_copy_of_the_gradients(tmp_path):
    script = write(tmp_path, MLP)
    plain = will_it_fit(script)
    ddp = will_it_fit(script, ddp=4)
    view = will_it_fit(script, ddp=4, gradient_as_bucket_view=True)
    assert ddp.needed_bytes - plain.needed_bytes == plain.parameter_bytes
    assert view.needed_bytes == plain.needed_bytes
    assert "NCCL" in ddp.text()
    # the MLP script does not set up DDP: one GPU, and a note to make it a DDP script
    assert "torchrun --" not in ddp.slurm() and "lesson 03" in ddp.slurm()


# ------------------------------------------------------------------------- bad input
def test_missing_script():
    with pytest.raises(PlanError, match="does not exist"):
        will_it_fit("no/such/train.py")


def test_script_error_shows_the_users_traceback(tmp_path):
    script = write(tmp_path, """\
        import torch

        def build():
            raise ValueError("bad config")

        model = build()
    """)
    with pytest.raises(PlanError, match=r"raised ValueError at .*train.py:4") as info:
        will_it_fit(script)
    assert 'train.py", line 6, in <module>' in info.value.details
    assert 'train.py", line 4, in build' in info.value.details
    assert "runpy" not in info.value.details


def test_a_script_that_never_steps(tmp_path):
    script = write(tmp_path, """\
        import torch
        model = torch.nn.Linear(4, 4).cuda()
        with torch.no_grad():
            while True:
                model(torch.randn(2, 4).cuda())
    """)
    with pytest.raises(PlanError, match=r"never called optimizer.step\(\) in 5 forward") as e:
        will_it_fit(script, max_forwards=5)
    assert e.value.kind == "no-step"
    ended = write(tmp_path, "import torch\nx = torch.zeros(3).cuda()\n", "ends.py")
    with pytest.raises(PlanError, match="ended without calling optimizer.step"):
        will_it_fit(ended)


def test_an_operation_fake_tensors_cannot_run(tmp_path):
    script = write(tmp_path, """\
        import torch
        x = torch.randn(10).cuda()
        kept = x[x > 0]
    """)
    with pytest.raises(PlanError, match=r"cannot run aten\.\w+ at .*train.py:3") as e:
        will_it_fit(script)
    assert e.value.kind == "fake-op"


def test_unknown_card_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="not a known card; known cards: T4, V100-16GB"):
        will_it_fit(write(tmp_path, MLP), gpu="RTX-9090")
    with pytest.raises(TypeError, match="gpu must be a card name"):
        will_it_fit(write(tmp_path, MLP), gpu=40)


def test_tensorflow_scripts_are_pointed_to_keras_tools(tmp_path):
    script = write(tmp_path, "import tensorflow as tf\nmodel = tf.keras.Sequential()\n")
    with pytest.raises(PlanError, match="get_memory_info") as e:
        will_it_fit(script)
    assert e.value.kind == "tensorflow"


@pytest.mark.parametrize("kwargs, error, match", [
    ({"args": "--batch-size 4"}, TypeError, "args must be a list of strings"),
    ({"steps": 0}, ValueError, "steps"),
    ({"amp": "fp8"}, ValueError, "amp"),
    ({"batch_arg": "batch"}, ValueError, "batch_arg must be the script's option"),
    ({"checkpoint_every": 0}, ValueError, "checkpoint_every"),
    ({"ddp": 0}, ValueError, "ddp"),
    ({"context": "lots"}, ValueError, "context"),
    ({"time_limit": 0}, ValueError, "time_limit"),
    ({"strict": "yes"}, TypeError, "strict"),
])
def test_bad_arguments_name_themselves(tmp_path, kwargs, error, match):
    script = write(tmp_path, MLP)
    with pytest.raises(error, match=match):
        will_it_fit(script, **kwargs)


def test_script_path_type():
    with pytest.raises(TypeError, match="script must be the path"):
        will_it_fit(42)


def test_exported_from_helpers():
    assert helpers.will_it_fit is will_it_fit and helpers.PlanError is PlanError


# ------------------------------------------------------------------------- the CLI
def test_cli_help_documents_every_option():
    from helpers import fit

    text = fit.parser().format_help()
    for action in fit.parser()._actions:
        for opt in action.option_strings:
            assert opt in text
        assert action.help, action.dest
    assert "exit status" in text and "--" in text


def test_cli_splits_the_scripts_arguments():
    from helpers.fit import split_argv

    mine, theirs = split_argv(["train.py", "--lr", "0.1", "--gpu", "T4", "--batch-arg",
                               "--batch-size", "--epochs=3", "--slurm", "--", "--steps", "9"])
    assert mine == ["train.py", "--gpu=T4", "--batch-arg=--batch-size", "--slurm"]
    assert theirs == ["--lr", "0.1", "--epochs=3", "--steps", "9"]


def test_cli_exit_codes(tmp_path, capsys):
    from helpers.fit import main

    script = write(tmp_path, BIG)
    assert main([script, "--batch-size", "8", "--width", "256", "--gpu", "T4"]) == 0
    assert "T4" in capsys.readouterr().out
    assert main([script, "--batch-size", "400000", "--gpu", "T4", "--slurm"]) == 1
    out = capsys.readouterr().out
    assert "out of memory" in out and "#SBATCH" in out
    assert main(["missing.py"]) == 2
    assert main([script, "--gpu", "nope"]) == 2
    assert "known cards" in capsys.readouterr().err
    bad = write(tmp_path, "import torch\nraise KeyError('oops')\n", "bad.py")
    assert main([bad]) == 3
    err = capsys.readouterr().err
    assert 'bad.py", line 2' in err and "raised KeyError" in err


def test_cli_json(tmp_path, capsys):
    import json

    from helpers.fit import main

    assert main([write(tmp_path, MLP), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["categories"]["parameters"] == 273448
    assert data["smallest_card"] == "T4"


def test_python_dash_m(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "helpers.fit", "--help"], capture_output=True,
                         text=True, cwd=os.path.dirname(os.path.dirname(helpers.__file__)),
                         check=True)
    assert "usage: python -m helpers.fit" in out.stdout


def test_a_script_that_resumes_from_a_checkpoint(tmp_path, monkeypatch):
    """torch.load(..., map_location="cuda") loads on the host; load_state_dict fills the
    fake parameters (on this CPU build, loading onto CUDA would fail)."""
    monkeypatch.chdir(tmp_path)
    torch.save({"model": torch.nn.Linear(8, 8).state_dict()}, tmp_path / "ck.pt")
    script = write(tmp_path, """\
        import os
        import torch
        from torch import nn
        model = nn.Linear(8, 8).cuda()
        opt = torch.optim.Adam(model.parameters())
        if os.path.exists("ck.pt"):
            model.load_state_dict(torch.load("ck.pt", map_location="cuda")["model"])
        for _ in range(3):
            model(torch.randn(4, 8, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
    """)
    plan = will_it_fit(script)
    assert any("map_location='cuda'" in n for n in plan.notes)
    assert plan.categories["parameters"] == (64 + 8) * 4


def test_the_scripts_global_settings_are_put_back(tmp_path):
    """Seeds, TF32/cuDNN switches and the default dtype a script sets do not leak into the
    notebook (or test) that planned it."""
    import random

    import numpy as np

    script = write(tmp_path, MLP.replace("D, H, C, B", """\
torch.manual_seed(123)
random.seed(1)
np.random.seed(2)
torch.set_float32_matmul_precision("high")
torch.backends.cudnn.benchmark = True
torch.set_default_dtype(torch.float64)
torch.set_default_dtype(torch.float32)
D, H, C, B""").replace("import torch\n", "import random\nimport numpy as np\nimport torch\n"))
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy(),
              torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.benchmark)
    will_it_fit(script)
    after = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy(),
             torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.benchmark)
    assert torch.equal(before[0], after[0]) and before[1] == after[1]
    assert (before[2] == after[2]).all() and before[3:] == after[3:]


def test_to_an_ordinal_keeps_the_dtype_and_host_copies_show_their_shape(tmp_path):
    """``.to(0, torch.float16)`` is a CUDA move with a dtype (an ordinal cannot go through
    ``_parse_to`` on a CPU build); a tensor copied to the host is listed by its shape."""
    script = write(tmp_path, """\
        import torch
        from torch import nn
        model = nn.Linear(8, 8).to(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            x = torch.randn(4, 8).to(0, torch.float16)
            assert x.dtype == torch.float16
            loss = model(x.float()).sum()
            loss.backward()
            opt.step()
            print(model.weight.detach().numpy().shape)
    """)
    plan = will_it_fit(script)
    assert plan.categories["inputs"] == 4 * 8 * 2  # float16 on the card
    values = {s.what: s.value for s in plan.stand_ins}
    assert values["numpy()"] == "zeros(8, 8)"
