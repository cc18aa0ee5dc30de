"""How long a lesson takes: the estimate behind ``make minutes`` and tests/test_lesson_time.py.

A lesson's **core** is every cell except its optional part, which starts at a markdown cell
whose first line is exactly ``## Going further`` and ends before the cell holding
``## Key points`` (Key points and Further reading stay core, at the end). The stated
``**Time:** X min teaching + Y min exercises`` line is the core time. A lesson's Keras track
(``## In Keras``, the first line of its cell, up to the next ``## `` heading) lies inside the
optional part and is also estimated on its own (``make minutes``' *keras* column, the README
and the instructor notes). The estimate of a part:

    minutes = words of its markdown / 120
            + code lines a learner reads x 15 s / 60
            + sum of its cells' run_seconds / 60     (recorded by ``make outputs``)
            + minutes of its exercises                (solution-cell metadata)

The rates are a class's, not a reader's: calibrated against an HPC instructor's realistic
minutes for lessons 00-05b (turn3-teaching-a-review: 20-25, 50-60, 40-50, 60-70, 35-40,
55-65, 35-45), which a reading model of 150 words/min + 10 s a line put 30-50 % too low. A
class reads, discusses, runs each cell and looks at its output. The hands-on cores add
typing: each exercise must state at least ``SECONDS_PER_TYPED_LINE`` for every line of its
solution a learner types (``%%writefile`` scripts and terminal commands included; lines its
stub already holds are not typed), and a
core may take at most ``MAX_CORE_MINUTES`` (split a lesson that needs more).

Code lines are the non-blank lines of the code cells as the learner copy shows them: an
exercise counts its task and stub (not the solution), a check cell one line (its
``# Check: ...`` header; the body is collapsed). Link targets and HTML comments in markdown
are not words a learner reads. Cells without ``run_seconds`` count 0 s.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .build import exercises_in

WORDS_PER_MINUTE = 120
SECONDS_PER_CODE_LINE = 15
SECONDS_PER_TYPED_LINE = 30  # the least an exercise takes per line of its solution
MAX_CORE_MINUTES = 45  # by the estimate and by the Time line
TOLERANCE = 0.25  # |estimate - stated| may be at most this share of the stated minutes
GOING_FURTHER = "## Going further"
IN_KERAS = "## In Keras"
KEY_POINTS = re.compile(r"^## Key points\s*$", re.M)
TIME_LINE = re.compile(r"\*\*Time:\*\* (\d+) min teaching \+ (\d+) min exercises")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_WORD = re.compile(r"[^\W_]", re.U)  # a token with at least one letter or digit


def count_words(markdown: str) -> int:
    """Words a learner reads in markdown: tokens with a letter or digit, link targets and
    HTML comments left out."""
    if not isinstance(markdown, str):
        raise TypeError(f"markdown must be a str, got {type(markdown).__name__}")
    text = _LINK_TARGET.sub("]", _HTML_COMMENT.sub(" ", markdown))
    return sum(1 for token in text.split() if _WORD.search(token))


def count_code_lines(source: str) -> int:
    """Non-blank lines of code (comments included: a learner reads them)."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    return sum(1 for line in source.splitlines() if line.strip())


def count_typed_lines(solution: str, stub: str) -> int:
    """Lines of a solution a learner types: its non-blank lines that the stub does not already
    hold (a skeleton stub with the data, the model and the loop leaves the new parts)."""
    given = {line.strip() for line in stub.splitlines() if line.strip()}
    return sum(1 for line in solution.splitlines() if line.strip() and line.strip() not in given)


@dataclass(frozen=True)
class Part:
    """What one part of a lesson (core or optional) holds, and its estimated minutes."""

    words: int = 0
    code_lines: int = 0
    run_seconds: float = 0.0
    exercise_minutes: int = 0
    exercises: tuple[str, ...] = ()
    missing_minutes: tuple[str, ...] = ()  # exercise ids without "minutes" (counted 0)
    code_cells: int = 0
    unmeasured_cells: int = 0  # code cells without run_seconds (counted 0 s)
    typed_lines: int = 0  # lines of the exercises' solutions a learner types
    rushed: tuple[tuple[str, int, float], ...] = ()  # (id, stated, least minutes) below typing

    @property
    def reading_minutes(self) -> float:
        return self.words / WORDS_PER_MINUTE

    @property
    def code_minutes(self) -> float:
        return self.code_lines * SECONDS_PER_CODE_LINE / 60

    @property
    def run_minutes(self) -> float:
        return self.run_seconds / 60

    @property
    def teaching_minutes(self) -> float:
        return self.reading_minutes + self.code_minutes + self.run_minutes

    @property
    def minutes(self) -> float:
        return self.teaching_minutes + self.exercise_minutes

    @property
    def empty(self) -> bool:
        return not (self.words or self.code_cells)

    def breakdown(self) -> str:
        return (f"{self.minutes:.1f} min = {self.words} words / {WORDS_PER_MINUTE} "
                f"({self.reading_minutes:.1f}) + {self.code_lines} code lines x "
                f"{SECONDS_PER_CODE_LINE} s ({self.code_minutes:.1f}) + run "
                f"{self.run_seconds:.1f} s ({self.run_minutes:.1f}) + exercises "
                f"{self.exercise_minutes} ({len(self.exercises)}, {self.typed_lines} lines "
                "to type)")


@dataclass(frozen=True)
class LessonTime:
    """A lesson's stated core minutes against the estimate of its core and optional parts."""

    name: str
    stated_teaching: int
    stated_exercises: int
    core: Part
    optional: Part
    notes: tuple[str, ...] = field(default=())
    keras: Part | None = None  # the "## In Keras" section (inside the optional part)

    @property
    def stated(self) -> int:
        return self.stated_teaching + self.stated_exercises

    @property
    def verdict(self) -> str:
        """OK, TOO LONG or TOO SHORT: the core estimate against the stated minutes."""
        return verdict(self.core.minutes, self.stated)

    @property
    def exercise_verdict(self) -> str:
        """The core's exercise minutes against the stated exercise minutes."""
        return verdict(self.core.exercise_minutes, self.stated_exercises)

    @property
    def over_cap(self) -> bool:
        """The core takes more than MAX_CORE_MINUTES (by the estimate or the Time line)."""
        return max(self.core.minutes, self.stated) > MAX_CORE_MINUTES

    def problems(self) -> list[str]:
        """What the lesson-time test fails on, one sentence each (empty: it fits)."""
        found = []
        if self.verdict != "OK":
            found.append(
                f"{self.name}: core estimate {self.core.minutes:.1f} min is {self.verdict} for "
                f"the stated {self.stated} min (allowed {TOLERANCE:.0%}: "
                f"{self.stated * (1 - TOLERANCE):.1f}-{self.stated * (1 + TOLERANCE):.1f}); "
                f"core {self.core.breakdown()}")
        if self.exercise_verdict != "OK":
            found.append(
                f"{self.name}: the core's exercises add up to {self.core.exercise_minutes} min "
                f"({', '.join(self.core.exercises) or 'none'}), the Time line states "
                f"{self.stated_exercises} min exercises ({self.exercise_verdict})")
        if self.over_cap:
            longest = max(self.core.minutes, self.stated)
            found.append(
                f"{self.name}: the core takes {longest:.0f} min (estimate "
                f"{self.core.minutes:.1f}, stated {self.stated}); at most {MAX_CORE_MINUTES} "
                "min: move material to Going further or split the lesson")
        for ex_id, stated, least in self.core.rushed + self.optional.rushed:
            found.append(
                f"{self.name}: exercise {ex_id} states {stated} min, but typing its solution "
                f"takes at least {least:.1f} min ({SECONDS_PER_TYPED_LINE} s a line)")
        missing = self.core.missing_minutes + self.optional.missing_minutes
        if missing:
            found.append(f"{self.name}: exercises without \"minutes\" in their metadata: "
                         f"{', '.join(missing)}")
        return found


def verdict(estimate: float, stated: float) -> str:
    if abs(estimate - stated) <= TOLERANCE * stated:
        return "OK"
    return "TOO LONG" if estimate > stated else "TOO SHORT"


def _cells(nb):
    cells = nb.get("cells") if isinstance(nb, dict) else getattr(nb, "cells", None)
    if not isinstance(cells, list):
        raise ValueError("nb must be a notebook: a dict or nbformat node with a 'cells' list, "
                         f"got {type(nb).__name__}")
    return cells


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def sections(nb, name: str = "notebook") -> tuple[list[int], list[int]]:
    """The indices of the core cells and of the optional (Going further) cells.

    Raises ValueError when the lesson has no ``## Key points`` cell, when ``## Going
    further`` is not the first line of its cell, appears twice, or comes after Key points.
    """
    cells = _cells(nb)
    key_points = going_further = None
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "markdown":
            continue
        text = _source(cell)
        lines = text.splitlines()
        further = [n for n, line in enumerate(lines) if line.strip() == GOING_FURTHER]
        if further:
            if further != [0] or going_further is not None:
                raise ValueError(
                    f"{name} cell {i}: '{GOING_FURTHER}' must be the first line of its own "
                    "markdown cell, once per lesson")
            if key_points is not None:
                raise ValueError(f"{name} cell {i}: '{GOING_FURTHER}' comes after "
                                 "'## Key points'; it must end before Key points")
            going_further = i
        if key_points is None and KEY_POINTS.search(text):
            if going_further == i:
                raise ValueError(f"{name} cell {i}: '## Key points' must be in its own cell "
                                 f"after the '{GOING_FURTHER}' part")
            key_points = i
    if key_points is None:
        raise ValueError(f"{name}: no '## Key points' heading; the estimate needs the end of "
                         "the lesson (and of its Going further part)")
    optional = list(range(going_further, key_points)) if going_further is not None else []
    core = [i for i in range(len(cells)) if i not in set(optional)]
    return core, optional


def keras_section(nb, name: str = "notebook") -> list[int]:
    """The indices of the ``## In Keras`` section's cells (empty without one): from its
    heading cell to the next ``## `` heading. ValueError unless it lies inside the optional
    part (the Keras track is an alternative, so it must not count in the core minutes)."""
    cells = _cells(nb)
    _, optional = sections(nb, name)
    starts = [i for i, c in enumerate(cells) if c.get("cell_type") == "markdown"
              and _source(c).splitlines()[:1] == [IN_KERAS]]
    if not starts:
        return []
    if len(starts) > 1 or starts[0] not in optional:
        raise ValueError(f"{name} cell {starts[0]}: '{IN_KERAS}' must appear once, inside the "
                         f"'{GOING_FURTHER}' part (before '## Key points')")
    end = next((i for i in range(starts[0] + 1, len(cells))
                if cells[i].get("cell_type") == "markdown"
                and _source(cells[i]).startswith("## ")), len(cells))
    return [i for i in range(starts[0], end) if i in optional]


def stated_minutes(nb, name: str = "notebook") -> tuple[int, int]:
    """(teaching, exercises) from the ``**Time:** X min teaching + Y min exercises`` line."""
    text = "\n".join(_source(c) for c in _cells(nb) if c.get("cell_type") == "markdown")
    match = TIME_LINE.search(text)
    if not match:
        raise ValueError(f"{name}: no '**Time:** X min teaching + Y min exercises' line")
    return int(match.group(1)), int(match.group(2))


def _run_seconds(cell, where: str) -> float | None:
    value = cell.get("metadata", {}).get("run_seconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where}: run_seconds must be a number >= 0, got {value!r}")
    return float(value)


def _part(cells, indices, exercises, name: str) -> Part:
    by_solution = {ex.cell_index: ex for ex in exercises}
    checks = {ex.check_index for ex in exercises}
    words = lines = code_cells = unmeasured = exercise_minutes = typed = 0
    seconds = 0.0
    ids, missing, rushed = [], [], []
    for i in indices:
        cell = cells[i]
        kind = cell.get("cell_type")
        if kind == "markdown":
            words += count_words(_source(cell))
            continue
        if kind != "code":
            continue
        code_cells += 1
        ran = _run_seconds(cell, f"{name} cell {i}")
        if ran is None:
            unmeasured += 1
        else:
            seconds += ran
        if i in by_solution:
            ex = by_solution[i]
            lines += count_code_lines(ex.task) + count_code_lines(ex.stub)
            ids.append(ex.id)
            to_type = count_typed_lines(ex.solution, ex.stub)
            typed += to_type
            least = to_type * SECONDS_PER_TYPED_LINE / 60
            if ex.minutes is None:
                missing.append(ex.id)
            else:
                exercise_minutes += ex.minutes
                if ex.minutes < least:
                    rushed.append((ex.id, ex.minutes, least))
        elif i in checks:
            lines += 1  # the "# Check: ..." line; the body is collapsed in the learner copy
        else:
            lines += count_code_lines(_source(cell))
    return Part(words, lines, round(seconds, 1), exercise_minutes, tuple(ids), tuple(missing),
                code_cells, unmeasured, typed, tuple(rushed))


def estimate(path: Path, nb=None) -> LessonTime:
    """The estimate for one solutions notebook (``nb``: already read, else read from path).

    Raises ValueError (BuildError for broken exercise conventions) with the lesson's name."""
    path = Path(path)
    if nb is None:
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path.name}: cannot read the notebook: {exc}") from exc
    name = path.stem
    _cells(nb)  # a clear error for what is not a notebook
    nb = _as_node(nb)
    cells = nb.cells
    core, optional = sections(nb, name)
    teaching, exercises_stated = stated_minutes(nb, name)
    exercises = exercises_in(path, nb)
    notes = []
    core_part = _part(cells, core, exercises, name)
    optional_part = _part(cells, optional, exercises, name)
    in_keras = keras_section(nb, name)
    keras_part = _part(cells, in_keras, exercises, name) if in_keras else None
    unmeasured = core_part.unmeasured_cells + optional_part.unmeasured_cells
    total = core_part.code_cells + optional_part.code_cells
    if unmeasured == total and total:
        notes.append("run time not recorded: run make outputs")
    elif unmeasured:
        notes.append(f"run time of {unmeasured} of {total} code cells not recorded "
                     "(counted 0 s): run make outputs")
    return LessonTime(name, teaching, exercises_stated, core_part, optional_part, tuple(notes),
                      keras_part)


def _as_node(nb):
    import nbformat

    if isinstance(nb, nbformat.NotebookNode) and all(
            isinstance(c.get("source", ""), str) for c in nb.cells):
        return nb
    return nbformat.reads(json.dumps(nb), as_version=4)  # joins list sources into str


def minutes_report(paths) -> tuple[str, bool]:
    """The ``make minutes`` table for these solutions notebooks, and whether all fit."""
    header = (f"{'lesson':28s} {'stated':>12s} {'core':>6s} {'read':>5s} {'code':>5s} "
              f"{'run':>5s} {'exer':>5s} {'optional':>8s} {'keras':>5s}  verdict")
    rows, ok = [header, "-" * len(header)], True
    totals = [0, 0.0, 0.0, 0.0]
    notes = []
    for path in paths:
        try:
            t = estimate(path)
        except ValueError as exc:
            rows.append(f"{Path(path).stem:28s} error: {exc}")
            ok = False
            continue
        c = t.core
        problems = t.problems()
        ok = ok and not problems
        status = t.verdict
        if t.exercise_verdict != "OK":
            status += f"; exercises {c.exercise_minutes} vs {t.stated_exercises} stated"
        missing = c.missing_minutes + t.optional.missing_minutes
        if missing:
            status += f"; {len(missing)} exercise(s) without minutes"
        if t.over_cap:
            status += f"; over {MAX_CORE_MINUTES} min"
        if c.rushed or t.optional.rushed:
            status += f"; {len(c.rushed) + len(t.optional.rushed)} exercise(s) below typing time"
        optional = f"{t.optional.minutes:.1f}" if not t.optional.empty else "-"
        keras = f"{t.keras.minutes:.1f}" if t.keras is not None else "-"
        stated = f"{t.stated_teaching}+{t.stated_exercises}={t.stated}"
        rows.append(f"{t.name:28s} {stated:>12s} {c.minutes:6.1f} {c.reading_minutes:5.1f} "
                    f"{c.code_minutes:5.1f} {c.run_minutes:5.1f} {c.exercise_minutes:5d} "
                    f"{optional:>8s} {keras:>5s}  {status}")
        totals[0] += t.stated
        totals[1] += c.minutes
        totals[2] += t.optional.minutes
        totals[3] += t.keras.minutes if t.keras is not None else 0.0
        notes += [f"{t.name}: {note}" for note in t.notes]
        notes += [f"{t.name}: missing minutes: {', '.join(missing)}"] if missing else []
    rows.append("-" * len(header))
    rows.append(f"{'total':28s} {totals[0]:12d} {totals[1]:6.1f} {'':5s} {'':5s} {'':5s} "
                f"{'':5s} {totals[2]:8.1f} {totals[3]:5.1f}")
    rows.append(f"minutes = words/{WORDS_PER_MINUTE} + code lines x {SECONDS_PER_CODE_LINE} s "
                f"+ recorded run time + exercise minutes; OK within {TOLERANCE:.0%} of stated, "
                f"a core at most {MAX_CORE_MINUTES} min, an exercise at least "
                f"{SECONDS_PER_TYPED_LINE} s a line of its solution")
    return "\n".join(rows + notes), ok


__all__ = ["Part", "LessonTime", "count_words", "count_code_lines", "count_typed_lines",
           "sections", "keras_section", "stated_minutes", "estimate", "minutes_report", "verdict"]
