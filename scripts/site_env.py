#!/usr/bin/env python3
"""An environment over a site's Python that already has PyTorch (`make setup SITE=1`).

Clusters provide PyTorch (sometimes TensorFlow) as a module or a container, their compute
nodes are offline, and home quotas cannot hold the CUDA wheels. This script builds a small
virtual environment *over* that Python instead of installing the frameworks again:

* ``setup``: create ``--venv`` (default ``.venv-site``) from the site's Python, make it see
  every directory the site's Python puts on ``sys.path`` at start-up (its site-packages and
  what their ``.pth`` files add) through one ``.pth`` file; ``--system-site-packages`` is not
  enough when the site's Python is itself a virtual environment. Then check torch and
  TensorFlow against the supported range, install only the lines of requirements-site.txt
  whose package the site lacks (from ``--wheelhouse`` with ``--no-index`` when given), put the
  kit's ``helpers`` on the path and verify the result.
* ``wheelhouse``: download requirements-site.txt and its dependencies as wheels for another
  Python version and platform (``--pyver 3.12``), for an offline node.
* ``check``: only the framework version check (``--torch``/``--tensorflow`` test other
  versions than the installed ones).

Run it with the site's Python (it needs only the standard library):
``python3 scripts/site_env.py setup --wheelhouse wheelhouse-site``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements-site.txt"
PTH_NAME = "_gpu_lessons_site.pth"
STAMP_NAME = ".installed-site"

# The supported framework range: [floor, ceiling). A version is compared by its release
# number only, so pre-release and local labels (2.11.0a0+nv..., 2.11.0+cu130) count as it.
# torch: 2.13 is what CI tests; 2.11 is the floor once `make gpu-check` ran on a node with it.
TORCH_RANGE = ((2, 11), (2, 14))
TENSORFLOW_RANGE = ((2, 16), (2, 22))  # TensorFlow is optional: absent is fine
PYTHON_FLOOR = (3, 11)  # pyproject requires-python, Makefile, README
# never installed into the site environment: the site provides these (or goes without)
NEVER_INSTALL = {"torch", "tensorflow", "tensorflow-cpu", "tensorflow-intel", "keras",
                 "jupyterlab", "notebook", "playwright", "pytest-playwright"}

# Run by the site's Python (``-s``: without the user site): what it knows about itself.
_PROBE = r"""
import json, os, sys, sysconfig
import importlib.util
from importlib import metadata
pythonpath = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
def build_record(package, *parts):
    # a framework's own record of its build, read without importing the framework (seconds,
    # and the CUDA libraries loaded): torch/version.py (torch.version), TensorFlow's
    # python/platform/build_info.py (what tf.sysconfig.get_build_info() returns)
    try:
        spec = importlib.util.find_spec(package)
        folders = list(spec.submodule_search_locations or []) if spec else []
        path = os.path.join(folders[0], *parts) if folders else ""
        if not os.path.isfile(path):
            return {}
        spec = importlib.util.spec_from_file_location(f"_site_env_{package}_build", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return vars(module)
    except Exception:
        return {}
def text_or_none(value):
    return str(value) if value else None
paths = sysconfig.get_paths()
std = {paths["stdlib"], paths["platstdlib"]}
print(json.dumps({
    "executable": sys.executable,
    "version": list(sys.version_info[:3]),
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "sys_path": [p for p in sys.path if p and p not in pythonpath],
    "stdlib": sorted(std),
    "torch": version("torch"),
    "tensorflow": version("tensorflow") or version("tensorflow-cpu"),
    "torch_cuda": text_or_none(build_record("torch", "version.py").get("cuda")),
    "tensorflow_cuda": text_or_none((build_record("tensorflow", "python", "platform",
                                                  "build_info.py").get("build_info")
                                     or {}).get("cuda_version")),
}))
"""

# Run by the new environment's Python: what it imports, and from where.
_VERIFY = r"""
import json, importlib, sys
out = {"executable": sys.executable}
import torch
out["torch"] = torch.__version__
out["torch_file"] = torch.__file__
out["torch_cuda"] = torch.version.cuda
import helpers
out["helpers_file"] = helpers.__file__
for name in ("nbclient", "ipykernel", "pynvml", "pytest"):
    out[name] = importlib.import_module(name).__file__
print(json.dumps(out))
"""


class SiteError(RuntimeError):
    """A problem the user must fix on the site; the message says how."""


def release(version: str) -> tuple[int, ...]:
    """The release number of a version string: ``'2.11.0a0+nv25'`` -> ``(2, 11, 0)``."""
    if not isinstance(version, str):
        raise TypeError(f"version must be a str, got {type(version).__name__}")
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if not match:
        raise ValueError(f"version: cannot read a release number from {version!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def _span(bounds: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    low, high = (".".join(map(str, b)) for b in bounds)
    return f">= {low} and < {high}"


def _cuda_major(value: str | None, argument: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str (a CUDA version such as '12.5.1') or None, "
                        f"got {type(value).__name__}")
    match = re.fullmatch(r"\s*(\d+)(?:\.\d+)*\s*", value)
    if not match:
        raise ValueError(f"{argument}: cannot read a CUDA version from {value!r}")
    return int(match.group(1))


def check_frameworks(torch: str | None, tensorflow: str | None, *,
                     torch_cuda: str | None = None,
                     tensorflow_cuda: str | None = None) -> list[str]:
    """The reasons the site's frameworks are not supported (empty: supported).

    ``torch`` is required and must lie in TORCH_RANGE; ``tensorflow`` may be None (absent),
    otherwise it must lie in TENSORFLOW_RANGE. ``torch_cuda`` (``torch.version.cuda``) and
    ``tensorflow_cuda`` (``tf.sysconfig.get_build_info()["cuda_version"]``) are the CUDA
    versions they were built for, None for a CPU build (or unknown): one process cannot hold
    two CUDA majors, whose cuDNN and NCCL libraries collide (README "GPU machines").
    """
    torch_major = _cuda_major(torch_cuda, "torch_cuda")
    tensorflow_major = _cuda_major(tensorflow_cuda, "tensorflow_cuda")
    problems = []
    if torch is None:
        problems.append("torch is not installed in the site's Python: load the site's "
                        "PyTorch module (or pass PYTHON=/path/to/python that has torch)")
    elif not TORCH_RANGE[0] <= release(torch)[:2] < TORCH_RANGE[1]:
        problems.append(f"torch {torch} is not supported: the kit needs torch "
                        f"{_span(TORCH_RANGE)} (CI tests 2.13; 2.11 is the oldest a GPU "
                        "check ran on). Load another PyTorch module, or use `make setup "
                        "GPU=1` to install the kit's own torch")
    if tensorflow is not None and not (
            TENSORFLOW_RANGE[0] <= release(tensorflow)[:2] < TENSORFLOW_RANGE[1]):
        problems.append(f"TensorFlow {tensorflow} is not supported: the kit needs TensorFlow "
                        f"{_span(TENSORFLOW_RANGE)}, or none (its cells then skip with the "
                        "reason). Unload the TensorFlow module")
    if (torch is not None and tensorflow is not None and None not in (torch_major,
                                                                      tensorflow_major)
            and torch_major != tensorflow_major):
        problems.append(f"torch {torch} is built for CUDA {torch_cuda} and TensorFlow "
                        f"{tensorflow} for CUDA {tensorflow_cuda}: in one process their "
                        "cuDNN and NCCL libraries collide (README 'GPU machines'). Use a site "
                        "Python without TensorFlow (unload the TensorFlow module: its cells "
                        "then skip with the reason), or one whose torch and TensorFlow share a "
                        "CUDA major (PYTHON=/path/to/python); for TensorFlow on the GPU, the "
                        "kit's own environment: `make kernel-tf GPU=1`")
    return problems


def read_requirements(path: Path) -> list[tuple[str, str]]:
    """``(normalised name, requirement line)`` for each requirement line of ``path``."""
    out = []
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
        if not name:
            raise ValueError(f"requirements: cannot read {raw!r} in {path}")
        out.append((normalise(name.group(0)), line))
    return out


def normalise(name: str) -> str:
    """PEP 503 name: ``Jupyter_Client`` -> ``jupyter-client``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pth_lines(probe: dict) -> list[str]:
    """The directories the new environment must add: the site Python's start-up path
    without the standard library, the interpreter's zip and the current directory."""
    std = {os.path.normpath(p) for p in probe["stdlib"]}
    lines = []
    for entry in probe["sys_path"]:
        norm = os.path.normpath(entry)
        if (norm in std or norm.endswith(".zip") or norm.endswith("lib-dynload")
                or not os.path.isabs(norm) or norm in lines):
            continue
        lines.append(norm)
    return lines


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, **kwargs)


def probe_python(python: str) -> dict:
    """What the site's Python reports about itself (see _PROBE)."""
    exe = shutil.which(python) or python
    try:
        done = subprocess.run([exe, "-s", "-c", _PROBE], capture_output=True, text=True,
                              check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        raise SiteError(f"cannot run the site's Python {python!r}: {detail}") from None
    return json.loads(done.stdout)


def _key(probe: dict, requirements: Path, wheelhouse: str | None) -> str:
    text = json.dumps([probe, requirements.read_text(), Path(__file__).read_text(),
                       (ROOT / "pyproject.toml").read_text(), wheelhouse])
    return hashlib.sha256(text.encode()).hexdigest()


def missing(env_python: Path, requirements: Path) -> list[tuple[str, str]]:
    """The requirement lines whose distribution the new environment cannot find at all."""
    names = [name for name, _ in read_requirements(requirements)]
    code = ("import json, sys\nfrom importlib import metadata\nout = []\n"
            "for n in json.loads(sys.argv[1]):\n"
            "    try: metadata.distribution(n)\n"
            "    except metadata.PackageNotFoundError: out.append(n)\n"
            "print(json.dumps(out))")
    done = _run([str(env_python), "-c", code, json.dumps(names)], capture_output=True)
    absent = set(json.loads(done.stdout))
    return [(n, line) for n, line in read_requirements(requirements) if n in absent]


def wheel_names(wheelhouse: Path) -> set[str]:
    """The normalised project names of the wheels in ``wheelhouse``."""
    return {normalise(p.name.split("-", 1)[0]) for p in Path(wheelhouse).glob("*.whl")}


def setup(python: str, venv: Path, requirements: Path, wheelhouse: str | None,
          force: bool = False) -> dict:
    """Create or refresh the site environment; returns what ``_VERIFY`` printed."""
    probe = probe_python(python)
    version = tuple(probe["version"])
    if version[:2] < PYTHON_FLOOR:
        raise SiteError(f"Python {'.'.join(map(str, version))} is too old: the kit needs "
                        f"Python >= {'.'.join(map(str, PYTHON_FLOOR))}")
    problems = check_frameworks(probe["torch"], probe["tensorflow"],
                                torch_cuda=probe.get("torch_cuda"),
                                tensorflow_cuda=probe.get("tensorflow_cuda"))
    if problems:
        raise SiteError("\n".join(problems))
    print(f"site Python: {probe['executable']} ({'.'.join(map(str, version))}"
          f"{', a virtual environment' if probe['prefix'] != probe['base_prefix'] else ''})")
    print(f"site frameworks: torch {probe['torch']}, TensorFlow "
          f"{probe['tensorflow'] or 'absent (its cells skip with the reason)'}")

    venv = Path(venv).absolute()
    stamp = venv / STAMP_NAME
    key = _key(probe, requirements, wheelhouse)
    if not force and stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        print(f"{venv.name} is up to date")
        return json.loads(stamp.read_text())["verified"]

    env_python = venv / "bin" / "python"
    if list(venv.glob(".installed-gpu*")):
        raise SiteError(f"{venv} is the kit's full environment (make setup): choose another "
                        "VENV for SITE=1 (the default is .venv-site)")
    if stamp.is_file() and json.loads(stamp.read_text()).get("base") != probe["executable"]:
        print(f"the site's Python changed: recreating {venv}")
        shutil.rmtree(venv)
    if not env_python.exists():
        # pip comes from the site (through the .pth) or from ensurepip below
        _run([probe["executable"], "-m", "venv", "--without-pip", str(venv)])
    stamp.unlink(missing_ok=True)
    site_packages = Path(_run([str(env_python), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True).stdout.strip())
    lines = pth_lines(probe)
    (site_packages / PTH_NAME).write_text(
        "# the site Python's packages (scripts/site_env.py)\n" + "\n".join(lines) + "\n")
    # the kit's helpers, from this checkout (no build step, so no setuptools needed offline)
    (site_packages / "_gpu_lessons_helpers.pth").write_text(f"{ROOT}\n")

    if subprocess.run([str(env_python), "-m", "pip", "--version"],
                      capture_output=True).returncode != 0:
        _run([str(env_python), "-m", "ensurepip", "--default-pip"], capture_output=True)

    todo = missing(env_python, requirements)
    blocked = [n for n, _ in todo if n in NEVER_INSTALL]
    if blocked:
        raise SiteError(f"{requirements.name} must not list {', '.join(blocked)}")
    if todo and wheelhouse:
        have = wheel_names(Path(wheelhouse))
        absent = [n for n, _ in todo if n not in have]
        if absent:
            raise SiteError(
                f"the site's Python lacks {', '.join(absent)} and {wheelhouse} has no wheel "
                "for it: rebuild the wheelhouse with `make wheelhouse SITE=1 PYVER=... "
                "SITE_PROVIDES=` (downloads everything), or load a module that provides it")
    if todo:
        print("installing what the site lacks: " + ", ".join(line for _, line in todo))
        source = ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse else []
        with tempfile.TemporaryDirectory() as tmp:
            req, report = Path(tmp) / "missing.txt", Path(tmp) / "report.json"
            req.write_text("\n".join(line for _, line in todo) + "\n")
            _run([str(env_python), "-m", "pip", "install", "--quiet", *source,
                  "--report", str(report), "-r", str(req)])
            installed = [item["metadata"]["name"] for item in
                         json.loads(report.read_text()).get("install", [])]
        print(f"installed {len(installed)} packages into {venv.name}: "
              + ", ".join(sorted(installed, key=str.lower)))
        wrong = sorted(n for n in installed if normalise(n) in NEVER_INSTALL)
        if wrong:
            raise SiteError(f"pip installed {', '.join(wrong)} into {venv}: the site's "
                            "framework must be used; report this as a bug")
        check = subprocess.run([str(env_python), "-m", "pip", "check"], capture_output=True,
                               text=True)
        if check.returncode != 0:
            print("pip check (the site's own packages may disagree; the kit's tests decide):"
                  "\n" + check.stdout.strip())
    else:
        print("nothing to install: the site has every package the kit needs")

    if probe["torch"] and not (venv / "bin" / "torchrun").exists():
        # torchrun of this environment (helpers.launch looks next to sys.executable): the
        # site's own torchrun would start the workers with the site's Python
        (venv / "bin" / "torchrun").write_text(
            f"#!{env_python}\nimport sys\nfrom torch.distributed.run import main\n\n"
            "sys.exit(main())\n")
        (venv / "bin" / "torchrun").chmod(0o755)
    verified = verify(env_python, probe)
    stamp.write_text(json.dumps({"key": key, "base": probe["executable"],
                                 "verified": verified}, indent=1))
    return verified


def verify(env_python: Path, probe: dict) -> dict:
    """Import torch and helpers in the new environment; torch must be the site's own."""
    done = subprocess.run([str(env_python), "-c", _VERIFY], capture_output=True, text=True)
    if done.returncode != 0:
        raise SiteError(f"the new environment cannot import what it needs:\n{done.stderr}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["torch"] != probe["torch"] and release(out["torch"]) != release(probe["torch"]):
        raise SiteError(f"the environment imports torch {out['torch']} from "
                        f"{out['torch_file']}, not the site's torch {probe['torch']}")
    if Path(out["helpers_file"]).resolve().parents[1] != ROOT:
        raise SiteError(f"helpers is imported from {out['helpers_file']}, not from {ROOT}")
    print(f"ready: torch {out['torch']} (CUDA {out['torch_cuda']}) from "
          f"{Path(out['torch_file']).parents[1]}; helpers from {ROOT}")
    return out


def wheelhouse_command(python: str, dest: Path, requirements: Path, pyver: str,
                       platforms: list[str], without: set[str]) -> tuple[list[str], str]:
    """The ``pip download`` command for the wheelhouse, and the requirement text it reads."""
    if not re.fullmatch(r"3\.\d+", pyver):
        raise ValueError(f"pyver must look like 3.12, got {pyver!r}")
    keep = [line for name, line in read_requirements(requirements)
            if name not in {normalise(w) for w in without}]
    tag = "cp" + pyver.replace(".", "")
    cmd = [python, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
           "--python-version", pyver, "--implementation", "cp",
           "--abi", tag, "--abi", "abi3", "--abi", "none", "-d", str(dest)]
    for platform in [*platforms, "any"]:
        cmd += ["--platform", platform]
    return cmd, "\n".join(keep) + "\n"


def wheelhouse(dest: Path, requirements: Path, pyver: str, platforms: list[str],
               without: set[str]) -> int:
    """Download the wheels; returns the wheelhouse size in bytes."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        cmd, text = wheelhouse_command(sys.executable, dest, requirements, pyver, platforms,
                                       without)
        req.write_text(text)
        _run([*cmd, "-r", str(req)])
    wheels = sorted(dest.glob("*.whl"))
    size = sum(p.stat().st_size for p in wheels)
    skipped = f" (without {', '.join(sorted(without))}: the site provides them)" \
        if without else ""
    print(f"{dest}: {len(wheels)} wheels, {size / 2**20:.1f} MiB for Python {pyver}"
          f"{skipped}")
    return size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup", help="create or refresh the environment over the site's "
                       "Python")
    s.add_argument("--python", default="python3", help="the site's Python (default python3)")
    s.add_argument("--venv", type=Path, default=ROOT / ".venv-site")
    s.add_argument("--wheelhouse", default=None, help="install offline from this folder")
    s.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    s.add_argument("--force", action="store_true", help="redo every step")
    w = sub.add_parser("wheelhouse", help="download the wheels for an offline node")
    w.add_argument("--dest", type=Path, default=ROOT / "wheelhouse-site")
    w.add_argument("--pyver", default=f"{sys.version_info[0]}.{sys.version_info[1]}")
    w.add_argument("--platform", action="append", dest="platforms",
                   help="pip platform tags (default: manylinux x86_64 2_28, 2_17, 2014)")
    w.add_argument("--without", nargs="*", default=[],
                   help="packages the site provides (left out of the wheelhouse)")
    w.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    c = sub.add_parser("check", help="only check framework versions against the range")
    c.add_argument("--python", default="python3")
    c.add_argument("--torch", help="check this torch version instead of the installed one")
    c.add_argument("--tensorflow", help="check this TensorFlow version ('none': absent)")
    args = parser.parse_args(argv)
    try:
        if args.command == "setup":
            setup(args.python, args.venv, args.requirements, args.wheelhouse, args.force)
        elif args.command == "wheelhouse":
            platforms = args.platforms or ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                                           "manylinux2014_x86_64"]
            wheelhouse(args.dest, args.requirements, args.pyver, platforms,
                       set(args.without))
        else:
            probe = {} if args.torch and args.tensorflow else probe_python(args.python)
            torch = args.torch or probe["torch"]
            tf = args.tensorflow if args.tensorflow else probe["tensorflow"]
            tf = None if tf in (None, "none") else tf
            # the CUDA builds are known for the installed versions only
            problems = check_frameworks(
                torch, tf, torch_cuda=None if args.torch else probe.get("torch_cuda"),
                tensorflow_cuda=None if args.tensorflow else probe.get("tensorflow_cuda"))
            if problems:
                raise SiteError("\n".join(problems))
            print(f"supported: torch {torch}, TensorFlow {tf or 'absent'}")
    except SiteError as error:
        print(f"site_env: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
