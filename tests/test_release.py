"""Learner bundles hold no solution code; learners' own copies survive kit updates."""

import zipfile
from pathlib import Path

import nbformat
import pytest

from helpers.authoring import build

ROOT = Path(__file__).resolve().parents[1]


def distinctive_lines(ex, solution_nb):
    """Lines of a solution that appear nowhere else in its notebook or its stub."""
    others = "\n".join(
        [c.source for i, c in enumerate(solution_nb.cells) if i != ex.cell_index] + [ex.stub]
    )
    lines = {line.strip() for line in ex.solution.splitlines()}
    return sorted(s for s in lines if len(s) >= 20 and s not in others and not s.startswith("#"))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    return build.release(out_dir=out), build.release(solutions=True, out_dir=out)


def test_learner_bundle_contains_no_solution_code(bundles):
    learner, _ = bundles
    with zipfile.ZipFile(learner) as zf:
        names = zf.namelist()
        texts = {n: zf.read(n).decode("utf-8", "replace") for n in names}
    assert not [n for n in names if "/solutions/" in n], "solutions/ must not be shipped"
    assert not [n for n in names if "/docs/" in n], "instructor notes must not be shipped"
    readme = next(t for n, t in texts.items() if n.endswith("/README.md"))
    assert "docs/instructor-notes.md" not in readme and "## For authors" in readme
    assert any(n.endswith("lessons/00_setup.ipynb") for n in names)
    # every tracked module of every layer folder (helpers/core, memory, tf, ...) is shipped
    shipped = {n.split("/", 1)[1] for n in names}
    tracked = {str(p.relative_to(ROOT)) for p in build._tracked_files(["helpers"])}
    assert any(t.startswith("helpers/memory/") for t in tracked)
    assert not tracked - shipped, f"missing from the bundle: {sorted(tracked - shipped)}"
    checked = 0
    for path in sorted(build.SOLUTIONS.glob(build.LESSON_GLOB)):
        nb = nbformat.read(str(path), 4)
        for ex in build.exercises_in(path, nb):
            lines = distinctive_lines(ex, nb)
            assert not leaks(lines, texts), f"{ex.id}: its solution is in {leaks(lines, texts)}"
            # the rule finds a solution pasted into any shipped file
            if len(lines) >= 2:
                assert leaks(lines, {"copy.py": "\n".join(lines)}) == {"copy.py": len(lines)}
            checked += len(lines)
    assert checked >= 10, "too few solution lines to make this test meaningful"


def leaks(lines, texts) -> dict[str, int]:
    """The files holding more than half of a solution's distinctive lines (two at least), with
    how many. Core exercises are plain PyTorch, so one idiom of them (`for i in
    range(torch.cuda.device_count()):`) may also be in the quick reference, a script or the
    kit's code, as in any documentation; a file with most of the solution gives it away."""
    found = {}
    for name, text in texts.items():
        shared = sum(1 for line in lines if line in text)
        if shared >= 2 and shared > len(lines) / 2:
            found[name] = shared
    return found


def test_solutions_bundle_adds_the_solutions(bundles):
    _, with_solutions = bundles
    with zipfile.ZipFile(with_solutions) as zf:
        names = zf.namelist()
    solutions = {p.name for p in build.SOLUTIONS.glob("*.ipynb")}
    assert solutions == {Path(n).name for n in names if "/solutions/" in n}


def test_personal_copy_never_overwrites_and_refresh_backs_up(tmp_path):
    mine = tmp_path / "my-lessons"
    first = build.personal_copy(folder=mine)
    lessons = sorted(p.name for p in build.LESSONS.glob(build.LESSON_GLOB))
    assert sorted(p.name for p in mine.glob("*.ipynb")) == lessons
    assert len(first) == len(lessons)
    edited = mine / lessons[0]
    edited.write_text(edited.read_text() + " ")  # the learner's work
    assert build.personal_copy(folder=mine) == []
    assert edited.read_text().endswith(" ")
    (mine / lessons[-1]).unlink()  # a lesson new to this learner is added
    assert build.personal_copy(folder=mine) == [f"{lessons[-1]}: fresh copy in my-lessons/"]
    done = build.personal_copy(refresh=[lessons[0][:2]], folder=mine)
    assert "moved to my-lessons/backup/" in done[0]
    assert not edited.read_text().endswith(" ")
    (backup,) = (mine / "backup").glob("*.ipynb")
    assert backup.read_text().endswith(" ")
