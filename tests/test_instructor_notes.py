"""docs/instructor-notes.md agrees with the lessons, the README table and the Makefile.

The notes' format, which these tests parse:

- a timing table with rows `| NN_name | teaching | exercises | total | path |`, the path
  `core`, `optional` or `Keras track` (companions `NNb_keras_...`, taught after lesson NN to
  groups that train with Keras), a `**Total:** N min ...: T min teaching + E min exercises.`
  line, and `**Core path:**`, `**Optional:**` and `**Keras track:**` lines naming lessons,
  each ending in `(N min).`;
- schedules under `### Half day: HH:MM–HH:MM (N min)` (the core path), `### Full day: ...`
  (every lesson but the Keras track) and `### Keras day: ...` (the core path with the Keras
  track), as tables of `| HH:MM–HH:MM | item | minutes |` where a lesson's item is its stem;
- one `### NN_name` section per lesson with the notebook's own `**Time:** ...` line, its
  exercise ids in backticks, and a `**Common errors**` list whose items each hold the error
  (a code span) and a `**Fix:**`;
- for a lesson with an `## In Keras` section (the Keras track), `*In Keras* (optional, about
  N min` in its notes section and in its README row, N as `make minutes` estimates it.
"""

import re
from pathlib import Path

import pytest
from test_lessons_meta import SOLUTIONS, TIME_LINE, lesson_minutes, readme_rows

from helpers.authoring import build, pacing

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "docs" / "instructor-notes.md"
HALF_DAY_MAX = 4 * 60  # minutes: a half day is at most four hours
DAY_MAX = 8 * 60 + 30  # a day of teaching, breaks and lunch included, is at most 8.5 hours

LESSON_HEADING = re.compile(r"^### (\d\d[a-z]?_\w+)[ \t]*$", re.M)
NEXT_HEADING = re.compile(r"^#{2,3} ", re.M)
TIMING_ROW = re.compile(
    r"^\| (\d\d[a-z]?_\w+) \| (\d+) \| (\d+) \| (\d+) \| (core|optional|Keras track) \|$", re.M)
TOTAL = re.compile(r"^\*\*Total:\*\* (\d+) min .*: (\d+) min teaching \+ (\d+) min exercises\.$",
                   re.M)
PATH_LINE = r"^\*\*{}:\*\* (.+?) \((\d+) min\)\.$"
SCHEDULE = re.compile(
    r"^### (Half|Full|Second|Keras) day: (\d\d:\d\d)[–-](\d\d:\d\d) \((\d+) min\)$", re.M)
SLOT = re.compile(r"^\| (\d\d:\d\d)[–-](\d\d:\d\d) \| (.+?) \| (\d+) \|$")
STEM = re.compile(build.LESSON_STEM)


@pytest.fixture(scope="module")
def notes():
    assert NOTES.is_file(), "docs/instructor-notes.md is missing"
    return NOTES.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def sections(notes):
    """Each lesson's section, from its `### NN_name` heading to the next heading."""
    found = {}
    for match in LESSON_HEADING.finditer(notes):
        nxt = NEXT_HEADING.search(notes, match.end())
        assert match.group(1) not in found, f"two sections for {match.group(1)}"
        found[match.group(1)] = notes[match.end(): nxt.start() if nxt else len(notes)]
    return found


@pytest.fixture(scope="module")
def readme():
    rows = readme_rows()
    assert rows, "no lesson rows found in the README table"
    return rows


def minutes(hhmm):
    hours, mins = hhmm.split(":")
    return 60 * int(hours) + int(mins)


def stated_minutes(section):
    match = TIME_LINE.search(section)
    assert match, "no '**Time:** N min teaching + M min exercises' line"
    return int(match.group(1)), int(match.group(2))


def test_every_readme_lesson_has_a_section_with_the_readme_minutes(sections, readme):
    assert list(sections) == sorted(readme), "one section per README lesson, in order"
    for stem, expected in readme.items():
        assert stated_minutes(sections[stem]) == expected, f"{stem}: minutes differ from README"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_section_minutes_match_the_lesson_notebook(path, sections):
    assert path.stem in sections, f"no '### {path.stem}' section in the notes"
    assert stated_minutes(sections[path.stem]) == lesson_minutes(path), \
        f"{path.stem}: the notes' Time line differs from the notebook's"


def test_timing_table_totals_and_paths_add_up(notes, readme):
    rows = {m.group(1): m.groups()[1:] for m in TIMING_ROW.finditer(notes)}
    assert list(rows) == sorted(readme), "the timing table lists every README lesson, in order"
    for stem, (teaching, exercises, total, _) in rows.items():
        assert (int(teaching), int(exercises)) == readme[stem], f"{stem}: table minutes"
        assert int(total) == int(teaching) + int(exercises), f"{stem}: total"

    total = TOTAL.search(notes)
    assert total, "no '**Total:** N min ...: T min teaching + E min exercises.' line"
    assert int(total.group(1)) == sum(t + e for t, e in readme.values())
    assert int(total.group(2)) == sum(t for t, _ in readme.values())
    assert int(total.group(3)) == sum(e for _, e in readme.values())

    paths = {}
    for label in ("Core path", "Optional", "Keras track"):
        match = re.search(PATH_LINE.format(label), notes, re.M | re.S)
        assert match, f"no '**{label}:** ... (N min).' line"
        stems = STEM.findall(match.group(1))
        assert int(match.group(2)) == sum(sum(readme[s]) for s in stems), f"{label} minutes"
        paths[label] = stems
    assert sorted(paths["Core path"] + paths["Optional"] + paths["Keras track"]) == sorted(readme)
    assert len(set(paths["Core path"] + paths["Optional"] + paths["Keras track"])) == len(readme)
    for label, path in (("core", "Core path"), ("optional", "Optional"),
                        ("Keras track", "Keras track")):
        marked = {stem for stem, row in rows.items() if row[3] == label}
        assert marked == set(paths[path]), f"the table's {label} lessons differ from its line"
    for stem in paths["Keras track"]:
        number, _, name = stem.partition("_")
        assert len(number) == 3 and name.startswith("keras_"), \
            f"{stem}: a Keras-track companion is named NNb_keras_..., after its lesson NN"


def schedules(notes):
    """{'Half' or 'Full': (start, end, stated minutes, [(start, end, item, minutes), ...])}."""
    found = {}
    for match in SCHEDULE.finditer(notes):
        slots = []
        for line in notes[match.end():].lstrip("\n").splitlines():
            if not line.startswith("|"):
                break
            slot = SLOT.match(line)
            if slot:
                start, end, item, mins = slot.groups()
                slots.append((minutes(start), minutes(end), item.strip(), int(mins)))
        found[match.group(1)] = (minutes(match.group(2)), minutes(match.group(3)),
                                 int(match.group(4)), slots)
    return found


def test_schedules_add_up(notes, readme):
    found = schedules(notes)
    assert set(found) == {"Half", "Full", "Second", "Keras"}, \
        "a half-day, a full-day (the core path), a second-day and a Keras-day schedule"
    core, optional, keras, half = (
        STEM.findall(re.search(PATH_LINE.format(label), notes, re.M | re.S).group(1))
        for label in ("Core path", "Optional", "Keras track", "Half-day path"))
    taught = {}
    for kind, (start, end, stated, slots) in found.items():
        assert slots, f"{kind} day: no time slots"
        assert end - start == stated, f"{kind} day: heading minutes"
        assert stated <= (HALF_DAY_MAX if kind == "Half" else DAY_MAX), f"{kind} day: too long"
        assert slots[0][0] == start and slots[-1][1] == end, f"{kind} day: first/last slot"
        for (s0, e0, item, mins), (s1, *_) in zip(slots, slots[1:] + [(end,)], strict=True):
            assert e0 - s0 == mins, f"{kind} day, {item}: the slot is not {mins} min"
            assert e0 == s1, f"{kind} day: a gap or overlap after {item}"
        lessons = [(item, mins) for _, _, item, mins in slots if STEM.fullmatch(item)]
        for item, mins in lessons:
            assert item in readme, f"{kind} day: {item} is not a lesson"
            assert mins == sum(readme[item]), f"{kind} day: {item} needs {sum(readme[item])} min"
        taught[kind] = [item for item, _ in lessons]
    assert taught["Full"] == core, "the full day teaches the core path, in order"
    assert taught["Second"] == optional, "the second day teaches the optional lessons, in order"
    assert taught["Half"] == half, "the half day teaches the half-day path, in order"
    assert half == [s for s in core if s in half], "the half-day path is part of the core path"
    # the Keras day: the half-day path, lesson 02 and the Keras track, each Keras-track lesson
    # right after its lesson
    assert taught["Keras"] == sorted(taught["Keras"]), "the Keras day's lessons in order"
    assert set(half) | set(keras) <= set(taught["Keras"]), \
        "the Keras day teaches the half-day path and the Keras track"
    for stem in keras:
        i = taught["Keras"].index(stem)
        assert i > 0 and taught["Keras"][i - 1].startswith(stem[:2] + "_"), \
            f"Keras day: {stem} comes right after lesson {stem[:2]}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_exercise_id_is_listed_under_its_lesson(path, sections):
    ids = [ex.id for ex in build.exercises_in(path)]
    missing = [i for i in ids if f"`{i}`" not in sections.get(path.stem, "")]
    assert not missing, f"{path.stem}: exercise ids missing from its section: {missing}"


def test_each_lesson_has_three_common_errors_with_fixes(sections):
    for stem, text in sections.items():
        head, marker, rest = text.partition("\n**Common errors**\n")
        assert marker, f"{stem}: no '**Common errors**' list"
        items = re.findall(r"^- (.+?)(?=^- |\Z)", rest, re.M | re.S)
        assert len(items) >= 3, f"{stem}: {len(items)} common errors, at least 3 expected"
        for item in items:
            error, fix, _ = item.partition("**Fix:**")
            assert fix, f"{stem}: no '**Fix:**' in {item[:60]!r}"
            assert re.search(r"`[^`]+`", error), f"{stem}: no error text in {item[:60]!r}"


def test_make_targets_named_in_the_notes_exist(notes):
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*)\s*:(?!=)", makefile, re.M))
    fenced = re.findall(r"^```[a-z]*\n(.*?)^```", notes, re.M | re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", notes, flags=re.M | re.S))
    named = set(re.findall(r"(?<![\w.-])make[ \t]+([a-z][\w-]*)", "\n".join(fenced + inline)))
    assert {"lab", "setup", "kernel", "wheelhouse", "release", "release-solutions",
            "refresh"} <= named, "the notes must explain these targets"
    assert named <= targets, f"not Makefile targets: {sorted(named - targets)}"


def test_readme_links_the_notes_before_the_authors_section():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    instructors, authors = text.find("\n## For instructors\n"), text.find("\n## For authors\n")
    assert 0 <= instructors < authors, "'## For instructors' goes just before '## For authors'"
    assert "](docs/instructor-notes.md)" in text[instructors:authors]


# a measured figure the notes quote: "~0.88x", "~28.9 µs", "~1,701 samples/s", "~93%"
FIGURE = re.compile(r"~\d[\d,]*(?:\.\d+)?(?: ?(?:x|%|ms|µs|s|MiB|GiB|samples/s)\b|%)?")


def stored_output_text(path):
    """Every text and HTML output stored in a notebook, whitespace runs collapsed."""
    parts = []
    for cell in build.read(path).cells:
        for out in cell.get("outputs", []):
            for value in (out.get("text"), out.get("data", {}).get("text/plain"),
                          out.get("data", {}).get("text/html")):
                if value:
                    parts.append(value if isinstance(value, str) else "".join(value))
    return re.sub(r"\s+", " ", "\n".join(parts))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_measured_figure_the_notes_quote_is_in_the_stored_outputs(path, sections):
    """The notes quote measured figures ("bf16 ~1.95x on the stored CPU"); each must be what
    the lesson's stored outputs print, so regenerating outputs (`make outputs`) without
    updating the notes fails here, naming the figure."""
    section = sections.get(path.stem, "")
    text = stored_output_text(path)
    missing = [m.group(0) for m in FIGURE.finditer(section)
               if re.sub(r"\s+", " ", m.group(0)) not in text]
    assert not missing, f"{path.stem}: the notes quote {missing}, which its stored outputs " \
                        f"do not print: update docs/instructor-notes.md"


IN_KERAS = re.compile(r"\*In Keras\* \(optional, about (\d+) min")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_keras_sections_state_their_estimated_minutes(path, sections):
    """The Keras track is optional: its minutes are not in the core's, so the notes and the
    README say them, as `make minutes` estimates them (re-recorded outputs change them)."""
    keras = pacing.estimate(path).keras
    row = next(line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
               if line.startswith(f"| [{path.stem}]"))
    for where, text in (("the notes", sections.get(path.stem, "")), ("the README row", row)):
        stated = [int(m) for m in IN_KERAS.findall(text)]
        if keras is None:
            assert not stated, f"{path.stem}: {where} name an In Keras section it does not have"
        else:
            assert stated == [round(keras.minutes)], (
                f"{path.stem}: {where} must say '*In Keras* (optional, about "
                f"{round(keras.minutes)} min' (make minutes), not {stated}")
