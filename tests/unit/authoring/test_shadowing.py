"""A learner's own helpers.py (or helpers/) in my-lessons/ shadows the kit's package.

The lessons' kernels start in my-lessons/ and Python looks there first, so ``import helpers``
would import the learner's file. ``make lab`` / ``build personal`` warn, naming it, and every
setup cell stops with an ImportError that names it (and passes on the kit's own package).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import lean_env
import pytest

from helpers.authoring import build

ROOT = Path(__file__).resolve().parents[3]


def shadow(folder: Path, kind: str) -> Path:
    if kind == "file":
        path = folder / "helpers.py"
        path.write_text("def plot(x):\n    return x\n")
    else:  # a folder without __init__.py: a namespace package, which shadows the kit too
        path = folder / "helpers"
        path.mkdir()
        (path / "plots.py").write_text("x = 1\n")
    return path


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_personal_warns_naming_the_shadowing_helpers(tmp_path, kind, capsys, monkeypatch):
    monkeypatch.setattr(build, "LESSONS", tmp_path / "lessons")
    (tmp_path / "lessons").mkdir()
    (tmp_path / "lessons" / "00_setup.ipynb").write_text("{}")
    mine = tmp_path / "my-lessons"
    mine.mkdir()
    path = shadow(mine, kind)
    (warning,) = build.shadowing_helpers(mine)
    assert warning.startswith(f"warning: {path} hides")
    assert build.main(["personal", "--folder", str(mine)]) == 0
    captured = capsys.readouterr()
    assert "00_setup.ipynb: fresh copy in my-lessons/" in captured.out
    assert f"warning: {path} hides the kit's helpers package" in captured.err
    assert "Rename it" in captured.err and f"my_{path.name}" in captured.err


def test_no_warning_without_a_shadow_or_for_a_link_to_the_kit(tmp_path):
    assert build.shadowing_helpers(tmp_path) == []
    (tmp_path / "helpers").symlink_to(ROOT / "helpers")
    assert build.shadowing_helpers(tmp_path) == []
    (tmp_path / "my_helpers.py").write_text("x = 1\n")
    assert build.shadowing_helpers(tmp_path) == []


def test_build_personal_command_warns(tmp_path):
    """What `make lab` runs: ``python -m helpers.authoring.build personal``."""
    mine = tmp_path / "mine"
    mine.mkdir()
    path = shadow(mine, "file")
    result = subprocess.run(
        [sys.executable, "-m", "helpers.authoring.build", "personal", "--folder", str(mine)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"warning: {path} hides the kit's helpers package" in result.stderr
    assert sorted(p.name for p in mine.glob("*.ipynb")) == sorted(
        p.name for p in (ROOT / "lessons").glob(build.LESSON_GLOB))


def test_make_lab_runs_build_personal():
    result = subprocess.run(["make", "-n", "--no-print-directory", "lab", "VENV=.venv"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "-m helpers.authoring.build personal" in result.stdout, result.stdout + result.stderr


# ---------------------------------------------------------------- the setup cells

def setup_guards() -> dict[str, str]:
    """notebook -> ``import helpers`` plus the guard statement of its setup cell."""
    guards = {}
    for folder in ("solutions", "lessons"):
        for path in sorted((ROOT / folder).glob(build.LESSON_GLOB)):
            nb = build.read(path)
            (cell,) = [c for c in nb.cells if c.cell_type == "code"
                       and "import helpers" in c.source.splitlines()]
            tree = ast.parse(cell.source)
            body = tree.body
            index = next(i for i, node in enumerate(body) if isinstance(node, ast.Import)
                         and [a.name for a in node.names] == ["helpers"])
            guard = body[index + 1]
            assert isinstance(guard, ast.If) and "hasattr(helpers" in ast.unparse(guard.test), (
                f"{folder}/{path.name}: the setup cell checks right after `import helpers` "
                "that it is the kit's package")
            guards[f"{folder}/{path.name}"] = "import helpers\n" + ast.get_source_segment(
                cell.source, guard)
    return guards


def test_every_setup_cell_has_the_same_guard():
    guards = setup_guards()
    assert len(guards) >= 20
    assert len(set(guards.values())) == 1, "the setup cells' guards differ"


def run_guard(cwd: Path) -> subprocess.CompletedProcess:
    code = next(iter(setup_guards().values()))
    # like a kernel's, the sys.path of `python -c` starts with the working directory ('')
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


# whether a folder of the child's sys.path (after its working directory) holds a regular
# helpers package: the kit's own folder, through PYTHONPATH (scripts/gpu_check.py sets it) or
# a .pth file (.venv-site); the full environment's editable install puts no folder there
KIT_ON_PATH = ("import pathlib, sys; print(any((pathlib.Path(p) / 'helpers' / '__init__.py')"
               ".is_file() for p in sys.path[1:] if p))")


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_setup_cell_stops_naming_the_shadowing_file(tmp_path, kind):
    if kind == "folder" and subprocess.run(
            [sys.executable, "-c", KIT_ON_PATH], cwd=tmp_path, capture_output=True, text=True,
            timeout=60, check=True).stdout.strip() == "True":
        lean_env.missing("a helpers/ folder without __init__.py cannot shadow the kit here: "
                         "the kit's folder is on sys.path (PYTHONPATH or a .pth file, as in "
                         ".venv-site), and a regular package wins over a namespace package")
    path = shadow(tmp_path, kind)
    result = run_guard(tmp_path)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    named = str(path) if kind == "file" else "helpers/"
    assert last == f"ImportError: {named} is not the kit's helpers: rename it", result.stderr


def test_setup_cell_guard_passes_with_the_kit(tmp_path):
    result = run_guard(tmp_path)
    assert result.returncode == 0, result.stderr
