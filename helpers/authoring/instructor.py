"""``reveal("01-device-agnostic")``: show an exercise's solution in class, and insert it.

The instructor (or a stuck learner, when the instructor says so) runs ``helpers.reveal(id)``
in a lesson. It finds the exercise by id in ``solutions/`` — the same ids and ``solution``
tags ``make lessons`` uses — shows the solution code syntax-highlighted and, in JupyterLab or
Notebook 7, inserts it as a new cell below, ready to run.  Where a front end cannot insert
cells (VS Code, headless runs) the highlighted code is still shown.

Learner bundles (``make release``) ship without ``solutions/``; there ``reveal`` says the
solutions have not been released yet.  Instructors hand out ``make release-solutions`` later,
or point ``GPU_LESSONS_SOLUTIONS`` at a folder holding the solution notebooks.
"""

from __future__ import annotations

import difflib
import html
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.checks import flag, text
from ..core.runtime import MODE

__all__ = ["reveal", "Revealed", "solutions_dir"]

NOT_RELEASED = (
    "The solutions have not been released yet: this copy of the kit has no solutions/ folder. "
    "Your instructor will share them (or set GPU_LESSONS_SOLUTIONS to their folder)."
)


def solutions_dir() -> Path | None:
    """Where the solution notebooks are: $GPU_LESSONS_SOLUTIONS, else the kit's solutions/."""
    from .build import LESSON_GLOB, SOLUTIONS

    configured = os.environ.get("GPU_LESSONS_SOLUTIONS")
    folder = Path(configured).expanduser() if configured else SOLUTIONS
    if folder.is_dir() and any(folder.glob(LESSON_GLOB)):
        return folder
    return None


@dataclass(frozen=True)
class Revealed:
    """The revealed solution of one exercise; displays as highlighted code."""

    exercise_id: str
    notebook: str
    code: str
    inserted: bool

    def _repr_html_(self) -> str:
        where = "inserted as a new cell below" if self.inserted else "copy it into a cell"
        header = (f"<p><b>Solution of {self.exercise_id}</b> (from {self.notebook}; "
                  f"{where}):</p>")
        try:  # highlighted as JupyterLab highlights code; plain without IPython/pygments
            from IPython.display import Code

            return header + Code(self.code, language="python")._repr_html_()
        except ImportError:
            return header + f"<pre>{html.escape(self.code)}</pre>"

    def __repr__(self) -> str:
        return f"# Solution of {self.exercise_id} (from {self.notebook})\n{self.code}"


def reveal(exercise_id: str, *, insert: bool = True):
    """Show the solution of ``exercise_id`` and insert it as a new cell where possible.

    Args:
        exercise_id: the id from the challenge, e.g. ``"01-device-agnostic"``.
        insert: also insert the code as a new cell below (JupyterLab / Notebook 7 only).

    Returns:
        A :class:`Revealed` (highlighted code in notebooks), or a plain sentence when the
        solutions are not available in this copy of the kit.
    """
    from ..core.exercises import EXERCISE_ID
    from .build import all_exercises

    if not EXERCISE_ID.match(text(exercise_id, "exercise_id", longest=200)):
        raise ValueError(
            f"exercise_id must look like '01-device-agnostic', got {exercise_id!r}; "
            "the id is printed by each challenge's check cell"
        )
    flag(insert, "insert")
    folder = solutions_dir()
    if folder is None:
        return _Message(NOT_RELEASED)
    exercises = {ex.id: ex for ex in all_exercises(folder)}
    if exercise_id not in exercises:
        close = difflib.get_close_matches(exercise_id, exercises, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"no exercise {exercise_id!r} in the solutions.{hint} Known ids: "
            f"{', '.join(sorted(exercises))}"
        )
    ex = exercises[exercise_id]
    inserted = False
    if insert and MODE == "jupyter":
        # only from an executed cell: from a widget callback the request would be delivered
        # with the *next* cell the user runs (JupyterLab 4.6; under nbclient it is ignored)
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            # a cell magic (%%writefile script.sh) must stay the cell's first line
            head = f"{ex.magic}\n" if ex.magic else ""
            shell.set_next_input(f"{head}# Solution of {ex.id}\n{ex.solution}", replace=False)
            inserted = True
    code = f"{ex.magic}\n{ex.solution}" if ex.magic else ex.solution
    return Revealed(ex.id, ex.notebook, code, inserted)


@dataclass(frozen=True)
class _Message:
    text: str

    def __repr__(self) -> str:
        return self.text
