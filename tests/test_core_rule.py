"""The core rule (helpers/authoring/core_rule.py): every core exercise is plain code.

A core exercise's solution may use the kit only as an instrument, a factory, a check, setup
or display (core_rule.ALLOWED, explained in CONTRIBUTING.md); helpers that do the learner's
job belong in Going further. Every solutions notebook is read, so a new lesson is too.
"""

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from helpers.authoring import build, core_rule

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob(build.LESSON_GLOB))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_core_exercises_are_plain_code(path):
    found = core_rule.violations(path)
    assert not found, "\n".join(map(str, found))


def test_every_allowed_name_is_in_the_kit_and_has_a_reason():
    import helpers

    for name, reason in core_rule.ALLOWED.items():
        assert hasattr(helpers, name), name
        assert reason.split(":")[0] in {"instrument", "factory", "check", "setup", "display",
                                         "data"}, (name, reason)


def test_kit_names_finds_attributes_imports_and_submodules():
    code = ("import helpers\n"
            "n = helpers.find_batch_size(step)\n"
            "with helpers.VirtualGPU('L4').paused():\n"
            "    plan = helpers.memory.planner.will_it_fit('t.py')\n"
            "from helpers import MLP, save_checkpoint\n"
            "import helpers.launch as launch\n"
            "!torchrun --nproc-per-node=2 train.py\n"
            "%time x = 1\n"
            "job = !{limits} python _runs/05b/job.py\n")
    assert core_rule.kit_names(code) == [
        ("find_batch_size", 2), ("VirtualGPU", 3), ("memory.planner.will_it_fit", 4),
        ("MLP", 5), ("save_checkpoint", 5), ("launch", 6)]
    assert core_rule.kit_names("#!/bin/bash\nsrun python train.py $@\nif [ -f x ]; then") == []
    # an IPython line inside a block keeps the block valid Python
    assert core_rule.kit_names("for n in (1, 2):\n    !echo $n\nhelpers.save_checkpoint(m)") \
        == [("save_checkpoint", 3)]
    with pytest.raises(TypeError, match="code must be a str"):
        core_rule.kit_names(None)


def lesson(tmp_path, solution, *, further=False, name="42_demo.ipynb"):
    cells = [new_markdown_cell("# Demo\n\n**Time:** 5 min teaching + 5 min exercises"),
             new_markdown_cell("## Setup"), new_code_cell("import helpers")]
    if further:
        cells.append(new_markdown_cell("## Going further"))
    cells.append(new_markdown_cell("### Challenge: find the batch"))
    cell = new_code_cell(solution)
    cell.metadata["tags"] = ["solution"]
    cell.metadata["exercise"] = {"id": "42-find", "stub": "n = None", "minutes": 5}
    cells += [cell, new_code_cell('helpers.check("42-find", lambda: None)'),
              new_markdown_cell("## Key points\n- one")]
    path = tmp_path / name
    nbformat.write(new_notebook(cells=cells), str(path))
    return path


def test_a_kit_shortcut_in_a_core_exercise_fails_and_is_named(tmp_path):
    path = lesson(tmp_path, "# Task: find the largest batch.\n"
                            "with helpers.virtual_cuda('L40S'):\n"
                            "    n = helpers.find_batch_size(step)\n")
    (use,) = core_rule.violations(path)
    assert (use.exercise, use.name, use.line) == ("42-find", "find_batch_size", 2)
    assert "42_demo.ipynb exercise 42-find line 2: helpers.find_batch_size" in str(use)


def test_the_same_shortcut_in_going_further_passes(tmp_path):
    code = "# Task: find the largest batch.\nn = helpers.find_batch_size(step)\n"
    assert core_rule.violations(lesson(tmp_path, code, further=True)) == []


def test_a_writefile_exercise_keeps_its_magic_on_top_of_the_learner_copy(tmp_path):
    path = lesson(tmp_path, "%%writefile train.py\n# Task: end the script cleanly.\n"
                            "import torch.distributed as dist\ndist.destroy_process_group()\n")
    (ex,) = build.exercises_in(path)
    assert ex.task == "%%writefile train.py\n# Task: end the script cleanly."
    assert ex.solution == "import torch.distributed as dist\ndist.destroy_process_group()"
    learner = build.lesson_from_solution(path)
    stub = next(c for c in learner.cells if "exercise" in c.metadata)
    assert stub.source == "%%writefile train.py\n# Task: end the script cleanly.\nn = None"
    assert core_rule.violations(path) == []
