"""Static checks of every lesson notebook: structure, sync, stored outputs, README table."""

import json
import re
from pathlib import Path

import pytest

from helpers.authoring import build, pacing

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob(build.LESSON_GLOB))
LESSONS = sorted((ROOT / "lessons").glob(build.LESSON_GLOB))
ALL = SOLUTIONS + LESSONS
TIME_LINE = re.compile(r"\*\*Time:\*\* (\d+) min teaching \+ (\d+) min exercises")
ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(root|home|tmp|work|Users|private|var/folders)/")


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def markdown(nb):
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def lesson_minutes(path):
    match = TIME_LINE.search(markdown(load(path)))
    assert match, f"{path.name}: no '**Time:** N min teaching + M min exercises' line"
    return int(match.group(1)), int(match.group(2))


def test_there_are_lessons():
    assert SOLUTIONS, "solutions/ holds no notebooks"
    assert [p.name for p in SOLUTIONS] == [p.name for p in LESSONS]
    # every notebook is a lesson NN_topic, so every test here and tests/test_lesson_time.py
    # (which globs solutions/NN*.ipynb) covers it, a lesson 10 too
    assert sorted((ROOT / "solutions").glob("*.ipynb")) == SOLUTIONS


def test_lessons_are_generated_from_solutions():
    assert build.build_lessons(check=True) == [], "run `make lessons`"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_lesson_structure(path):
    nb = load(path)
    text = markdown(nb)
    first = "".join(nb["cells"][0]["source"])
    assert first.startswith("# ") and text.count("\n# ") == 0, "exactly one H1 title, first"
    for heading in ("## Questions", "## Objectives", "## What you need", "## Setup",
                    "## Key points", "## Further reading"):
        assert heading in text, f"{path.name}: missing '{heading}'"
    lesson_minutes(path)
    pacing.sections(nb, path.stem)  # '## Going further' (if any) ends before Key points
    n_ex = len(build.exercises_in(path))
    assert n_ex >= 2 or path.name.startswith("00_"), f"{path.name}: needs 2+ challenges"


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_stored_outputs_are_clean(path):
    nb = load(path)
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        if "predict" in tags and path.parent.name == "lessons":
            # learners predict the result first: the learner copy does not show it
            assert not cell.get("outputs") and cell.get("execution_count") is None, \
                f"cell {i}: a 'predict' cell shows its result in lessons/: run `make lessons`"
            continue
        assert cell.get("execution_count") is not None, f"cell {i} was never executed"
        for out in cell.get("outputs", []):
            blob = "".join(out.get("text", "")) + json.dumps(out.get("data", {}))
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                assert not re.search(r"\w+Warning\b", blob), f"cell {i}: a warning in stderr"
            assert not re.search(r"(Future|Deprecation)Warning", blob), \
                f"cell {i}: a deprecation warning in the output"
            assert not ABSOLUTE_PATH.search(blob), f"cell {i}: absolute path in output"
            if out.get("output_type") == "error":
                assert "raises-exception" in tags, f"cell {i}: unexpected error stored"
            assert "image/png" not in out.get("data", {}) or len(
                out["data"]["image/png"]) < 400_000, f"cell {i}: image too large"
        assert "execution" not in cell.get("metadata", {}), f"cell {i}: timing metadata"
    assert "widgets" not in nb.get("metadata", {}), "widget state stored"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_learner_copies_lock_collapse_and_hide_predictions(path):
    """lessons/: Setup and check cells are locked, check cells collapsed under '# Check: ...',
    'predict' cells show no result and nbval ignores their output (solutions/ compares it)."""
    lesson, solution = build.read(ROOT / "lessons" / path.name), build.read(path)
    locked = {"deletable": False, "editable": False}
    setup = build.setup_cell_index(lesson.cells)
    assert setup is not None, f"{path.name}: no code cell after '## Setup'"
    assert {k: lesson.cells[setup].metadata.get(k) for k in locked} == locked, "Setup cell"
    for ex in build.exercises_in(path):
        check = lesson.cells[ex.check_index]
        assert {k: check.metadata.get(k) for k in locked} == locked, f"{ex.id}: check cell"
        assert check.metadata.get("jupyter", {}).get("source_hidden") is True, ex.id
        first = check.source.splitlines()[0]
        title = build.challenge_title(solution.cells, ex.cell_index)
        assert title, f"{ex.id}: no '### Challenge: ...' heading above the exercise"
        assert first == f"# Check: {title}", f"{ex.id}: {first!r}"
    for i, cell in enumerate(solution.cells):
        if "predict" in build.tags(cell):
            assert cell.cell_type == "code", f"cell {i}: only code cells are tagged 'predict'"
            assert cell.outputs, f"cell {i}: a 'predict' cell shows its result in solutions/"
            assert "nbval-ignore-output" in build.tags(lesson.cells[i]), f"lessons/ cell {i}"


def test_most_outputs_are_compared():
    compared = ignored = 0
    for path in ALL:
        for cell in load(path)["cells"]:
            if cell["cell_type"] == "code" and cell.get("outputs"):
                tags = set(cell.get("metadata", {}).get("tags", []))
                if tags & {"nbval-ignore-output", "nbval-skip"}:
                    ignored += 1
                else:
                    compared += 1
    share = compared / max(1, compared + ignored)
    print(f"code cells with output: {compared} compared, {ignored} ignored ({share:.0%})")
    assert share >= 0.75


ROW = re.compile(rf"\| \[({build.LESSON_STEM})\]\(lessons/({build.LESSON_STEM})\.ipynb\) \|.*"
                 r"\| (\d+) \+ (\d+) \|")


def readme_rows():
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) == m.group(2), line
            rows[m.group(1)] = (int(m.group(3)), int(m.group(4)))
    return rows


def test_readme_table_lists_every_lesson_with_its_minutes():
    rows = readme_rows()
    assert sorted(rows) == [p.stem for p in SOLUTIONS]
    for path in SOLUTIONS:
        assert rows[path.stem] == lesson_minutes(path), f"{path.stem}: README minutes differ"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_checks_pass_on_solutions_and_not_on_stubs(path):
    """Learners never have to guess: the check says 'solved' for the solution and
    'not solved yet' for the stub, in the stored outputs of both notebooks."""
    for folder, verdict in (("solutions", ": solved: "), ("lessons", ": not solved yet: ")):
        nb = load(ROOT / folder / path.name)
        for ex in build.exercises_in(ROOT / "solutions" / path.name):
            cells = nb["cells"]
            check_cell = next(c for c in cells[ex.cell_index + 1:] if c["cell_type"] == "code")
            shown = json.dumps(check_cell.get("outputs", []))
            assert f"Challenge {ex.id}{verdict}" in shown, f"{folder}/{path.name} {ex.id}"


def test_lesson_00_links_every_lesson_in_order():
    """`make lab` opens lesson 00: it is the index a learner starts from."""
    text = markdown(load(ROOT / "solutions" / "00_setup.ipynb"))
    links = re.findall(rf"\]\(({build.LESSON_STEM})\.ipynb\)", text)
    assert links == [p.stem for p in SOLUTIONS]
