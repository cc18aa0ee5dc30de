"""Build lessons/ from solutions/ and store notebook outputs (``make lessons``, ``make outputs``).

solutions/NN_topic.ipynb is the single source.  Each exercise is a code cell tagged
``solution`` with metadata ``{"exercise": {"id": ..., "stub": ..., "minutes": ...}}``; in
lessons/ it becomes the task (the solution cell's leading comment lines) followed by the stub,
tagged ``exercise``.  The learner copy also locks the Setup cell and the check cells
(``deletable``/``editable`` false), collapses each check cell under a first line
``# Check: <challenge title>`` and clears the outputs of cells tagged ``predict`` (nbval
ignores them there).  Every other cell is copied unchanged.

``outputs`` stores each code cell's run time as metadata ``run_seconds`` (one decimal);
``minutes`` estimates each lesson's core and optional minutes from the words, code lines,
run times and exercise minutes (helpers.authoring.pacing) and compares them with the
lesson's ``**Time:**`` line.

Usage::

    python -m helpers.authoring.build lessons [--check] [NAME ...] # write (or verify) lessons/
    python -m helpers.authoring.build outputs [NAME ...]           # re-execute and store outputs
    python -m helpers.authoring.build exercises                    # list every exercise id
    python -m helpers.authoring.build minutes [--strict] [NAME ...]  # estimated vs stated minutes
    python -m helpers.authoring.build personal [--refresh NAME ...] # learners' copy in my-lessons/
                                              [--folder DIR]     # ... or in DIR
    python -m helpers.authoring.build release [--solutions]        # zip bundles in dist/

NAME selects notebooks by substring (``01`` or ``pytorch_gpu``); default: all.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..core.exercises import EXERCISE_ID

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
LESSONS = ROOT / "lessons"
PERSONAL = ROOT / "my-lessons"
DIST = ROOT / "dist"

# What a learner bundle holds (top-level paths, tracked files only) and what the solutions
# bundle, handed out after the workshop, adds. Neither holds the instructor notes (docs/).
LEARNER_BUNDLE = ["README.md", "LICENSE", "CONTRIBUTING.md", "Makefile", "pyproject.toml",
                  "requirements.txt", "requirements-gpu.txt", "requirements-gpu-tf.txt",
                  "environment.yml", "binder",
                  "helpers", "lessons", "reference", "scripts", "benchmarks",
                  "tests/gpu/results"]  # recorded GPU results lessons 05-09 show, once there
SOLUTIONS_EXTRA = ["solutions"]

# lesson notebooks: "05_batch_size.ipynb", and a companion such as the Keras track's
# "05b_keras_batch_size.ipynb" (taught after lesson 05, with exercise ids "05-...")
LESSON_GLOB = "[0-9][0-9]*_*.ipynb"
LESSON_NUMBER = r"\d\d[a-z]?"  # "05", or "05b" for a companion
LESSON_STEM = LESSON_NUMBER + r"_\w+"
SOLUTION_TAG = "solution"
EXERCISE_TAG = "exercise"
# a cell whose result learners predict first: outputs cleared in lessons/, and nbval ignores
# its output there (solutions/ keeps comparing it)
PREDICT_TAG = "predict"
IGNORE_OUTPUT_TAG = "nbval-ignore-output"
# the first line of a check cell in lessons/ (the rest of the cell is collapsed)
CHECK_HEADER = "# Check: "
CHALLENGE_HEADING = re.compile(r"^###\s+Challenge:\s*(.+?)\s*$", re.M)
SETUP_HEADING = re.compile(r"^##\s+Setup\s*$", re.M)

# The kernel settings shared with the notebook tests (conftest.py): headless widgets, one
# compute thread per kernel (the tests run two kernels side by side; two threads per kernel
# on two busy cores made steps up to 40x slower), and no capture of C-level / child-process
# output, exactly as under nbval (`os.system('echo ...')` and libc `puts` vanish there, `print`
# stays; capture_fd_output=False or PYTEST_CURRENT_TEST in the kernel does the same).
KERNEL_ENV = {"GPU_LESSONS_HEADLESS": "1", "OMP_NUM_THREADS": "1",
              "PYTEST_CURRENT_TEST": "helpers.authoring.build outputs"}
KERNEL_ARGS = ["--IPKernelApp.capture_fd_output=False"]


def kernel_peak_rss_mib(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM) in MiB, or None where /proc cannot tell.

    The notebook tests (conftest.py) and the GPU check (scripts/gpu_check.py) read each
    kernel's peak with it, to hold kernels to their memory budget.
    """
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


class BuildError(ValueError):
    """A solutions notebook breaks the exercise conventions."""


@dataclass(frozen=True)
class Exercise:
    id: str
    notebook: str  # file name, e.g. "01_pytorch_gpu.ipynb"
    cell_index: int
    task: str  # the leading comment block
    solution: str  # the code after the task
    stub: str
    minutes: int | None = None  # what a learner needs for it; None: not stated yet
    check_index: int = -1  # the check cell right after the solution cell
    magic: str = ""  # a leading cell magic (``%%writefile train.py``), also on top of ``task``


def _nbformat():
    import nbformat

    return nbformat


def read(path: Path):
    return _nbformat().read(str(path), as_version=4)


def write(nb, path: Path) -> None:
    text = _nbformat().writes(nb) + "\n"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def split_task(source: str) -> tuple[str, str]:
    """Split a solution cell into its leading comment block (the task) and the code."""
    lines = source.splitlines()
    n = 0
    while n < len(lines) and lines[n].lstrip().startswith("#"):
        n += 1
    return "\n".join(lines[:n]), "\n".join(lines[n:]).strip("\n")


def split_cell_magic(source: str) -> tuple[str, str]:
    """A cell's leading ``%%magic ...`` line (``%%writefile train.py``: an exercise whose
    answer is a script) and the rest; ``""`` and the source without one."""
    first, _, rest = source.partition("\n")
    if first.startswith("%%"):
        return first.rstrip(), rest
    return "", source


def exercises_in(path: Path, nb=None) -> list[Exercise]:
    """Every exercise of one solutions notebook, validated.  Raises BuildError."""
    nb = nb if nb is not None else read(path)
    number = path.name[:2]
    found = []
    cells = nb.cells
    for i, cell in enumerate(cells):
        if SOLUTION_TAG not in tags(cell):
            continue
        where = f"{path.name} cell {i}"
        if cell.cell_type != "code":
            raise BuildError(f"{where}: only code cells can be tagged 'solution'")
        meta = cell.metadata.get("exercise")
        if not isinstance(meta, dict) or "id" not in meta or "stub" not in meta:
            raise BuildError(
                f"{where}: a 'solution' cell needs metadata "
                '{"exercise": {"id": "NN-name", "stub": "code learners start from"}}'
            )
        ex_id, stub = meta["id"], meta["stub"]
        match = EXERCISE_ID.match(ex_id) if isinstance(ex_id, str) else None
        if not match or match.group(1) != number:
            raise BuildError(
                f"{where}: exercise id {ex_id!r} must look like '{number}-some-name' "
                f"(the notebook's number, then lowercase words joined by dashes)"
            )
        if not isinstance(stub, str) or not stub.strip():
            raise BuildError(f"{where}: exercise {ex_id} has an empty stub")
        try:
            compile(stub, f"<stub {ex_id}>", "exec")
        except SyntaxError as exc:
            raise BuildError(f"{where}: the stub of {ex_id} is not valid Python: {exc}") from exc
        magic, body = split_cell_magic(cell.source)
        task, code = split_task(body)
        if not task:
            raise BuildError(f"{where}: start the solution cell with the task as # comments"
                             " (after its %%cell magic, if it has one)")
        if magic:  # e.g. %%writefile ddp_train.py: the learner's copy keeps it on top
            task = f"{magic}\n{task}"
        minutes = meta.get("minutes")
        if minutes is not None and (
            isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 120
        ):
            raise BuildError(
                f"{where}: exercise {ex_id} has minutes {minutes!r}; give a whole number of "
                f"minutes from 1 to 120, e.g. \"minutes\": 5"
            )
        check_index = next((j for j in range(i + 1, len(cells))
                            if cells[j].cell_type == "code"), -1)
        following = cells[check_index].source if check_index >= 0 else ""
        if ex_id not in following or "check(" not in following:
            raise BuildError(
                f"{where}: the next code cell must be the check cell, calling "
                f"check({ex_id!r}, ...)"
            )
        found.append(Exercise(ex_id, path.name, i, task, code, stub, minutes, check_index,
                              magic))
    return found


def all_exercises(solutions_dir: Path | None = None) -> list[Exercise]:
    """Every exercise in the kit; ids must be unique."""
    result, seen = [], {}
    for path in sorted((solutions_dir or SOLUTIONS).glob(LESSON_GLOB)):
        for ex in exercises_in(path):
            if ex.id in seen:
                raise BuildError(
                    f"exercise id {ex.id} is used twice: {seen[ex.id]} and {path.name}"
                )
            seen[ex.id] = path.name
            result.append(ex)
    return result


def _stub_cell(cell, ex: Exercise):
    new = copy.deepcopy(cell)
    new.source = f"{ex.task}\n{ex.stub.strip(chr(10))}"
    new.metadata["tags"] = [t for t in tags(cell) if t != SOLUTION_TAG] + [EXERCISE_TAG]
    new.metadata["exercise"] = {"id": ex.id}
    if ex.minutes is not None:
        new.metadata["exercise"]["minutes"] = ex.minutes
    new.outputs = []
    new.execution_count = None
    return new


def challenge_title(cells, index: int) -> str | None:
    """The title of the ``### Challenge: ...`` heading nearest above cell ``index``."""
    for cell in reversed(cells[:index]):
        if cell.cell_type == "markdown":
            titles = CHALLENGE_HEADING.findall(cell.source)
            if titles:
                return titles[-1]
    return None


def setup_cell_index(cells) -> int | None:
    """The first code cell after the ``## Setup`` heading, or None."""
    for i, cell in enumerate(cells):
        if cell.cell_type == "markdown" and SETUP_HEADING.search(cell.source):
            return next((j for j in range(i + 1, len(cells))
                         if cells[j].cell_type == "code"), None)
    return None


def _lock(cell) -> None:
    cell.metadata["deletable"] = False
    cell.metadata["editable"] = False


def check_header(title: str | None, ex_id: str) -> str:
    return CHECK_HEADER + (title if title else f"exercise {ex_id}")


def _without_check_header(source: str) -> str:
    if source.startswith(CHECK_HEADER):
        return source.split("\n", 1)[1] if "\n" in source else ""
    return source


def _check_cell(cell, ex: Exercise, title: str | None) -> None:
    header = check_header(title, ex.id)
    cell.source = f"{header}\n{_without_check_header(cell.source)}"
    _lock(cell)
    cell.metadata.setdefault("jupyter", {})["source_hidden"] = True


def _predict_cell(cell) -> None:
    cell.outputs = []
    cell.execution_count = None
    cell_tags = tags(cell)
    if IGNORE_OUTPUT_TAG not in cell_tags:
        cell.metadata["tags"] = cell_tags + [IGNORE_OUTPUT_TAG]


def learner_finish(nb) -> None:
    """Clear the outputs of ``predict`` cells again (``make outputs`` ran the lesson)."""
    for cell in nb.cells:
        if cell.cell_type == "code" and PREDICT_TAG in tags(cell):
            cell.outputs = []
            cell.execution_count = None


def lesson_from_solution(path: Path):
    """The learner notebook generated from one solutions notebook (outputs cleared).

    Exercises become task + stub; the Setup cell and the check cells are locked
    (``deletable``/``editable`` false, which JupyterLab honours); check cells are collapsed
    (``jupyter.source_hidden``) under a first line ``# Check: <challenge title>``; cells
    tagged ``predict`` get the tag ``nbval-ignore-output`` (their outputs stay cleared).
    """
    nb = read(path)
    exercises = exercises_in(path, nb)
    by_index = {ex.cell_index: ex for ex in exercises}
    out = copy.deepcopy(nb)
    for i, cell in enumerate(nb.cells):
        if i in by_index:
            out.cells[i] = _stub_cell(cell, by_index[i])
        elif cell.cell_type == "code":
            out.cells[i].outputs = []
            out.cells[i].execution_count = None
            if PREDICT_TAG in tags(cell):
                _predict_cell(out.cells[i])
    for ex in exercises:
        _check_cell(out.cells[ex.check_index], ex, challenge_title(nb.cells, ex.cell_index))
    setup = setup_cell_index(nb.cells)
    if setup is not None:
        _lock(out.cells[setup])
    return out


# the cell metadata the learner copy sets; a lesson without it is out of date
LEARNER_METADATA = ("deletable", "editable", "jupyter")


def _signature(nb) -> list[tuple]:
    return [
        (c.cell_type, c.source, tuple(tags(c)), repr(c.metadata.get("exercise")),
         repr([c.metadata.get(k) for k in LEARNER_METADATA]))
        for c in nb.cells
    ]


def select(names: list[str] | None, folder: Path | None = None) -> list[Path]:
    folder = folder or SOLUTIONS
    paths = sorted(folder.glob(LESSON_GLOB))
    if not names:
        return paths
    # "05" is lesson 05 only (not its companion 05b), "05b" the companion; other names
    # match any part of a notebook's name ("batch", "keras")
    chosen = [p for p in paths if any(
        p.stem.split("_")[0] == n if re.fullmatch(LESSON_NUMBER, n) else n in p.stem
        for n in names)]
    if not chosen:
        known = ", ".join(p.stem for p in paths) or "none"
        raise SystemExit(f"no notebook in {folder.name}/ matches {names}; known: {known}")
    return chosen


def build_lessons(names=None, check: bool = False) -> list[str]:
    """Write lessons/ from solutions/ (keeping outputs of unchanged cells) or, with
    ``check=True``, return the list of lessons that are out of date."""
    all_exercises()  # validates ids across the whole kit
    stale = []
    for src in select(names):
        target = LESSONS / src.name
        generated = lesson_from_solution(src)
        existing = read(target) if target.exists() else None
        if existing is not None and _signature(existing) == _signature(generated):
            if check:
                continue
            # same sources: keep the stored outputs of the existing lesson
            generated = existing
        else:
            stale.append(target.name)
            if existing is not None and len(existing.cells) == len(generated.cells):
                for new, old in zip(generated.cells, existing.cells, strict=True):
                    if (new.cell_type == "code" and PREDICT_TAG not in tags(new)
                            and _without_check_header(old.get("source", ""))
                            == _without_check_header(new.source)):
                        new.outputs = old.outputs
                        new.execution_count = old.execution_count
                        if "run_seconds" in old.metadata:
                            new.metadata["run_seconds"] = old.metadata["run_seconds"]
        if not check:
            LESSONS.mkdir(exist_ok=True)
            write(generated, target)
    if check:
        # lessons without a solution are stale too
        extra = {p.name for p in LESSONS.glob("*.ipynb")} - {p.name for p in select(None)}
        stale += sorted(extra)
    return stale


def _parse_time(stamp) -> datetime | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None


def run_seconds(timing: dict) -> float | None:
    """A cell's run time from nbclient's timing metadata (``record_timing=True``): from
    "iopub.status.busy" to "iopub.status.idle" (else "iopub.execute_input" to
    "shell.execute_reply"), rounded to 0.1 s; None where the timestamps are missing."""
    for first, last in (("iopub.status.busy", "iopub.status.idle"),
                        ("iopub.execute_input", "shell.execute_reply")):
        start, end = _parse_time(timing.get(first)), _parse_time(timing.get(last))
        if start is not None and end is not None:
            return round(max(0.0, (end - start).total_seconds()), 1)
    return None


def clean_metadata(nb) -> None:
    """Turn nbclient's timings into ``run_seconds`` (one decimal) and drop the rest of the
    run-specific metadata it adds (raw timestamps, widget state)."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        timing = cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        seconds = run_seconds(timing) if isinstance(timing, dict) else None
        if seconds is None:
            cell.metadata.pop("run_seconds", None)  # not run this time: no stale figure
        else:
            cell.metadata["run_seconds"] = seconds


def execute(path: Path, timeout: int = 900, learner: bool = False) -> float:
    """Execute one notebook from a clean kernel, exactly as the tests will, and store it
    with each code cell's ``run_seconds``. ``learner=True`` (a lessons/ copy) clears the
    outputs of ``predict`` cells again afterwards."""
    from nbclient import NotebookClient

    nb = read(path)
    os.environ.update(KERNEL_ENV)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        extra_arguments=KERNEL_ARGS,
        record_timing=True,
        store_widget_state=False,
    )
    start = time.perf_counter()
    client.execute()
    clean_metadata(nb)
    if learner:
        learner_finish(nb)
    write(nb, path)
    return time.perf_counter() - start


def personal_copy(refresh: list[str] | None = None, folder: Path | None = None) -> list[str]:
    """Copy lessons into the learner's own, git-ignored folder (``make lab`` does this).

    Lessons already there are never overwritten, so ``git pull`` cannot conflict with a
    learner's work and updates of the kit never erase it; lessons new to the kit are added.
    ``refresh`` names lessons to replace with a fresh copy: the learner's version is kept in
    ``backup/`` first. Returns what was done, one line each.
    """
    import shutil

    folder = folder or PERSONAL
    folder.mkdir(exist_ok=True)
    done = []
    refreshed = select(refresh, LESSONS) if refresh else []
    for src in select(None, LESSONS):
        target = folder / src.name
        if src in refreshed and target.exists():
            backup = folder / "backup" / f"{src.stem}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
            backup.parent.mkdir(exist_ok=True)
            shutil.move(target, backup)
            done.append(f"{src.name}: your version moved to {backup.relative_to(folder.parent)}")
        if not target.exists():
            shutil.copy2(src, target)
            done.append(f"{src.name}: fresh copy in {folder.name}/")
    return done


def shadowing_helpers(folder: Path | None = None) -> list[str]:
    """A warning for each ``helpers.py`` or ``helpers/`` of the learner's own in ``folder``.

    The lessons' kernels start in that folder (my-lessons/) and Python looks there first, so
    ``import helpers`` would import it instead of the kit's package (the setup cells then
    stop, naming it). A link to the kit's own helpers/ is fine.
    """
    folder = folder or PERSONAL
    kit = Path(__file__).resolve().parents[1]
    return [f"warning: {p} hides the kit's helpers package: the lessons run in {folder.name}/, "
            f"so `import helpers` would import your {'folder' if p.is_dir() else 'file'} "
            f"instead. Rename it (for example to my_{p.name}) and import it by that name."
            for p in (folder / "helpers.py", folder / "helpers")
            if (p.exists() or p.is_symlink()) and p.resolve() != kit]


def _tracked_files(paths: list[str]) -> list[Path]:
    import subprocess

    out = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [ROOT / p for p in out.split("\0") if p]


def release(solutions: bool = False, out_dir: Path | None = None) -> Path:
    """Zip the learner bundle (no solution code anywhere) or, with ``solutions=True``, the
    bundle an instructor hands out later: the same plus solutions/."""
    import zipfile

    from .. import __version__

    stale = build_lessons(check=True)
    if stale:
        raise BuildError(f"lessons/ is out of date ({', '.join(stale)}): run `make lessons`")
    kind = "solutions" if solutions else "learner"
    paths = LEARNER_BUNDLE + (SOLUTIONS_EXTRA if solutions else [])
    out_dir = out_dir or DIST
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"gpu-lessons-{kind}-{__version__}.zip"
    prefix = f"gpu-lessons-{__version__}"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in _tracked_files(paths):
            name = f"{prefix}/{path.relative_to(ROOT)}"
            if path == ROOT / "README.md":
                zf.writestr(name, _without_instructor_section(path.read_text(encoding="utf-8")))
            else:
                zf.write(path, name)
    return target


def _without_instructor_section(readme: str) -> str:
    """The README without its "For instructors" section: bundles leave docs/ out."""
    return re.sub(r"(?ms)^## For instructors\n.*?(?=^## )", "", readme)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.authoring.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_lessons = sub.add_parser("lessons", help="generate lessons/ from solutions/")
    p_lessons.add_argument("--check", action="store_true", help="only verify, exit 1 if stale")
    p_lessons.add_argument("names", nargs="*")
    p_out = sub.add_parser("outputs", help="regenerate lessons, then execute and store outputs")
    p_out.add_argument("names", nargs="*")
    sub.add_parser("exercises", help="list every exercise id with its minutes")
    p_minutes = sub.add_parser("minutes", help="estimated core/optional minutes of each lesson")
    p_minutes.add_argument("names", nargs="*")
    p_minutes.add_argument("--strict", action="store_true",
                           help="exit 1 unless every lesson fits its stated minutes")
    p_personal = sub.add_parser("personal", help="copy new lessons into my-lessons/")
    p_personal.add_argument("--refresh", nargs="+", metavar="NAME",
                            help="replace these lessons with fresh copies (yours are backed up)")
    p_personal.add_argument("--folder", type=Path, default=None,
                            help="the learners' folder (default: my-lessons/)")
    p_release = sub.add_parser("release", help="build a learner (or instructor) zip in dist/")
    p_release.add_argument("--solutions", action="store_true",
                           help="the bundle handed out later: learner bundle + solutions/")
    args = parser.parse_args(argv)

    try:
        if args.command == "lessons":
            stale = build_lessons(args.names, check=args.check)
            if args.check:
                if stale:
                    print("lessons/ is out of date; run `make lessons`: " + ", ".join(stale))
                    return 1
                print("lessons/ is in sync with solutions/")
            else:
                print(f"lessons written ({len(stale)} changed)")
            return 0
        if args.command == "outputs":
            build_lessons(args.names)
            for src in select(args.names):
                for path in (src, LESSONS / src.name):
                    seconds = execute(path, learner=path.parent == LESSONS)
                    print(f"executed {path.relative_to(ROOT)} in {seconds:.1f} s", flush=True)
            return 0
        if args.command == "exercises":
            for ex in all_exercises():
                minutes = f"{ex.minutes:3d} min" if ex.minutes is not None else "minutes missing"
                print(f"{ex.id:40s} {minutes:16s} {ex.notebook}")
            return 0
        if args.command == "minutes":
            from .pacing import minutes_report

            text, ok = minutes_report(select(args.names))
            print(text)
            return 1 if args.strict and not ok else 0
        if args.command == "personal":
            for line in personal_copy(args.refresh, args.folder):
                print(line)
            for warning in shadowing_helpers(args.folder):
                print(warning, file=sys.stderr)
            return 0
        if args.command == "release":
            target = release(solutions=args.solutions)
            print(f"wrote {target.relative_to(ROOT)}")
            return 0
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
