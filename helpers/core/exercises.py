"""Exercise checks: the cell after every challenge tells the learner where they stand.

A challenge in ``solutions/NN_topic.ipynb`` is a code cell tagged ``solution`` whose metadata
holds ``{"exercise": {"id": "NN-some-name", "stub": "<code learners start from>"}}``; the cell
right after it calls :func:`check` with the same id.  ``make lessons`` turns the solution
cell into the stub (see :mod:`helpers.authoring.build`), so in lessons/ the check says
"not solved yet: ..." until the learner's code works, and the notebook still runs top to
bottom.
"""

from __future__ import annotations

import html
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from .checks import text
from .fmt import ShownAsTable

__all__ = ["CheckResult", "NotSolved", "check", "EXERCISE_ID"]

EXERCISE_ID = re.compile(r"^(\d\d)-[a-z0-9]+(?:-[a-z0-9]+)*$")


class NotSolved(AssertionError):
    """Raise inside a check function to say what is still missing (no traceback shown)."""


@dataclass(frozen=True, repr=False)
class CheckResult(ShownAsTable):
    exercise_id: str
    passed: bool
    message: str

    def text(self) -> str:
        verdict = "solved" if self.passed else "not solved yet"
        return f"Challenge {self.exercise_id}: {verdict}: {self.message}"

    def __bool__(self) -> bool:
        return self.passed

    def _html(self) -> str:
        kind = "success" if self.passed else "warning"
        mark = "&#10004;" if self.passed else "&#9998;"
        return (
            f'<div class="alert alert-{kind}" style="padding:0.4em 0.8em">{mark} '
            f"<b>Challenge {html.escape(self.exercise_id)}</b>: "
            f"{'solved' if self.passed else 'not solved yet'}: "
            f"{html.escape(self.message)}</div>"
        )


def check(
    exercise_id: str, test: Callable[[], object], success: str = "well done."
) -> CheckResult:
    """Run ``test()`` and report whether the learner's answer to ``exercise_id`` works.

    Args:
        exercise_id: the challenge's id, e.g. ``"01-device-agnostic"``.
        test: a function without arguments that raises ``NotSolved``/``AssertionError``
            (with a helpful message) while the answer is missing or wrong. If it returns a
            string, that string is the success message.
        success: message shown when ``test`` passes and returns nothing.

    Returns:
        A :class:`CheckResult`; it displays as one line (text) or a coloured box (HTML).
        Errors raised by the learner's code are reported, never re-raised, so the rest of
        the notebook keeps running.
    """
    if not EXERCISE_ID.fullmatch(text(exercise_id, "exercise_id", longest=200)):
        raise ValueError(
            f"exercise_id must look like '01-device-agnostic' (two digits, a dash, lowercase "
            f"words joined by dashes), got {exercise_id!r}"
        )
    if not callable(test):
        raise TypeError(f"test must be a function without arguments, got {type(test).__name__}")
    success = text(success, "success", empty=True)
    try:
        outcome = test()
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the learner's code may raise anything
        return CheckResult(exercise_id, False, _explain(exc))
    if isinstance(outcome, str) and outcome:
        return CheckResult(exercise_id, True, outcome)
    return CheckResult(exercise_id, True, success)


def _explain(exc: BaseException) -> str:
    """What a failed check says about the exception the learner's code raised."""
    try:
        said = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
        said = f"<a {type(exc).__name__} whose message cannot be shown>"
    if isinstance(exc, AssertionError):  # includes NotSolved
        return said or "a check in this cell failed (no message)."
    where = traceback.extract_tb(exc.__traceback__)[-1]
    if isinstance(exc, NotImplementedError):
        return f"`{where.name}` is not written yet (it still raises NotImplementedError)."
    return f"your code raised {type(exc).__name__}: {said} (in {where.name}, line {where.lineno})"
