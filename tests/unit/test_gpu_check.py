"""The GPU check's own logic, on the CPU: the checks it runs must be able to fail."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def memory_gpu():
    return _load(ROOT / "tests" / "gpu" / "test_memory_gpu.py", "memory_gpu_under_test")


def _virtual_oom(memory_gpu, capacity, grid=None):
    """oom_check with the virtual GPU on both sides (what --selftest-cpu compares, fast)."""
    kwargs = {} if grid is None else {"grid": grid}
    return memory_gpu.oom_check("mlp", capacity, real_fits=memory_gpu.fits_virtual, **kwargs)


def test_memory_gpu_oom_limit_lies_inside_the_grid(memory_gpu):
    """With the GPU check's cap and grid the MLP really runs out of memory inside the grid."""
    oom = _virtual_oom(memory_gpu, memory_gpu.OOM_CAPACITY)
    assert memory_gpu.limit_inside_grid(oom) == []
    assert oom["grid_first"] < oom["virtual_max_batch"] < oom["grid_last"]


def test_memory_gpu_old_cap_is_caught(memory_gpu):
    """The old 2 GiB cap never ran out of memory on the grid: the check now says so."""
    oom = _virtual_oom(memory_gpu, "2 GiB")
    assert oom["virtual_max_batch"] == oom["grid_last"] == 16384
    problems = memory_gpu.limit_inside_grid(oom)
    assert len(problems) == 2 and "not strictly inside the grid 64..16384" in problems[0]
