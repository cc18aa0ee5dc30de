"""Committing a GPU run's results must leave `make test` green on a CPU machine (review C4).

The GPU checks write `tests/gpu/results/*.json`; lessons 07 and 09 show those files. A cell
whose output is what some GPU recorded cannot be compared with the output stored on another
machine, so it is not compared (`nbval-ignore-output`), and it must run on real results. This
test "commits" a sample set (`tests/data/sample_gpu_results/`, through
`GPU_LESSONS_RESULTS_DIR`): every file validates, and every lesson cell that reads recorded
results runs on them, printing their label instead of "no recorded results".
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "sample_gpu_results"
READERS = ("recorded_gpu_results(", "throughput_gpu_results(")
NOTEBOOKS = sorted((ROOT / "solutions").glob("*.ipynb")) + sorted(
    (ROOT / "lessons").glob("*.ipynb"))


def _cells_reading_results():
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for i, cell in enumerate(nb["cells"]):
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and any(r in source for r in READERS):
                yield path, i, cell, source


def test_cells_showing_recorded_results_are_not_compared():
    cells = list(_cells_reading_results())
    assert {p.stem for p, *_ in cells} >= {"07b_precision_in_practice", "09_throughput"}
    untagged = [f"{p.relative_to(ROOT)} cell {i}" for p, i, cell, _ in cells
                if "nbval-ignore-output" not in cell["metadata"].get("tags", [])]
    assert not untagged, ("these cells print what a GPU recorded, which changes when results "
                          f"are committed; tag them nbval-ignore-output: {untagged}")


def test_a_committed_sample_results_set_keeps_the_cpu_suite_green(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(SAMPLE, results, ignore=shutil.ignore_patterns("*.md"))
    gpu_check = load_script("gpu_check", "gpu_check_for_results")
    for path in sorted(results.glob("*.json")):
        assert gpu_check.validate_record(json.loads(path.read_text())) == [], path.name
    monkeypatch.setenv("GPU_LESSONS_RESULTS_DIR", str(results))
    import helpers

    ran = 0
    for path, i, _, source in _cells_reading_results():
        if path.parent.name != "solutions":  # the learner copies hold the same cells
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(source, f"{path.name} cell {i}", "exec"), {"helpers": helpers})
        printed = out.getvalue()
        assert "NVIDIA H200" in printed and "No recorded GPU results" not in printed, (
            f"{path.name} cell {i} did not show the committed results:\n{printed}")
        ran += 1
    assert ran >= 2


@pytest.mark.parametrize("name", ["memory", "amp", "09_throughput", "planner"])
def test_results_are_read_from_the_folder_the_environment_names(name, tmp_path, monkeypatch):
    import helpers

    monkeypatch.setenv("GPU_LESSONS_RESULTS_DIR", str(tmp_path))
    assert helpers.recorded_gpu_results(name) is None  # nothing there yet
    shutil.copy(SAMPLE / f"{name}.json", tmp_path)
    assert helpers.recorded_gpu_results(name).label.startswith(
        "Recorded GPU results: NVIDIA H200")
