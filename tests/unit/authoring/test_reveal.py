"""reveal(): every exercise of every lesson can be revealed, and inserted in JupyterLab."""

import pytest

from helpers.authoring import build
from helpers.authoring import instructor as reveal_module
from helpers.authoring.instructor import NOT_RELEASED, Revealed, reveal

EXERCISES = build.all_exercises()


def test_the_kit_has_exercises():
    assert len(EXERCISES) >= 2


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_every_exercise_reveals_its_solution(ex):
    shown = reveal(ex.id)
    assert isinstance(shown, Revealed)
    assert shown.code.strip() and shown.code.endswith(ex.solution)
    assert shown.notebook == ex.notebook
    assert not shown.inserted  # not in a live front end here
    if ex.magic:  # a %%writefile exercise: the magic on top, then the file's text
        assert shown.code == f"{ex.magic}\n{ex.solution}"
    else:
        assert shown.code == ex.solution
        compile(shown.code, ex.id, "exec")
    assert shown.code in repr(shown)
    html = shown._repr_html_()
    assert ex.id in html and "highlight" in html  # pygments markup


class FakeShell:
    def __init__(self):
        self.calls = []

    def set_next_input(self, text, replace=False):
        self.calls.append((text, replace))


def test_in_jupyter_the_solution_is_inserted_as_a_new_cell(monkeypatch):
    import IPython

    shell = FakeShell()
    monkeypatch.setattr(reveal_module, "MODE", "jupyter")
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    ex = EXERCISES[0]
    shown = reveal(ex.id)
    assert shown.inserted
    assert shell.calls == [(f"# Solution of {ex.id}\n{ex.solution}", False)]
    reveal(ex.id, insert=False)
    assert len(shell.calls) == 1
    script = next(e for e in EXERCISES if e.magic)  # its magic stays the first line
    reveal(script.id)
    assert shell.calls[-1] == (f"{script.magic}\n# Solution of {script.id}\n{script.solution}",
                               False)


def test_without_solutions_it_says_they_are_not_released(monkeypatch, tmp_path):
    monkeypatch.setenv("GPU_LESSONS_SOLUTIONS", str(tmp_path))
    assert repr(reveal(EXERCISES[0].id)) == NOT_RELEASED


def test_unknown_and_malformed_ids(monkeypatch):
    near = EXERCISES[0].id[:-1]
    with pytest.raises(ValueError, match="Did you mean"):
        reveal(near if near[-1] != "-" else near + "x")
    with pytest.raises(ValueError, match="must look like"):
        reveal("device agnostic")
    with pytest.raises(TypeError, match="insert"):
        reveal(EXERCISES[0].id, insert="yes")


@pytest.mark.parametrize("bad, error", [(None, TypeError), (1, TypeError), (b"01-x", TypeError),
                                        ("", ValueError), ("01-x" * 100, ValueError)])
def test_exercise_id_errors_follow_the_checks_rule(bad, error):
    """A non-string id is a TypeError, a string that is no id a ValueError (core/checks.py)."""
    with pytest.raises(error, match="exercise_id"):
        reveal(bad)


def test_html_without_ipython_is_plain_code(monkeypatch):
    """Fuzz R2 'no front end at all: IPython missing': _repr_html_ raised ModuleNotFoundError."""
    import sys

    monkeypatch.setitem(sys.modules, "IPython", None)
    monkeypatch.setitem(sys.modules, "IPython.display", None)
    shown = Revealed("01-demo", "01_demo.ipynb", "x = 1 < 2", inserted=False)
    html = shown._repr_html_()
    assert html.endswith("<pre>x = 1 &lt; 2</pre>") and "Solution of 01-demo" in html
