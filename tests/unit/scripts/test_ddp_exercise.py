"""Lesson 03's challenge 03-ddp-script: the solved script, its stub and the check cell.

The solution and the stub are read from solutions/03_multi_gpu.ipynb; the check cell's own
code runs here (with the names the lesson defines before it), so the messages tested are
the ones learners see. Each launch starts 2 CPU processes over gloo with torchrun (~5 s).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from script_loader import load_script

import helpers
from helpers.authoring import build

NOTEBOOK = build.SOLUTIONS / "03_multi_gpu.ipynb"
stress = load_script("stress_ddp", "stress_ddp_exercise")


@pytest.fixture
def lesson(tmp_path, monkeypatch):
    """Runs a version of the exercise cell, then defines the check cell's function."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # 2 CPU processes, also on a GPU machine
    nb = build.read(NOTEBOOK)
    (ex,) = [e for e in build.exercises_in(NOTEBOOK, nb) if e.id == stress.EXERCISE_ID]

    def run(version):
        runs = Path("_runs")
        runs.mkdir(exist_ok=True)
        names = {"helpers": helpers, "json": json, "shutil": shutil, "Path": Path,
                 "RUNS": runs, "plan": helpers.ddp_plan(0)}
        exec(ex.solution if version == "solution" else ex.stub, names)
        check_cell = nb.cells[ex.check_index].source
        definition, call = check_cell.rsplit("\nhelpers.check(", 1)
        assert call.startswith(f'"{ex.id}", '), call
        exec(definition, names)  # the check cell's test function, not yet called
        test = next(v for k, v in names.items() if k.startswith("test_") and callable(v))
        return test, runs

    return run


def test_both_versions_assign_the_script_the_stress_run_reads():
    solved, stub = stress.exercise_script("solution"), stress.exercise_script("stub")
    assert "dist.init_process_group(" in solved and "dist.init_process_group(" not in stub
    assert stub.count("# your code:") >= 6
    compile(stub, "stub", "exec")


@pytest.mark.slow
def test_the_solved_script_trains_with_disjoint_shards_and_one_checkpoint(lesson):
    test, runs = lesson("solution")
    message = test()
    assert message.startswith("2 processes over gloo: disjoint shards"), message
    out = runs / "ddp_exercise"
    ranks = [json.loads((out / f"summary-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2] and all(r["finished"] for r in ranks)
    for epoch in (0, 1):
        first, second = (set(r["seen"][epoch]) for r in ranks)
        assert not first & second and first | second == set(range(64))
    assert all(r["seen"][0] != r["seen"][1] for r in ranks)  # set_epoch: a new order
    assert ranks[0]["parameters"] == ranks[1]["parameters"]
    assert [len(r["saved"]) for r in ranks] == [1, 0] and (out / "checkpoint.pt").is_file()
    assert all(r["left_group"] and r["checkpoint_complete"] for r in ranks)


@pytest.mark.slow
def test_the_stub_is_not_solved_and_says_what_is_missing(lesson):
    test, _ = lesson("stub")
    with pytest.raises(helpers.NotSolved, match="^no process group: call dist.init_process"):
        test()


@pytest.mark.slow
def test_make_stress_runs_the_solved_exercise(capsys):
    assert stress.main(["--runs", "1", "--nproc", "2", "--script", "exercise"]) == 0
    out = capsys.readouterr().out
    assert "launches of the solved 03-ddp-script script" in out and "failures: 0 of 1" in out
