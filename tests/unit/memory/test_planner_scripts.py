"""The planner on the realistic scripts in tests/planner_scripts/, run unmodified.

Each script is planned twice at its small default sizes: with fake tensors (the planner's
way) and with real CPU tensors under the same virtual card (``fake=False``: every kernel
really runs, nothing is fake). Both must agree to the byte, category by category, at the
same line. The scripts' files are checked to be the ones in git (never edited by a test).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from planner_common import SCRIPTS

from helpers.memory.planner import PlanError, will_it_fit

# script -> (arguments, optimizer steps to run: past the first epoch where the script saves
#            or validates, what it reads from GPU tensors, its torch.save calls, notes)
CASES = {
    "mlp_cuda_everywhere.py": ([], 2, set(), 0, []),
    "cnn_accelerator.py": ([], 5, {"item()"}, 1, ["num_workers=2", "pin_memory"]),
    # float16 convolutions are very slow on a CPU: the real run needs --no-amp
    "resnet_amp.py": (["--no-amp"], 2, {"bool()", "item()"}, 0, []),
    "transformer_lm.py": ([], 2, {"item()"}, 0, []),
    "lightning_style.py": ([], 9, {"bool()", "item()"}, 1, []),
    # two optimizers: planned when each has stepped twice
    "gan_two_optimizers.py": ([], 2, {"item()"}, 0, []),
    # module moves that keep the Parameter objects (issue 32), the default device
    "tied_lm.py": ([], 2, {"item()"}, 0, []),
    "optimizer_before_cuda.py": ([], 2, {"item()"}, 0, []),
    "half_after_cuda.py": ([], 2, {"item()"}, 0, []),
    "default_device.py": ([], 2, {"item()"}, 0, []),
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the scripts make folders and files where they run
    return tmp_path


@pytest.mark.parametrize("name", sorted(CASES))
def test_fake_plan_equals_a_real_cpu_run(name, in_tmp, capsys):
    args, steps, reads, n_saves, notes = CASES[name]
    path = SCRIPTS / name
    before = _digest(path)
    fake = will_it_fit(str(path), args, steps=steps)
    real = will_it_fit(str(path), args, steps=steps, fake=False)
    assert _digest(path) == before
    assert fake.stopped == real.stopped == "steps"
    assert fake.peak_allocated_bytes == real.peak_allocated_bytes
    assert fake.categories == real.categories
    assert fake.peak_line == real.peak_line and fake.peak_line is not None
    assert fake.peak_line.file == str(path)
    assert {s.what for s in fake.stand_ins} >= reads
    assert all(s.where is not None and s.where.file == str(path) for s in fake.stand_ins)
    assert len(fake.saves) == n_saves and all(s.file == str(path) for s in fake.saves)
    for word in notes:
        assert any(word in n for n in fake.notes), (word, list(fake.notes))
    assert not list(in_tmp.glob("**/*.pt"))  # torch.save was skipped in both runs
    c = fake.categories
    assert c["parameters"] > 0 and c["optimizer state"] > 0
    assert sum(c.values()) <= fake.peak_allocated_bytes


def test_the_full_size_resnet50_plans_and_amp_halves_activations(in_tmp):
    args = ["--batch-size", "64", "--image-size", "224", "--samples", "128"]
    fp32 = will_it_fit(str(SCRIPTS / "resnet_amp.py"), [*args, "--no-amp"])
    fp16 = will_it_fit(str(SCRIPTS / "resnet_amp.py"), args)
    acts32 = fp32.categories["activations and temporaries"]
    acts16 = fp16.categories["activations and temporaries"]
    assert fp32.categories["parameters"] == 25_557_032 * 4  # torchvision's resnet50 count
    assert 0.4 < acts16 / acts32 < 0.75  # half-size activations, some kept in float32
    assert any("autocast('cuda', torch.float16)" in n for n in fp16.notes)


def test_gradient_accumulation_steps_count_optimizer_steps(in_tmp):
    """--accum-steps 4: two optimizer steps are eight forward passes."""
    plan = will_it_fit(str(SCRIPTS / "transformer_lm.py"), ["--accum-steps", "4"])
    assert plan.stopped == "steps"
    assert sum(s.count for s in plan.stand_ins if s.what == "item()") >= 1


def test_a_script_that_never_steps_is_stopped(in_tmp):
    with pytest.raises(PlanError, match=r"never called optimizer\.step\(\) in 50 forward"):
        will_it_fit(str(SCRIPTS / "never_steps.py"))


def test_scripts_do_not_import_the_kit():
    for path in SCRIPTS.glob("*.py"):
        text = path.read_text()
        assert "import helpers" not in text and "from helpers" not in text, path.name
        assert "torch.cuda.amp" not in text, path.name
    assert os.path.exists(SCRIPTS / "README.md")


def test_the_kits_ddp_script_takes_its_cuda_branches(in_tmp):
    """scripts/ddp_train.py always starts a process group, turns AMP on when
    ``device.type == "cuda"`` and ends with ``os._exit``: all of it is planned."""
    path = Path(__file__).resolve().parents[3] / "scripts" / "ddp_train.py"
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    environ = {name: os.environ.get(name) for name in names}
    plan = will_it_fit(str(path), ["--log-every", "1"], ddp=4)
    # the script sets these for its one-process group: put back afterwards
    assert {name: os.environ.get(name) for name in names} == environ
    notes = " ".join(plan.notes)
    assert "one-process gloo group" in notes
    assert "autocast('cuda', torch.float16)" in notes  # the CUDA branch: AMP on
    assert "DistributedDataParallel itself" in notes and plan.ddp_bucket_bytes == 0
    reads = {(s.what, s.where.line) for s in plan.stand_ins}
    assert any(what == "cpu()" for what, _ in reads)
    assert plan.stopped == "steps"


def test_half_after_cuda_back_to_float32(in_tmp):
    """``model.cuda().half()``, a second ``.to()`` with channels_last, then ``model.float()``:
    the same bytes as a real CPU run, float32 parameters, and twice the float16 ones."""
    path = str(SCRIPTS / "half_after_cuda.py")
    fp16 = will_it_fit(path)
    fake, real = will_it_fit(path, ["--float32"]), will_it_fit(path, ["--float32"], fake=False)
    assert fake.peak_allocated_bytes == real.peak_allocated_bytes
    assert fake.categories == real.categories
    assert fake.categories["parameters"] == 2 * fp16.categories["parameters"]
    assert fake.categories["buffers"] > 0 and fp16.categories["buffers"] > 0
