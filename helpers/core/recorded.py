"""Results recorded on a real GPU by ``tests/gpu/``, for lessons to show on CPU machines.

``python tests/gpu/test_memory_gpu.py`` (on a CUDA machine) writes
``tests/gpu/results/memory.json``: hardware, driver, versions, date and the measured figures.
A lesson shows them with their label, never as if measured here::

    rec = helpers.recorded_gpu_results("memory")
    if rec is None:
        print("No recorded GPU results yet.")
    else:
        print(rec.label)          # "Recorded on NVIDIA H100 ... (not measured on this machine)"
        rec["figures"]

No torch needed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .checks import text
from .fmt import ShownAsTable

__all__ = ["recorded_gpu_results", "RecordedGpuResults", "RESULTS_DIR", "RESULTS_ENV",
           "results_dir"]

RESULTS_DIR = Path(__file__).resolve().parents[2] / "tests" / "gpu" / "results"
# where the GPU tests write, and the lessons read, instead of this checkout's folder: a first
# GPU run on a node (tests/gpu/first_run.sh) keeps the tree clean and ships one folder back
RESULTS_ENV = "GPU_LESSONS_RESULTS_DIR"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")
KIND = "gpu-lessons recorded GPU results"


@dataclass(frozen=True, repr=False)
class RecordedGpuResults(ShownAsTable):
    """A results file written by a GPU test script: ``data`` is its JSON content."""

    name: str
    path: Path
    data: dict

    @property
    def hardware(self) -> dict:
        hardware = self.data.get("hardware")
        return hardware if isinstance(hardware, dict) else {}

    @property
    def label(self) -> str:
        """One line that says where and when these numbers were measured."""
        hw = self.hardware
        gpu = hw.get("gpu", "an unknown GPU")
        bits = [f"driver {hw['driver']}" if hw.get("driver") else "",
                f"torch {hw['torch']}" if hw.get("torch") else "",
                f"CUDA {hw['cuda']}" if hw.get("cuda") else ""]
        extra = ", ".join(b for b in bits if b)
        date = self.data.get("date", "an unknown date")
        return (f"Recorded GPU results: {gpu}{f' ({extra})' if extra else ''}, {date}, by "
                f"{self.data.get('script', 'a GPU test script')} -- not measured on this "
                "machine.")

    def __getitem__(self, key):
        return self.data[key]

    def get(self, key, default=None):
        return self.data.get(key, default)

    def text(self) -> str:
        return self.label


def results_dir() -> Path:
    """The recorded GPU results folder: ``$GPU_LESSONS_RESULTS_DIR`` if set, else
    ``tests/gpu/results`` of this checkout (what is committed)."""
    override = os.environ.get(RESULTS_ENV, "").strip()
    return Path(override).expanduser() if override else RESULTS_DIR


def recorded_gpu_results(name: str = "memory", *, directory=None) -> RecordedGpuResults | None:
    """The results a GPU test script recorded under ``name``, or None if there are none.

    Args:
        name: the results file's name without ``.json`` ("memory" for tests/gpu's memory
            script).
        directory: where to look (default: :func:`results_dir`, ``tests/gpu/results`` of
            this checkout unless ``$GPU_LESSONS_RESULTS_DIR`` names another folder).

    Returns:
        A :class:`RecordedGpuResults` (``label``, ``hardware``, ``data``), or None when the
        file does not exist (no GPU run recorded yet). A file that exists but is not a
        results file raises ValueError.
    """
    if not _NAME.fullmatch(text(name, "name", longest=100)):
        raise ValueError(f"name must be a lowercase file stem such as 'memory', got {name!r}")
    if directory is not None and not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a folder path, got {type(directory).__name__}")
    path = (results_dir() if directory is None else Path(directory)) / f"{name}.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path.name} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ValueError(f"{path.name} is not a recorded GPU results file (kind {KIND!r})")
    return RecordedGpuResults(name=name, path=path, data=data)
