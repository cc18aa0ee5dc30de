"""The notebook tests run the learner copies under other CPU kernels (root conftest.py):
which ones, and that they reach the kernel only for lessons/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _conftest():
    spec = importlib.util.spec_from_file_location("root_conftest_under_test",
                                                  ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_other_capability_is_below_this_cpus_best():
    other = _conftest().other_cpu_kernels
    assert other("fpu sse avx avx2 avx512f avx512bw amx_bf16") == {"ATEN_CPU_CAPABILITY": "avx2"}
    assert other("fpu sse avx avx2 fma") == {"ATEN_CPU_CAPABILITY": "default"}
    assert other("") == {"ATEN_CPU_CAPABILITY": "default"}
    assert set(other()) == {"ATEN_CPU_CAPABILITY"}  # this machine's /proc/cpuinfo


def test_only_learner_copies_get_them():
    conftest = _conftest()

    class File:
        def __init__(self, path):
            self.fspath = path

    class IPyNbCell:
        def __init__(self, path):
            self.parent = File(path)

    learner = IPyNbCell(ROOT / "lessons" / "05_batch_size.ipynb")
    solution = IPyNbCell(ROOT / "solutions" / "05_batch_size.ipynb")
    assert conftest._is_learner_copy(learner) and not conftest._is_learner_copy(solution)
    assert not conftest._is_learner_copy(File(ROOT / "lessons" / "05_batch_size.ipynb"))
    assert conftest.kernel_environment(File(ROOT / "lessons" / "x.ipynb")) == {}  # no cell
    other, native = conftest.kernel_environment(learner), conftest.kernel_environment(solution)
    assert other["ATEN_CPU_CAPABILITY"] in ("avx2", "default")
    assert "ATEN_CPU_CAPABILITY" not in native
    # a torch.compile cache per capability: one made under another crashed a kernel
    caches = {Path(other["TORCHINDUCTOR_CACHE_DIR"]), Path(native["TORCHINDUCTOR_CACHE_DIR"])}
    assert len(caches) == 2 and len({c.parent for c in caches}) == 1
    Path(conftest._inductor_caches.pop()).rmdir()
