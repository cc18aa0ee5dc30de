#!/usr/bin/env python3
"""The GPU branch of `make setup GPU=1`: replace CPU builds, then prove torch has CUDA.

PEP 440 ignores a local label in ``==``, so an existing CPU ``.venv`` holding
``torch 2.13.0+cpu`` already satisfies ``torch==2.13.0``: ``pip install`` would keep the CPU
build, and where a ``+cpu`` wheel is reachable (a find-links folder, an extra index) pip even
prefers it, because local versions sort higher. So:

* ``prepare``: uninstall a CPU-only torch and any TensorFlow distribution the GPU requirement
  files do not name (``tensorflow-cpu`` next to ``tensorflow[and-cuda]`` would share the
  ``tensorflow/`` folder), and write a pip constraints file that excludes ``X+cpu`` for each
  pinned ``torch==X``;
* ``verify``: import torch and fail with the reason unless ``torch.version.cuda`` is set, then
  run ``python -m helpers.core.gpu_visibility`` (exit 1 when NVML sees a GPU nobody hid that torch
  cannot use; a machine without a GPU, such as a login node, passes).

It reads installed versions through ``importlib.metadata`` (no framework import) until
``verify``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-intel")


def _name(line: str) -> str | None:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#", 1)[0])
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def requirement_lines(paths: list[Path]) -> list[str]:
    """The requirement lines of ``paths`` (comments and blank lines dropped)."""
    lines = []
    for path in paths:
        for raw in Path(path).read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                lines.append(line)
    return lines


def is_cpu_build(version: str, requires: list[str]) -> bool:
    """True for a torch distribution without CUDA: a ``+cpu`` local label, or no ``nvidia-*``
    / ``cuda-*`` requirement (PyPI's and PyTorch's CUDA wheels pull their CUDA libraries)."""
    if not isinstance(version, str):
        raise TypeError(f"version must be a str, got {type(version).__name__}")
    local = version.partition("+")[2]
    if local.startswith("cpu"):
        return True
    if local.startswith(("cu", "rocm")):
        return False
    return not any(re.match(r"\s*(nvidia-|cuda-)", r) for r in requires)


def to_uninstall(installed: dict[str, tuple[str, list[str]]], wanted: list[str]) -> list[str]:
    """The distributions ``prepare`` removes, given ``{name: (version, requires)}`` of what is
    installed and the GPU requirement lines."""
    names = {_name(line) for line in wanted}
    out = []
    if "torch" in installed and is_cpu_build(*installed["torch"]):
        out.append("torch")
    out += [n for n in TF_DISTRIBUTIONS if n in installed and n not in names]
    return out


def constraints(wanted: list[str]) -> list[str]:
    """``torch!=X+cpu`` for each ``torch==X`` line: pip then never picks the CPU wheel."""
    out = []
    for line in wanted:
        match = re.fullmatch(r"torch\s*==\s*([0-9][0-9A-Za-z.]*)\s*(;.*)?", line.strip())
        if match:
            out.append(f"torch!={match.group(1)}+cpu" + (match.group(2) or ""))
    return out


def _installed() -> dict[str, tuple[str, list[str]]]:
    out = {}
    for name in ("torch", *TF_DISTRIBUTIONS):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        out[name] = (dist.version, list(dist.requires or []))
    return out


def prepare(requirements: list[Path], constraints_file: Path, dry_run: bool = False) -> list[str]:
    wanted = requirement_lines(requirements)
    installed = _installed()
    remove = to_uninstall(installed, wanted)
    for name in remove:
        print(f"{'would remove' if dry_run else 'removing'} {name} {installed[name][0]}: "
              + ("a CPU-only build" if name == "torch" else "not part of the GPU set"))
    if remove and not dry_run:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "-y", *remove],
                       check=True)
    Path(constraints_file).write_text("\n".join(constraints(wanted)) + "\n")
    return remove


def verify() -> int:
    import torch

    if not torch.version.cuda:
        print(f"make setup GPU=1: torch {torch.__version__} in {sys.prefix} is a CPU-only "
              "build, so no lesson can use the GPU. pip took it from a local wheel folder or "
              "an extra index (PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL, pip.conf): remove that "
              "source, or install the CUDA build from https://pypi.org/simple, then run make "
              "setup GPU=1 again.", file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}: CUDA {torch.version.cuda}")
    if not (ROOT / "helpers" / "core" / "gpu_visibility.py").is_file():
        print("helpers.core.gpu_visibility is missing: GPU visibility not checked")
        return 0
    return subprocess.run([sys.executable, "-m", "helpers.core.gpu_visibility"],
                          cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="uninstall CPU builds; write the pip constraints")
    p.add_argument("requirements", nargs="+", type=Path, help="the GPU requirement files")
    p.add_argument("--constraints", type=Path, required=True, help="constraints file to write")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed")
    sub.add_parser("verify", help="fail unless torch is a CUDA build that can see the GPUs")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.requirements, args.constraints, args.dry_run)
        return 0
    return verify()


if __name__ == "__main__":
    sys.exit(main())
