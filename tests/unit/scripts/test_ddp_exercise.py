"""Lesson 03's challenge 03-ddp-script: the solved script, its stub and the check cell.

The solution and the stub (a ``%%writefile _runs/ddp_train.py`` cell) are read from
solutions/03_multi_gpu.ipynb; the check cell's own code runs here (with the names the lesson
defines before it), so the messages tested are the ones learners see. Each launch starts 2
CPU processes over gloo with torchrun (~5 s). Also: the BatchNorm cell of its Going further
part with a one-GPU plan (world size 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from script_loader import load_script

import helpers
from helpers.authoring import build

NOTEBOOK = build.SOLUTIONS / "03_multi_gpu.ipynb"
stress = load_script("stress_ddp", "stress_ddp_exercise")


@pytest.fixture
def lesson(tmp_path, monkeypatch):
    """Writes a version of the exercise's script, then defines the check cell's function."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # 2 CPU processes, also on a GPU machine
    nb = build.read(NOTEBOOK)
    (ex,) = [e for e in build.exercises_in(NOTEBOOK, nb) if e.id == stress.EXERCISE_ID]
    assert nb.cells[ex.cell_index].source.startswith("%%writefile _runs/ddp_train.py\n")

    def run(version):
        runs = Path("_runs")
        runs.mkdir(exist_ok=True)
        (runs / "ddp_train.py").write_text(stress.exercise_script(version))
        names = {"helpers": helpers, "torch": torch, "RUNS": runs, "NPROC": 2}
        check_cell = nb.cells[ex.check_index].source
        definition, call = check_cell.rsplit("\nhelpers.check(", 1)
        assert call.startswith(f'"{ex.id}", '), call
        exec(definition, names)  # the check cell's test function, not yet called
        return next(v for k, v in names.items() if k.startswith("test_") and callable(v)), runs

    return run


def test_both_versions_are_the_script_the_stress_run_reads():
    solved, stub = stress.exercise_script("solution"), stress.exercise_script("stub")
    assert "dist.init_process_group(" in solved and "dist.init_process_group(" not in stub
    assert solved.rstrip().endswith("dist.destroy_process_group()") and "os._exit" not in solved
    compile(stub, "stub", "exec")


@pytest.mark.slow
def test_the_solved_script_passes_and_its_checkpoint_loads_with_weights_only(lesson):
    test, runs = lesson("solution")
    message = test()
    assert message.startswith("2 process(es): rank 0's checkpoint loads"), message  # then 3 epochs
    state = torch.load(runs / "check.pt", weights_only=True)
    assert state["epoch"] == 3 and {"torch", "python", "numpy", "cuda"} <= set(state["rng"])


@pytest.mark.slow
def test_the_stub_is_not_solved_and_says_what_is_missing(lesson):
    test, _ = lesson("stub")
    with pytest.raises(helpers.NotSolved, match="^no checkpoint: rank 0 saves"):
        test()


@pytest.mark.slow
def test_a_script_that_saves_a_numpy_array_is_told_why_it_does_not_load(lesson, monkeypatch):
    solved = stress.exercise_script("solution")
    broken = solved.replace("(kind, keys.tolist(), *rest)", "np.random.get_state()")
    assert broken != solved
    monkeypatch.setattr(stress, "exercise_script", lambda version: broken)
    test, _ = lesson("solution")
    with pytest.raises(helpers.NotSolved, match="weights_only=True. refuses the checkpoint"):
        test()


@pytest.mark.slow
def test_make_stress_runs_the_solved_exercise(capsys):
    # the solved script ends with destroy_process_group, so gloo may abort at exit: allow it
    stress.main(["--runs", "1", "--nproc", "2", "--script", "exercise"])
    assert "launches of the solved 03-ddp-script script" in capsys.readouterr().out


def test_the_batchnorm_cell_runs_with_a_one_gpu_plan():
    """With one GPU the DDP run has one process (world 1); the cell still compares 2 shards."""
    nb = build.read(NOTEBOOK)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and "bn_model = " in c.source]
    cfg = {"seed": 0, "features": 8, "classes": 3}
    torch.manual_seed(0)
    xg, yg = torch.randn(64, 8), torch.randint(0, 3, (64,))
    names = {"torch": torch, "cfg": cfg, "xg": xg, "yg": yg,
             "world": helpers.ddp_plan(1).nproc_per_node}
    assert names["world"] == 1
    exec(cell.source, names)
    assert names["shards"] == 2 and names["gap"] > 1e-3
