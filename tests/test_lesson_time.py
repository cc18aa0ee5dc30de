"""Every lesson's core fits its stated minutes (helpers.authoring.pacing; `make minutes`).

The core estimate (words / 120 + code lines x 15 s + the run time `make outputs` recorded +
exercise minutes; the `## Going further` part left out) must be within 25 % of the
`**Time:** X min teaching + Y min exercises` line, the core's exercise minutes within 25 % of
Y, and every exercise must state its minutes. Every solutions/NN*.ipynb is covered, so a new
lesson (10, ...) is too.
"""

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from helpers.authoring import build, pacing

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob(build.LESSON_GLOB))

@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_core_fits_the_stated_minutes(path):
    t = pacing.estimate(path)
    print(f"{t.name}: stated {t.stated} min, core {t.core.breakdown()}, "
          f"optional {t.optional.minutes:.1f} min", *t.notes, sep="\n  ")
    problems = t.problems()
    assert not problems, "\n".join(problems + [f"note: {n}" for n in t.notes])


# ---------------------------------------------------------------- synthetic lessons


def synthetic(tmp_path, *, words=300, code_lines=30, run_seconds=60.0, minutes=(5, 5),
              time_line="**Time:** 10 min teaching + 10 min exercises", further_words=0,
              name="42_synthetic.ipynb"):
    """A lesson with exactly this much prose (words), code lines a learner reads and run
    time in its core, two exercises, and optionally a Going further part."""
    def prose(n):
        return " ".join(["word"] * n)

    cells = [new_markdown_cell(f"# Synthetic\n\n{time_line}"),
             new_markdown_cell("## Setup"), new_code_cell("import helpers")]
    body_lines = code_lines - 1 - 2 * 3  # Setup; per exercise: 1 task + 1 stub + 1 check line
    cells.append(new_code_cell("\n".join(f"x{i} = {i}" for i in range(body_lines))))
    cells[-1].metadata["run_seconds"] = run_seconds
    # the other markdown (title, Time line, headings, Key points) holds 19 words
    cells.append(new_markdown_cell(prose(words - 19)))
    for n, m in enumerate(minutes):
        ex_id = f"42-task-{'ab'[n]}"
        cells.append(new_markdown_cell(f"### Challenge: {'ab'[n]}"))
        solution = new_code_cell(f"# Task: set y.\ny = {n}")
        solution.metadata["tags"] = ["solution"]
        solution.metadata["exercise"] = {"id": ex_id, "stub": "y = None", "minutes": m}
        cells.append(solution)
        cells.append(new_code_cell(f'helpers.check("{ex_id}", f)\n' + "assert y\n" * 20))
    if further_words:
        cells.append(new_markdown_cell(f"## Going further\n{prose(further_words - 2)}"))
        cells.append(new_code_cell("z = 1\n" * 30))
    cells.append(new_markdown_cell("## Key points\n- one\n\n## Further reading\n- two"))
    path = tmp_path / name
    nbformat.write(new_notebook(cells=cells), str(path))
    return path


def test_synthetic_lesson_that_fits(tmp_path):
    # 306 words / 120 = 2.6 min, 30 lines x 15 s = 7.5 min, 60 s run = 1 min, exercises 10 min
    t = pacing.estimate(synthetic(tmp_path, words=306, further_words=900))
    assert t.core.words == 306
    assert t.core.code_lines == 30
    assert t.core.run_seconds == 60.0
    assert t.core.exercise_minutes == 10
    assert t.stated == 20 and t.verdict == "OK" and t.problems() == []
    assert t.optional.words == 900 and t.optional.code_lines == 30  # never counted as core


def test_synthetic_too_long_lesson_fails(tmp_path):
    # 2 min of prose more than 3 times over, and 10 minutes of run time
    t = pacing.estimate(synthetic(tmp_path, words=1500, run_seconds=600.0))
    assert t.verdict == "TOO LONG"
    (problem,) = t.problems()
    assert "42_synthetic" in problem and "TOO LONG" in problem
    assert "1500 words" in problem and "run 600.0 s" in problem


def test_synthetic_too_short_lesson_fails(tmp_path):
    t = pacing.estimate(synthetic(
        tmp_path, time_line="**Time:** 40 min teaching + 10 min exercises"))
    assert t.verdict == "TOO SHORT" and "TOO SHORT" in t.problems()[0]


def test_exercise_minutes_must_match_the_time_line(tmp_path):
    t = pacing.estimate(synthetic(tmp_path, minutes=(15, 10), words=20,
                                  time_line="**Time:** 10 min teaching + 10 min exercises"))
    assert t.exercise_verdict == "TOO LONG"
    assert any("exercises add up to 25 min" in p for p in t.problems())


def test_an_exercise_without_minutes_fails(tmp_path):
    path = synthetic(tmp_path)
    nb = nbformat.read(str(path), 4)
    for cell in nb.cells:
        cell.metadata.get("exercise", {}).pop("minutes", None)
    nbformat.write(nb, str(path))
    t = pacing.estimate(path)
    assert t.core.missing_minutes == ("42-task-a", "42-task-b")
    assert any('without "minutes"' in p and "42-task-a" in p for p in t.problems())


def with_keras(tmp_path, at_end=True, words=150):
    """The synthetic lesson with an '## In Keras' section (words of prose, 12 code lines,
    30 s run) in its Going further part (or in its core)."""
    path = synthetic(tmp_path, further_words=300)
    nb = nbformat.read(str(path), 4)
    code = new_code_cell("k = 1\n" * 12)
    code.metadata["run_seconds"] = 30.0
    keras = [new_markdown_cell("## In Keras\n\n" + " ".join(["word"] * (words - 2))), code]
    key_points = len(nb.cells) - 1
    where = key_points if at_end else 3
    nb.cells[where:where] = keras
    nbformat.write(nb, str(path))
    return path


def test_an_in_keras_section_is_estimated_on_its_own_and_counted_as_optional(tmp_path):
    plain = pacing.estimate(synthetic(tmp_path, further_words=300))
    t = pacing.estimate(with_keras(tmp_path))
    assert plain.keras is None
    # 150 words / 120 = 1.25 min, 12 lines x 15 s = 3 min, 30 s = 0.5 min
    assert t.keras.words == 150 and t.keras.code_lines == 12 and t.keras.minutes == 4.75
    assert t.core == plain.core                                   # the core is unchanged
    assert t.optional.minutes == pytest.approx(plain.optional.minutes + 4.75)
    report, ok = pacing.minutes_report([with_keras(tmp_path)])
    assert ok and "keras" in report.splitlines()[0] and "  4.8  OK" in report


def test_an_in_keras_section_in_the_core_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'## In Keras' must appear once, inside the"):
        pacing.estimate(with_keras(tmp_path, at_end=False))


def test_a_core_over_45_minutes_fails_even_when_stated(tmp_path):
    # 4,800 words / 120 = 40 min + 7.5 + 1 + 10: 58.5 min, stated 55: within 25 %, too long
    t = pacing.estimate(synthetic(tmp_path, words=4800,
                                  time_line="**Time:** 45 min teaching + 10 min exercises"))
    assert t.verdict == "OK"
    (problem,) = t.problems()
    assert "at most 45 min" in problem and "split the lesson" in problem


def test_an_exercise_must_allow_the_typing_of_its_solution(tmp_path):
    # a 16-line solution needs at least 8 min at 30 s a line; it states 5
    path = synthetic(tmp_path)
    nb = nbformat.read(str(path), 4)
    cell = next(c for c in nb.cells if "exercise" in c.metadata)
    cell.source = "# Task: set y.\n" + "\n".join(f"y{i} = {i}" for i in range(16))
    nbformat.write(nb, str(path))
    t = pacing.estimate(path)
    assert t.core.typed_lines == 17
    assert t.problems() == ["42_synthetic: exercise 42-task-a states 5 min, but typing its "
                            "solution takes at least 8.0 min (30 s a line)"]


def test_lines_a_skeleton_stub_already_holds_are_not_typed():
    solution = "import torch\nmodel = make()\nmodel = DDP(model)\n\nfor x in data:\n    step(x)\n"
    stub = "import torch\nmodel = make()\n# wrap the model in DDP\nfor x in data:\n    step(x)\n"
    assert pacing.count_typed_lines(solution, stub) == 1
    assert pacing.count_typed_lines(solution, "pass") == 5
