"""The solutions -> lessons generator (helpers.authoring.build) on small notebooks made here."""

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from helpers.authoring import build
from helpers.authoring.build import BuildError, exercises_in, lesson_from_solution


def solution_cell(ex_id="01-demo", stub="answer = None  # your code here",
                  source="# Task: set answer to 42.\n# Hint: it is a number.\nanswer = 42"):
    cell = new_code_cell(source)
    cell.metadata["tags"] = ["solution"]
    cell.metadata["exercise"] = {"id": ex_id, "stub": stub}
    return cell


def make_nb(tmp_path, name="01_demo.ipynb", cells=None):
    cells = cells if cells is not None else [
        new_markdown_cell("# Demo"),
        new_code_cell("x = 1", outputs=[], execution_count=1),
        new_markdown_cell("### Challenge: the answer"),
        solution_cell(),
        new_code_cell('helpers.check("01-demo", lambda: None)'),
        new_code_cell("y = 2"),
    ]
    nb = new_notebook(cells=cells)
    path = tmp_path / name
    nbformat.write(nb, str(path))
    return path


def test_solution_cell_becomes_task_plus_stub(tmp_path):
    path = make_nb(tmp_path)
    lesson = lesson_from_solution(path)
    stub = lesson.cells[3]
    assert stub.source == (
        "# Task: set answer to 42.\n# Hint: it is a number.\nanswer = None  # your code here"
    )
    assert stub.metadata["tags"] == ["exercise"]
    assert stub.metadata["exercise"] == {"id": "01-demo"}
    assert "42" not in stub.source.split("\n")[-1]
    # everything else is copied unchanged, outputs cleared; the check cell gets a header
    original = nbformat.read(str(path), 4).cells
    for i in (0, 1, 2, 5):
        assert lesson.cells[i].source == original[i].source
    assert lesson.cells[4].source == "# Check: the answer\n" + original[4].source
    assert lesson.cells[1].execution_count is None


def test_exercise_fields(tmp_path):
    (ex,) = exercises_in(make_nb(tmp_path))
    assert ex.id == "01-demo" and ex.solution == "answer = 42" and ex.cell_index == 3
    assert ex.task.startswith("# Task")


@pytest.mark.parametrize(
    "cell, message",
    [
        (solution_cell(ex_id="02-demo"), "must look like '01-some-name'"),
        (solution_cell(ex_id="01_demo"), "must look like"),
        (solution_cell(stub=""), "empty stub"),
        (solution_cell(stub="answer = ("), "not valid Python"),
        (solution_cell(source="answer = 42"), "task as # comments"),
    ],
)
def test_broken_conventions_are_explained(tmp_path, cell, message):
    path = make_nb(tmp_path, cells=[cell, new_code_cell('check("01-demo", f)')])
    with pytest.raises(BuildError, match=message):
        exercises_in(path)


def test_missing_metadata_and_check_cell(tmp_path):
    bare = new_code_cell("# task\nanswer = 1")
    bare.metadata["tags"] = ["solution"]
    with pytest.raises(BuildError, match="needs metadata"):
        exercises_in(make_nb(tmp_path, cells=[bare]))
    with pytest.raises(BuildError, match="next code cell must be the check cell"):
        exercises_in(make_nb(tmp_path, cells=[solution_cell(), new_code_cell("print(1)")]))


def test_duplicate_ids_across_notebooks(tmp_path):
    make_nb(tmp_path, "01_a.ipynb")
    make_nb(tmp_path, "01_b.ipynb")
    with pytest.raises(BuildError, match="used twice"):
        build.all_exercises(tmp_path)


def test_build_and_check_round_trip(tmp_path, monkeypatch):
    sol, les = tmp_path / "solutions", tmp_path / "lessons"
    sol.mkdir()
    make_nb(sol)
    monkeypatch.setattr(build, "SOLUTIONS", sol)
    monkeypatch.setattr(build, "LESSONS", les)
    assert build.build_lessons(check=True) == ["01_demo.ipynb"]
    build.build_lessons()
    assert build.build_lessons(check=True) == []
    # a hand edit of the lesson is detected
    nb = nbformat.read(str(les / "01_demo.ipynb"), 4)
    nb.cells[1].source = "x = 2"
    nbformat.write(nb, str(les / "01_demo.ipynb"))
    assert build.build_lessons(check=True) == ["01_demo.ipynb"]
    # a lesson without a solution is stale too
    build.build_lessons()
    nbformat.write(new_notebook(), str(les / "99_orphan.ipynb"))
    assert build.build_lessons(check=True) == ["99_orphan.ipynb"]


def test_rebuild_keeps_outputs_of_unchanged_cells(tmp_path, monkeypatch):
    sol, les = tmp_path / "solutions", tmp_path / "lessons"
    sol.mkdir()
    path = make_nb(sol)
    monkeypatch.setattr(build, "SOLUTIONS", sol)
    monkeypatch.setattr(build, "LESSONS", les)
    build.build_lessons()
    nb = nbformat.read(str(les / path.name), 4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="kept\n")]
    nb.cells[1].execution_count = 1
    nbformat.write(nb, str(les / path.name))
    src = nbformat.read(str(path), 4)
    src.cells[5].source = "y = 3"
    nbformat.write(src, str(path))
    build.build_lessons()
    again = nbformat.read(str(les / path.name), 4)
    assert again.cells[1].outputs[0]["text"] == "kept\n"
    assert again.cells[5].source == "y = 3"


def test_cli_reports_errors_without_traceback(tmp_path, monkeypatch, capsys):
    sol = tmp_path / "solutions"
    sol.mkdir()
    make_nb(sol, cells=[solution_cell(stub=""), new_code_cell('check("01-demo", f)')])
    monkeypatch.setattr(build, "SOLUTIONS", sol)
    monkeypatch.setattr(build, "LESSONS", tmp_path / "lessons")
    assert build.main(["lessons", "--check"]) == 2
    assert "empty stub" in capsys.readouterr().err


# ---------------------------------------------------------------- issue 17: minutes, run time


def test_exercise_minutes_are_read_and_kept_in_the_lesson(tmp_path):
    cell = solution_cell()
    cell.metadata["exercise"]["minutes"] = 7
    path = make_nb(tmp_path, cells=[new_markdown_cell("### Challenge: the answer"), cell,
                                    new_code_cell('helpers.check("01-demo", lambda: None)')])
    (ex,) = exercises_in(path)
    assert ex.minutes == 7 and ex.check_index == 2
    assert lesson_from_solution(path).cells[1].metadata["exercise"] == {
        "id": "01-demo", "minutes": 7}
    (ex,) = exercises_in(make_nb(tmp_path, name="01_b.ipynb"))
    assert ex.minutes is None  # not stated yet: tests/test_lesson_time.py reports it


def test_exercises_cli_lists_minutes(tmp_path, monkeypatch, capsys):
    sol = tmp_path / "solutions"
    sol.mkdir()
    cell = solution_cell()
    cell.metadata["exercise"]["minutes"] = 4
    make_nb(sol, cells=[cell, new_code_cell('check("01-demo", f)')])
    monkeypatch.setattr(build, "SOLUTIONS", sol)
    assert build.main(["exercises"]) == 0
    assert capsys.readouterr().out.split() == ["01-demo", "4", "min", "01_demo.ipynb"]


def test_clean_metadata_turns_timings_into_run_seconds():
    nb = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell("y = 2"),
                             new_markdown_cell("text"), new_code_cell("")])
    nb.metadata["widgets"] = {"state": {}}
    nb.cells[0].metadata["execution"] = {
        "iopub.execute_input": "2026-12-03T17:00:00.100000Z",
        "iopub.status.busy": "2026-12-03T17:00:00.050000Z",
        "iopub.status.idle": "2026-12-03T17:00:02.360000Z",
        "shell.execute_reply": "2026-12-03T17:00:02.350000Z"}
    nb.cells[1].metadata["execution"] = {  # only the shell pair: used as the fallback
        "iopub.execute_input": "2026-12-03T17:00:03.000000Z",
        "shell.execute_reply": "2026-12-03T17:00:03.040000Z"}
    nb.cells[3].metadata["run_seconds"] = 9.9  # not run this time: the old figure goes
    build.clean_metadata(nb)
    assert nb.cells[0].metadata == {"run_seconds": 2.3}
    assert nb.cells[1].metadata == {"run_seconds": 0.0}
    assert nb.cells[2].metadata == {} and nb.cells[3].metadata == {}
    assert "widgets" not in nb.metadata
    assert build.run_seconds({"iopub.status.busy": "garbage"}) is None


def test_execute_records_run_seconds(tmp_path):
    """A real kernel, as `make outputs` runs it: nbclient's timings become run_seconds."""
    path = make_nb(tmp_path, cells=[new_code_cell("import time\ntime.sleep(0.4)\nprint('ok')"),
                                    new_markdown_cell("done")])
    build.execute(path, timeout=120)
    cell = nbformat.read(str(path), 4).cells[0]
    assert set(cell.metadata) == {"run_seconds"}
    assert 0.4 <= cell.metadata["run_seconds"] < 30
    assert cell.outputs[0]["text"] == "ok\n"


# ---------------------------------------------------------------- issue 17: learner copies

LOCKED = {"deletable": False, "editable": False}


def learner_nb(tmp_path):
    predict = new_code_cell("print(2 ** 10)", execution_count=3, outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="1024\n")])
    predict.metadata["tags"] = ["predict"]
    return make_nb(tmp_path, cells=[
        new_markdown_cell("# Demo\n## Setup"),
        new_code_cell("import helpers\nhelpers.setup(seed=0)"),
        new_markdown_cell("What does the next cell print? Predict it, then run it."),
        predict,
        new_markdown_cell("### Challenge: the answer\nSet `answer`."),
        solution_cell(),
        new_code_cell('def test():\n    assert answer == 42\nhelpers.check("01-demo", test)'),
        new_code_cell("y = 2"),
    ])


def test_learner_copy_locks_setup_and_check_cells(tmp_path):
    path = learner_nb(tmp_path)
    lesson = lesson_from_solution(path)
    assert {k: lesson.cells[1].metadata.get(k) for k in LOCKED} == LOCKED  # Setup
    check = lesson.cells[6]
    assert {k: check.metadata.get(k) for k in LOCKED} == LOCKED
    assert check.metadata["jupyter"] == {"source_hidden": True}
    assert check.source.splitlines()[0] == "# Check: the answer"
    assert check.source.split("\n", 1)[1] == nbformat.read(str(path), 4).cells[6].source
    for i in (0, 2, 3, 5, 7):  # nothing else is locked or hidden
        assert not {"deletable", "editable", "jupyter"} & set(lesson.cells[i].metadata), i
    assert build.setup_cell_index(lesson.cells) == 1


def test_check_header_without_a_challenge_heading_names_the_exercise(tmp_path):
    lesson = lesson_from_solution(make_nb(tmp_path, cells=[
        solution_cell(), new_code_cell('check("01-demo", f)')]))
    assert lesson.cells[1].source.splitlines()[0] == "# Check: exercise 01-demo"
    assert build.challenge_title(lesson.cells, 0) is None


def test_predict_cells_show_no_result_in_the_learner_copy(tmp_path):
    path = learner_nb(tmp_path)
    lesson = lesson_from_solution(path)
    cell = lesson.cells[3]
    assert cell.outputs == [] and cell.execution_count is None
    assert cell.metadata["tags"] == ["predict", "nbval-ignore-output"]
    solution = nbformat.read(str(path), 4).cells[3]  # the solutions copy keeps comparing
    assert solution.outputs and solution.metadata["tags"] == ["predict"]
    # after `make outputs` ran the lesson, its result is cleared again
    cell.outputs = solution.outputs
    cell.execution_count = 4
    build.learner_finish(lesson)
    assert cell.outputs == [] and cell.execution_count is None


def test_rebuild_keeps_check_outputs_but_not_predictions(tmp_path, monkeypatch):
    sol, les = tmp_path / "solutions", tmp_path / "lessons"
    sol.mkdir()
    les.mkdir()
    path = learner_nb(sol)
    monkeypatch.setattr(build, "SOLUTIONS", sol)
    monkeypatch.setattr(build, "LESSONS", les)
    # a lesson built before issue 17: plain copies with outputs, no header, no locks
    old = nbformat.read(str(path), 4)
    old.cells[5] = lesson_from_solution(path).cells[5]
    shown = nbformat.v4.new_output("stream", name="stdout", text="not solved yet\n")
    old.cells[6].outputs, old.cells[6].execution_count = [shown], 7
    old.cells[6].metadata["run_seconds"] = 0.4
    nbformat.write(old, str(les / path.name))
    assert build.build_lessons(check=True) == [path.name]
    build.build_lessons()
    new = nbformat.read(str(les / path.name), 4)
    assert new.cells[6].outputs[0]["text"] == "not solved yet\n"
    assert new.cells[6].execution_count == 7 and new.cells[6].metadata["run_seconds"] == 0.4
    assert new.cells[6].source.startswith("# Check: the answer\n")
    assert new.cells[3].outputs == []  # the prediction's stored result is not carried over
    assert build.build_lessons(check=True) == []


def test_select_takes_a_lesson_number_exactly_and_other_names_as_parts(tmp_path):
    """`make outputs NB=05` re-records lesson 05, not also its Keras companion 05b."""
    for stem in ("05_batch_size", "05b_keras_batch_size", "08_oom_challenge",
                 "08b_keras_oom_challenge", "42"):
        (tmp_path / f"{stem}.ipynb").write_text("{}")
    names = lambda chosen: [p.stem for p in chosen]  # noqa: E731
    assert names(build.select(["05"], tmp_path)) == ["05_batch_size"]
    assert names(build.select(["05b"], tmp_path)) == ["05b_keras_batch_size"]
    assert names(build.select(["keras"], tmp_path)) == ["05b_keras_batch_size",
                                                        "08b_keras_oom_challenge"]
    assert names(build.select(None, tmp_path)) == ["05_batch_size", "05b_keras_batch_size",
                                                   "08_oom_challenge", "08b_keras_oom_challenge"]
    with pytest.raises(SystemExit, match="known: 05_batch_size"):
        build.select(["07"], tmp_path)
