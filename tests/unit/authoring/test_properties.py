"""Property tests for the public entry points of helpers.authoring (hypothesis, 'ci' profile).

reveal(exercise_id, insert=...) gets any value: it returns a Revealed (or the not-released
message) or raises only a ValueError/TypeError that names the argument.
"""

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers.authoring import build  # noqa: E402
from helpers.authoring.instructor import Revealed, reveal  # noqa: E402

IDS = [ex.id for ex in build.all_exercises()]
anything = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(),
                     st.text(), st.lists(st.integers(), max_size=3))


@given(exercise_id=st.one_of(anything, st.sampled_from(IDS),
                             st.from_regex(r"\A\d\d-[a-z0-9]{1,8}\Z")))
def test_reveal_any_id(exercise_id):
    try:
        shown = reveal(exercise_id, insert=False)
    except (ValueError, TypeError) as exc:
        assert "exercise_id" in str(exc) or "no exercise" in str(exc)
        return
    assert isinstance(shown, Revealed) and shown.exercise_id == exercise_id
    assert exercise_id in IDS


@given(insert=anything)
def test_reveal_any_insert(insert):
    try:
        shown = reveal(IDS[0], insert=insert)
    except TypeError as exc:
        assert "insert" in str(exc)
        return
    assert isinstance(insert, bool) and isinstance(shown, Revealed)


@given(source=st.text(max_size=200))
def test_split_task_keeps_every_line(source):
    """The task is the leading comment lines; the code is every line after them."""
    task, code = build.split_task(source)
    lines, n = source.splitlines(), len(task.splitlines())
    assert all(line.lstrip().startswith("#") for line in task.splitlines())
    assert task.splitlines() == lines[:n]
    assert n == len(lines) or not lines[n].lstrip().startswith("#")
    assert code == "\n".join(lines[n:]).strip("\n")
