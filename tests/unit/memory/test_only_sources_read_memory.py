"""Only helpers/memory/sources.py reads memory counters.

Every "how much memory is in use" question goes through a ``helpers.memory.sources``
source, so there is one place that knows how each counter behaves (CUDA's caching
allocator, TensorFlow's statistics, psutil, NVML).  This test walks every module of
``helpers/`` and fails on a call of a memory-reading API anywhere else.

The one exception: ``helpers/core/nvml.py`` is the NVML binding that *defines*
``gpu_memory``, so it may call ``nvmlDeviceGetMemoryInfo`` (it is the counter itself, not
a reader of it; ``NvmlSource`` reads it through ``gpu_memory``).
"""

from __future__ import annotations

import ast
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[3] / "helpers"

# torch.cuda's allocator statistics and the driver's free/total
TORCH = {"memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
         "memory_stats", "reset_peak_memory_stats", "mem_get_info"}
# TensorFlow's allocator statistics (tf.config.experimental.*)
TENSORFLOW = {"get_memory_info", "reset_memory_stats"}
# psutil's Process.memory_info; helpers' NVML reader; NVML itself
OTHER = {"memory_info", "gpu_memory", "nvmlDeviceGetMemoryInfo"}
READERS = TORCH | TENSORFLOW | OTHER

ALLOWED = {
    "memory/sources.py": READERS,
    "core/nvml.py": {"nvmlDeviceGetMemoryInfo"},  # the binding that defines gpu_memory
}


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def memory_reads(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    return [(node.lineno, name) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and (name := _called_name(node)) in READERS]


def test_only_sources_read_memory():
    found = []
    for path in sorted(HELPERS.rglob("*.py")):
        rel = path.relative_to(HELPERS).as_posix()
        allowed = ALLOWED.get(rel, set())
        found += [f"helpers/{rel}:{line}: {name}()" for line, name in memory_reads(path)
                  if name not in allowed]
    assert not found, ("memory counters read outside helpers/memory/sources.py (use a "
                       "MemorySource):\n" + "\n".join(found))


def test_the_walker_sees_calls(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import torch\nx = torch.cuda.memory_allocated(0)\n"
                      "def f(tf):\n    return tf.config.experimental.get_memory_info('GPU:0')\n"
                      "def memory_allocated():\n    pass\n")
    assert memory_reads(sample) == [(2, "memory_allocated"), (4, "get_memory_info")]
