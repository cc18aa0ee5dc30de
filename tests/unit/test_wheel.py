"""A built wheel of the kit installs and imports every public name, without the repository.

Every documented install is editable (``pip install -e .``), which reads helpers/ from the
repository and so hides a wheel that forgets a folder (``packages = ["helpers"]`` once shipped
a wheel without helpers/memory). Here the wheel is built without build isolation (no internet)
from a copy of the sources, installed with ``--no-deps --no-index`` into a fresh venv, and
imported from a working directory outside the repository; a .pth file lends that venv this
environment's site-packages for torch, numpy and TensorFlow.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import importlib.util, json, sys
import helpers
skipped, failed = [], []
for name in helpers.__all__:
    try:
        getattr(helpers, name)
    except ModuleNotFoundError as exc:
        framework = (exc.name or "").split(".")[0]
        if framework in ("tensorflow", "keras") and not importlib.util.find_spec(framework):
            skipped.append(name)
        else:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
modules = {m: getattr(sys.modules[m], "__file__", None) for m in sorted(sys.modules)
           if m == "helpers" or m.startswith("helpers.")}
print(json.dumps({"file": helpers.__file__, "names": len(helpers.__all__), "skipped": skipped,
                  "failed": failed, "modules": modules}))
"""


def _run(cmd, **kw):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                            timeout=600, **kw)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))}\n{result.stdout}\n{result.stderr}"
    return result


def _copy_sources(dest: Path) -> None:
    """What the build reads, so build/ and *.egg-info land in tmp, not in the repository."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "helpers", dest / "helpers", ignore=ignore)


def test_wheel_installs_and_imports_every_public_name(tmp_path):
    src, wheels, venv, work = (tmp_path / d for d in ("src", "wheels", "venv", "work"))
    for d in (src, work):
        d.mkdir()
    _copy_sources(src)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps",
          "--no-index", "-w", wheels, src])
    (wheel,) = wheels.glob("gpu_lessons_helpers-*.whl")

    # every module of helpers/ is in the wheel (packages.find, not a hand-kept list)
    with zipfile.ZipFile(wheel) as zf:
        packed = {n for n in zf.namelist() if n.startswith("helpers/")}
    expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "helpers").rglob("*.py")
                if "__pycache__" not in p.parts}
    assert not expected - packed, f"missing from the wheel: {sorted(expected - packed)}"

    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
          "--no-index", wheel])
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                       "['purelib'])"]).stdout.strip())
    # after the venv's own site-packages: this environment's torch, numpy, TensorFlow...,
    # also those a .pth file lends it (.venv-site: the site's Python's site-packages)
    lent = [sysconfig.get_paths()["purelib"], *site.getsitepackages(),
            *(p for p in sys.path if Path(p).name in ("site-packages", "dist-packages"))]
    (purelib / "zz_test_environment.pth").write_text(
        "\n".join(dict.fromkeys(p for p in lent if Path(p).is_dir())) + "\n")

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(GPU_LESSONS_HEADLESS="1", TF_CPP_MIN_LOG_LEVEL="2")
    out = _run([python, "-c", CHILD], cwd=work, env=env).stdout
    result = json.loads(out.strip().splitlines()[-1])

    assert not result["failed"], "public names that fail from the wheel:\n  " + "\n  ".join(
        result["failed"])
    assert result["names"] > 50
    assert Path(result["file"]).resolve().is_relative_to(venv.resolve()), result["file"]
    outside = {m: f for m, f in result["modules"].items()
               if f and not Path(f).resolve().is_relative_to(venv.resolve())}
    assert not outside, f"helpers modules imported from outside the venv: {outside}"
