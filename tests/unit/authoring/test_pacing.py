"""The lesson-time estimator (helpers.authoring.pacing), part by part, on notebooks made here."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from helpers.authoring import build, pacing
from helpers.authoring.build import BuildError

TIME = "**Time:** 10 min teaching + 5 min exercises"


def exercise(ex_id="01-demo", minutes=5, task="# Task: set y.", stub="y = None"):
    cell = new_code_cell(f"{task}\ny = 42\nprint(y)")
    cell.metadata["tags"] = ["solution"]
    cell.metadata["exercise"] = {"id": ex_id, "stub": stub}
    if minutes is not None:
        cell.metadata["exercise"]["minutes"] = minutes
    return cell


def check(ex_id="01-demo"):
    return new_code_cell(f'helpers.check("{ex_id}", f)\n' + "assert y == 42\n" * 12)


def lesson(tmp_path, cells, name="01_demo.ipynb"):
    path = tmp_path / name
    nbformat.write(new_notebook(cells=cells), str(path))
    return path


def test_count_words_reads_like_a_learner():
    assert pacing.count_words("Measure the **step** time, twice.") == 5
    # headings' # marks, bullets and link targets are not words; link text is
    assert pacing.count_words("## Key points\n- see [the docs](https://x.org/a/b/c)") == 5
    assert pacing.count_words("a <!-- an author's note --> b") == 2
    assert pacing.count_words("`x.to(device)` ~3.1 ms") == 3
    with pytest.raises(TypeError, match="markdown must be a str"):
        pacing.count_words(["a list"])


def test_count_code_lines_skips_blank_lines_only():
    assert pacing.count_code_lines("import torch\n\n# a comment\n   \nx = 1\n") == 3
    assert pacing.count_code_lines("") == 0
    with pytest.raises(TypeError, match="source must be a str"):
        pacing.count_code_lines(None)


def test_stated_minutes():
    nb = new_notebook(cells=[new_markdown_cell(f"# T\n{TIME}")])
    assert pacing.stated_minutes(nb) == (10, 5)
    with pytest.raises(ValueError, match=r"lesson X: no '\*\*Time:\*\* X min teaching"):
        pacing.stated_minutes(new_notebook(cells=[new_markdown_cell("# T")]), "lesson X")


def test_core_counts_words_code_run_seconds_and_exercises(tmp_path):
    code = new_code_cell("a = 1\n\nb = 2\n# read me\n")
    code.metadata["run_seconds"] = 12.5
    ex = exercise()
    ex.metadata["run_seconds"] = 1.5
    path = lesson(tmp_path, [
        new_markdown_cell(f"# Demo\n{TIME}"),  # 8 words
        code,                                   # 3 lines, 12.5 s
        new_markdown_cell("### Challenge: the answer"),  # 3 words
        ex,                                     # task 1 + stub 1 lines, 1.5 s, 5 min
        check(),                                # 1 line (collapsed in the learner copy)
        new_markdown_cell("## Key points\n- one"),  # 3 words
    ])
    t = pacing.estimate(path)
    core = t.core
    assert (core.words, core.code_lines, core.run_seconds) == (14, 6, 14.0)
    assert core.exercises == ("01-demo",) and core.exercise_minutes == 5
    assert core.code_cells == 3 and core.unmeasured_cells == 1
    assert core.minutes == pytest.approx(14 / 120 + 6 * 15 / 60 + 14 / 60 + 5)
    assert t.optional.empty and t.optional.minutes == 0
    assert t.notes == ("run time of 1 of 3 code cells not recorded (counted 0 s): "
                       "run make outputs",)
    assert t.name == "01_demo" and t.stated == 15


def test_run_time_never_recorded_is_reported(tmp_path):
    path = lesson(tmp_path, [new_markdown_cell(f"# D\n{TIME}"), new_code_cell("x = 1"),
                             new_markdown_cell("## Key points")])
    assert pacing.estimate(path).notes == ("run time not recorded: run make outputs",)


def test_going_further_ends_before_key_points(tmp_path):
    late = exercise("01-late", minutes=7)
    path = lesson(tmp_path, [
        new_markdown_cell(f"# Demo\n{TIME}"),
        new_code_cell("x = 1"),
        new_markdown_cell("## Going further\nmore words here"),  # optional: 5 words
        new_code_cell("y = 2\nz = 3"),
        new_markdown_cell("### Challenge: late"),
        late,
        check("01-late"),
        new_markdown_cell("## Key points\n- one\n\n## Further reading\n- two"),  # core again
    ])
    core, optional = pacing.sections(build.read(path))
    assert core == [0, 1, 7] and optional == [2, 3, 4, 5, 6]
    t = pacing.estimate(path)
    assert t.optional.exercises == ("01-late",) and t.optional.exercise_minutes == 7
    assert t.core.exercises == () and t.core.exercise_minutes == 0
    assert t.optional.words == 5 + 2 and t.optional.code_lines == 2 + 2 + 1
    assert t.core.words == 8 + 6


@pytest.mark.parametrize("cells, message", [
    ([new_markdown_cell("# T"), new_code_cell("x = 1")], "no '## Key points' heading"),
    ([new_markdown_cell("intro\n## Going further"), new_markdown_cell("## Key points")],
     "must be the first line of its own"),
    ([new_markdown_cell("## Going further"), new_markdown_cell("## Going further"),
      new_markdown_cell("## Key points")], "once per lesson"),
    ([new_markdown_cell("## Key points"), new_markdown_cell("## Going further")],
     "comes after '## Key points'"),
    ([new_markdown_cell("## Going further\n\n## Key points")], "in its own cell"),
])
def test_broken_structure_is_a_clear_error(cells, message):
    with pytest.raises(ValueError, match=message):
        pacing.sections(new_notebook(cells=cells), "01_demo")


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="nb must be a notebook"):
        pacing.sections({"no": "cells"})
    with pytest.raises(ValueError, match="nb must be a notebook"):
        pacing.estimate(tmp_path / "01_x.ipynb", nb=[1, 2])
    with pytest.raises(ValueError, match="01_missing.ipynb: cannot read the notebook"):
        pacing.estimate(tmp_path / "01_missing.ipynb")
    (tmp_path / "01_junk.ipynb").write_text("{not json")
    with pytest.raises(ValueError, match="01_junk.ipynb: cannot read"):
        pacing.estimate(tmp_path / "01_junk.ipynb")
    bad = new_code_cell("x = 1")
    bad.metadata["run_seconds"] = "slow"
    path = lesson(tmp_path, [new_markdown_cell(TIME), bad, new_markdown_cell("## Key points")])
    with pytest.raises(ValueError, match=r"01_demo cell 1: run_seconds must be a number >= 0"):
        pacing.estimate(path)


def test_a_dict_notebook_with_list_sources_works(tmp_path):
    path = lesson(tmp_path, [new_markdown_cell(f"# D\n{TIME}"), exercise(), check(),
                             new_markdown_cell("## Key points")])
    raw = json.loads(path.read_text())
    assert isinstance(raw["cells"][1]["source"], list)  # as stored on disk
    assert pacing.estimate(path, nb=raw).core.exercises == ("01-demo",)


@pytest.mark.parametrize("minutes", [0, -3, 2.5, "5", True, 500])
def test_exercise_minutes_must_be_whole_minutes(tmp_path, minutes):
    path = lesson(tmp_path, [exercise(minutes=minutes), check()])
    with pytest.raises(BuildError, match="give a whole number of minutes"):
        build.exercises_in(path)


def test_verdicts():
    assert pacing.verdict(12.5, 10) == "OK" and pacing.verdict(7.5, 10) == "OK"
    assert pacing.verdict(12.6, 10) == "TOO LONG" and pacing.verdict(7.4, 10) == "TOO SHORT"


def test_minutes_report_and_cli(tmp_path, monkeypatch, capsys):
    sol = tmp_path / "solutions"
    sol.mkdir()
    ok = new_code_cell("x = 1\n" * 34)  # 8.5 min of code, + 1 min run time
    ok.metadata["run_seconds"] = 60.0
    lesson(sol, [new_markdown_cell(f"# D\n{TIME}"), ok, new_markdown_cell("### Challenge: x"),
                 exercise(), check(), new_markdown_cell("## Key points")])
    lesson(sol, [new_markdown_cell(f"# D\n{TIME}"), new_markdown_cell("## Key points")],
           name="02_short.ipynb")
    text, fits = pacing.minutes_report(sorted(sol.glob("*.ipynb")))
    assert not fits
    rows = text.splitlines()
    assert rows[2].startswith("01_demo") and rows[2].endswith("OK")
    assert "10+5=15" in rows[2] and "02_short" in rows[3] and "TOO SHORT" in rows[3]
    assert any(r.startswith("total") for r in rows)
    monkeypatch.setattr(build, "SOLUTIONS", sol)
    assert build.main(["minutes", "01"]) == 0
    assert "01_demo" in capsys.readouterr().out
    assert build.main(["minutes", "--strict"]) == 1
    assert build.main(["minutes", "--strict", "01"]) == 0
