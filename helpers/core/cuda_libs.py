"""Which shared libraries this process has loaded, and from where (cuDNN above all).

Two cuDNN builds in one environment, or an incomplete cuDNN wheel, do not fail at import:
the cuDNN 9 dispatcher (``libcudnn.so.9``) loads its sub-libraries (``libcudnn_cnn``,
``libcudnn_engines_tensor_ir``...) lazily, from wherever the loader finds them, and a
mismatch shows up only at the first convolution (``CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH``)
or not at all. ``make gpu-check`` prints :func:`cudnn_report`: each sub-library, whether
torch's own ``nvidia/cudnn/lib`` holds it, and the file actually mapped into the process.

The pinned ``nvidia-cudnn-cu13==9.20.0.48`` (torch 2.13.0's) ships without
``libcudnn_engines_tensor_ir.so.9``, so this report flags it as missing from torch's folder
and shows any other copy that got loaded instead.

Linux only (``/proc/self/maps``); elsewhere the results are empty and say why.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .checks import shown, text
from .fmt import ShownAsTable

__all__ = ["CUDNN_SUBLIBRARIES", "CudnnReport", "LoadedLibraries", "LoadedLibrary",
           "cudnn_findings", "cudnn_report", "loaded_libraries"]

MAPS = "/proc/self/maps"
# cuDNN 9 sub-libraries that both pip builds read for requirements-gpu*.txt install
# (nvidia-cudnn-cu13 9.20.0.48, nvidia-cudnn-cu12 9.28.0.42, from their RECORD files:
# tests/data/gpu_stack.json), plus libcudnn_engines_tensor_ir, which 9.20.0.48 lacks
CUDNN_SUBLIBRARIES = (
    "libcudnn", "libcudnn_adv", "libcudnn_cnn", "libcudnn_engines_precompiled",
    "libcudnn_engines_runtime_compiled", "libcudnn_engines_tensor_ir", "libcudnn_graph",
    "libcudnn_heuristic", "libcudnn_ops",
)
_SHARED_LIBRARY = re.compile(r"\.so(\.\d+)*$")


@dataclass(frozen=True)
class LoadedLibrary:
    """One shared library mapped into this process."""

    name: str  # file name, e.g. "libcudnn_ops.so.9"
    path: str  # the path the loader mapped

    @property
    def stem(self) -> str:
        """The name without ``.so`` and version: ``libcudnn_ops``."""
        return self.name.split(".so")[0]

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)


@dataclass(frozen=True, repr=False)
class LoadedLibraries(ShownAsTable):
    """The loaded shared libraries whose file name matches ``pattern``."""

    pattern: str
    libraries: tuple[LoadedLibrary, ...]
    reason: str = ""  # why the list is empty without looking (not Linux, maps unreadable)

    def __iter__(self):
        return iter(self.libraries)

    def __len__(self) -> int:
        return len(self.libraries)

    def paths(self) -> list[str]:
        return [lib.path for lib in self.libraries]

    def text(self) -> str:
        if self.reason:
            return f"libraries matching {self.pattern!r}: not known ({self.reason})"
        lines = [f"libraries matching {self.pattern!r}: {len(self)}"]
        lines += [f"  {lib.name:<40} {lib.directory}" for lib in self.libraries]
        return "\n".join(lines)


def _read_maps() -> tuple[str | None, str]:
    if not sys.platform.startswith("linux"):
        return None, f"{sys.platform} has no /proc/self/maps (Linux only)"
    try:
        return Path(MAPS).read_text(), ""
    except OSError as error:
        return None, f"cannot read {MAPS}: {error}"


def loaded_libraries(pattern: str = "cudnn", maps_text: str | None = None) -> LoadedLibraries:
    """Shared libraries loaded in this process whose file name matches ``pattern``.

    Args:
        pattern: a regular expression searched in each library's file name
            (``"cudnn"``, ``r"libnccl\\.so"``).
        maps_text: the text of a ``/proc/<pid>/maps`` file; None reads this process's
            (tests pass a made-up one).

    Returns:
        :class:`LoadedLibraries`, sorted by file name then path, one entry per path; empty
        with ``reason`` set where the maps cannot be read (not Linux).
    """
    try:
        regex = re.compile(text(pattern, "pattern (a regular expression)", longest=1000))
    except re.error as error:
        raise ValueError(f"pattern is not a valid regular expression: {error}") from None
    if maps_text is not None and not isinstance(maps_text, str):
        raise TypeError(f"maps_text must be a str or None, got {type(maps_text).__name__}")
    reason = ""
    if maps_text is None:
        maps_text, reason = _read_maps()
        if maps_text is None:
            return LoadedLibraries(pattern, (), reason)
    found = {}
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue  # anonymous, [heap], [stack], [vdso]...
        path = fields[5].removesuffix(" (deleted)")
        name = os.path.basename(path)
        if _SHARED_LIBRARY.search(name) and regex.search(name):
            found.setdefault(path, LoadedLibrary(name, path))
    libraries = tuple(sorted(found.values(), key=lambda lib: (lib.name, lib.path)))
    return LoadedLibraries(pattern, libraries, reason)


@dataclass(frozen=True, repr=False)
class CudnnReport(ShownAsTable):
    """Where each cuDNN sub-library came from, and what looks wrong (``problems``)."""

    checked: bool  # False: no CUDA (or no /proc/self/maps), nothing was loaded or looked at
    reason: str
    torch_cudnn_dir: str  # torch's own nvidia/cudnn/lib ("" when unknown)
    rows: tuple[tuple[str, bool, tuple[str, ...]], ...] = ()  # (sub-library, in dir, loaded)
    problems: tuple[str, ...] = ()
    others: tuple[str, ...] = ()  # libcudnn* loaded beyond CUDNN_SUBLIBRARIES

    @property
    def ok(self) -> bool:
        return self.checked and not self.problems

    def text(self) -> str:
        if not self.checked:
            return f"cuDNN libraries: not checked ({self.reason})"
        lines = [f"cuDNN libraries (torch's folder: {self.torch_cudnn_dir or 'not found'})",
                 f"  {'sub-library':<36} {'in folder':<9}  loaded from"]
        for stem, present, loaded in self.rows:
            where = ", ".join(loaded) if loaded else "-"
            lines.append(f"  {stem:<36} {'yes' if present else 'NO':<9}  {where}")
        lines += [f"  also loaded: {path}" for path in self.others]
        lines += [f"  PROBLEM: {problem}" for problem in self.problems] or ["  no problems"]
        return "\n".join(lines)


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def cudnn_findings(loaded: LoadedLibraries, torch_cudnn_dir: str | os.PathLike | None,
                   reason: str = "") -> CudnnReport:
    """Compare the loaded ``libcudnn*`` files with torch's own cuDNN folder.

    Args:
        loaded: :func:`loaded_libraries` for ``"libcudnn"``.
        torch_cudnn_dir: torch's ``site-packages/nvidia/cudnn/lib``; None when torch has no
            pip cuDNN (a site or conda build): then only double loads are problems.
        reason: why nothing was loaded, when the caller knows.

    Returns:
        :class:`CudnnReport` whose ``problems`` name each sub-library missing from torch's
        folder, loaded from another folder, or loaded from two paths.
    """
    if not isinstance(loaded, LoadedLibraries):
        raise TypeError(f"loaded must be a LoadedLibraries, got {type(loaded).__name__}")
    if torch_cudnn_dir is not None and not isinstance(torch_cudnn_dir, (str, os.PathLike)):
        raise TypeError(f"torch_cudnn_dir must be a path or None, got {shown(torch_cudnn_dir)}")
    if loaded.reason:
        return CudnnReport(False, loaded.reason, str(torch_cudnn_dir or ""))
    folder = Path(torch_cudnn_dir) if torch_cudnn_dir is not None else None
    if folder is not None and not folder.is_dir():
        folder = None
    present = ({p.name.split(".so")[0] for p in folder.iterdir()} if folder else set())
    by_stem = {}
    for lib in loaded:
        by_stem.setdefault(lib.stem, []).append(lib.path)
    rows, problems = [], []
    for stem in CUDNN_SUBLIBRARIES:
        paths = tuple(by_stem.get(stem, ()))
        rows.append((stem, stem in present, paths))
        if folder and stem not in present:
            where = f"; loaded from {', '.join(paths)}" if paths else ""
            problems.append(f"{stem} is missing from {folder}{where}")
        for path in paths:
            if folder and not _same_dir(os.path.dirname(path), folder):
                problems.append(f"{stem} loaded from {os.path.dirname(path)}, "
                                f"not from torch's {folder}")
        if len(paths) > 1:
            problems.append(f"{stem} loaded twice: {', '.join(paths)}")
    others = tuple(lib.path for lib in loaded if lib.stem not in CUDNN_SUBLIBRARIES)
    if not loaded.libraries:
        reason = reason or "no libcudnn* library is loaded"
    return CudnnReport(True, reason, str(folder or ""), tuple(rows), tuple(problems), others)


def torch_cudnn_dir() -> Path | None:
    """``site-packages/nvidia/cudnn/lib`` next to the imported torch, if it exists."""
    import torch

    folder = Path(torch.__file__).resolve().parent.parent / "nvidia" / "cudnn" / "lib"
    return folder if folder.is_dir() else None


def cudnn_report() -> CudnnReport:
    """Run one small convolution on the GPU, then report where cuDNN was loaded from.

    Without CUDA nothing is run or loaded: the report says so (``checked`` is False).
    Used by ``make gpu-check``.
    """
    import torch

    if not torch.cuda.is_available():
        return CudnnReport(False, "torch.cuda.is_available() is False", "")
    if not torch.backends.cudnn.is_available():
        return CudnnReport(False, "torch.backends.cudnn.is_available() is False", "")
    x = torch.randn(1, 3, 16, 16, device="cuda")
    w = torch.randn(4, 3, 3, 3, device="cuda")
    torch.nn.functional.conv2d(x, w, padding=1).sum().item()  # loads cuDNN's sub-libraries
    return cudnn_findings(loaded_libraries(r"^libcudnn"), torch_cudnn_dir())
