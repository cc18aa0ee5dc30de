"""pytest configuration shared by the unit tests and the nbval notebook tests.

For notebooks (``pytest --nbval lessons solutions``) it:

* runs kernels headless, with the same settings ``make outputs`` uses
  (helpers.authoring.build), so the stored outputs are exactly what the tests see;
* reads each notebook kernel's peak memory (VmHWM) just before the kernel stops, reports it
  per notebook and fails the run if one exceeds the Binder-sized budget;
* reports how many code cells with output are compared and how many are ignored;
* runs the learner copies (``lessons/``) under other CPU kernels than ``solutions/``
  (``ATEN_CPU_CAPABILITY``, see :func:`other_cpu_kernels`), so an output that depends on
  which kernels ran (a rounding error printed to two digits) fails here, not on the next
  machine. Both copies print the same figures, so every compared cell is compared under two
  CPU capabilities in one run, at no extra cost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers.authoring.build import KERNEL_ENV, kernel_peak_rss_mib

try:  # property tests (tests/unit/**/test_*properties*): the same examples on every run
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci", derandomize=True, deadline=None, database=None, max_examples=60,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
    settings.register_profile("explore", deadline=None, max_examples=1000)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # nbval-only environments
    pass

# 1.5 GiB: a Binder-sized machine. The GPU test mode (scripts/gpu_check.py) states its own
# host-memory budget for CUDA kernels and passes it down in GPU_LESSONS_KERNEL_BUDGET_MIB.
KERNEL_PEAK_BUDGET_MIB = int(os.environ.get("GPU_LESSONS_KERNEL_BUDGET_MIB", "1536"))
ROOT = Path(__file__).resolve().parent

# the kernel settings of `make outputs` in every kernel started from this process (nbval's
# kernels inherit os.environ; pytest sets PYTEST_CURRENT_TEST itself)
os.environ.update({k: v for k, v in KERNEL_ENV.items() if k != "PYTEST_CURRENT_TEST"})

_peaks: dict[str, float] = {}


def other_cpu_kernels(cpu_flags: str | None = None) -> dict[str, str]:
    """Environment for a kernel that computes with other CPU kernels than this machine's best.

    PyTorch picks its vectorised kernels by ``ATEN_CPU_CAPABILITY`` (default, avx2, avx512),
    and reductions then round differently. On a CPU with AVX-512 the other capability is
    AVX2; below that, the plain (``default``) kernels. oneDNN's ``ONEDNN_MAX_CPU_ISA`` is
    left alone: capped to AVX2 on a CPU that has AVX512-BF16, TensorFlow (which reads the
    CPU's flags itself) aborts in lesson 07's bf16 child process ("could not create a
    primitive descriptor for the inner product"), which no real AVX2 machine does.
    """
    if cpu_flags is None:
        try:
            cpu_flags = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpu_flags = ""
    return {"ATEN_CPU_CAPABILITY": "avx2" if "avx512f" in cpu_flags.split() else "default"}


def _notebook_folder(item) -> str | None:
    """'lessons' or 'solutions' for a notebook cell of the kit, else None."""
    parent = getattr(item, "parent", None)
    if type(item).__name__ != "IPyNbCell" or parent is None:
        return None
    folder = Path(str(parent.fspath)).resolve().parent
    return folder.name if folder in (ROOT / "lessons", ROOT / "solutions") else None


def _is_learner_copy(item) -> bool:
    return _notebook_folder(item) == "lessons"


_inductor_caches: list[str] = []


def kernel_environment(item) -> dict[str, str]:
    """What a notebook kernel of this session starts with beyond this process's environment.

    Learner copies get the other CPU kernels (unless ATEN_CPU_CAPABILITY is set already: a
    run under one capability). Each capability gets its own torch.compile cache in a folder
    of this session: lesson 09's compiled kernels, cached under one capability and loaded
    under another, corrupted the heap of the kernel that loaded them ("free(): corrupted
    unsorted chunks", torch 2.13 on this project's CPUs).
    """
    if _notebook_folder(item) is None:
        return {}
    env = {}
    if _is_learner_copy(item) and "ATEN_CPU_CAPABILITY" not in os.environ:
        env.update(other_cpu_kernels())
    if not _inductor_caches:
        import tempfile

        _inductor_caches.append(tempfile.mkdtemp(prefix="gpu-lessons-inductor-"))
    capability = env.get("ATEN_CPU_CAPABILITY") or os.environ.get("ATEN_CPU_CAPABILITY",
                                                                  "native")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(_inductor_caches[0]) / capability)
    return env


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """A notebook's kernel starts (in its first cell's set-up) with kernel_environment(item);
    the settings of this process are put back after."""
    extra = kernel_environment(item)
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _kernel_pid(ipynb_file) -> int | None:
    kernel = getattr(ipynb_file, "kernel", None)
    km = getattr(kernel, "km", None)
    provisioner = getattr(km, "provisioner", None)
    process = getattr(provisioner, "process", None)
    return getattr(process, "pid", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    parent = getattr(item, "parent", None)
    last_cell = type(item).__name__ == "IPyNbCell" and (
        nextitem is None or getattr(nextitem, "parent", None) is not parent
    )
    if last_cell:
        pid = _kernel_pid(parent)
        peak = kernel_peak_rss_mib(pid) if pid else None
        if peak is not None:
            item.user_properties.append(("kernel_peak_mib", round(peak, 1)))
    yield


def pytest_runtest_logreport(report):
    for key, value in getattr(report, "user_properties", []):
        if key == "kernel_peak_mib":
            notebook = report.nodeid.split("::")[0]
            _peaks[notebook] = value


def cell_counts(paths) -> dict[str, tuple[int, int]]:
    """Per notebook: (code cells with stored output that nbval compares, ignored ones)."""
    counts = {}
    for path in paths:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
        compared = ignored = 0
        for cell in nb["cells"]:
            if cell["cell_type"] != "code" or not cell.get("outputs"):
                continue
            cell_tags = set(cell.get("metadata", {}).get("tags", []))
            if cell_tags & {"nbval-ignore-output", "nbval-skip"}:
                ignored += 1
            else:
                compared += 1
        counts[str(Path(path).relative_to(ROOT))] = (compared, ignored)
    return counts


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _peaks:
        return
    tr = terminalreporter
    tr.section("notebook kernels: peak memory and compared cells")
    counts = cell_counts(ROOT / p for p in sorted(_peaks))
    total_c = total_i = 0
    for nb in sorted(_peaks):
        compared, ignored = counts.get(nb, (0, 0))
        total_c += compared
        total_i += ignored
        flag = "  OVER BUDGET" if _peaks[nb] > KERNEL_PEAK_BUDGET_MIB else ""
        tr.write_line(
            f"{nb:45s} peak {_peaks[nb]:7.1f} MiB   cells compared {compared:3d} "
            f"ignored {ignored:3d}{flag}"
        )
    share = total_c / max(1, total_c + total_i)
    tr.write_line(
        f"total: {total_c} compared, {total_i} ignored ({share:.0%} of code cells with output "
        f"compared); kernel budget {KERNEL_PEAK_BUDGET_MIB} MiB"
    )


def pytest_sessionfinish(session, exitstatus):
    if _inductor_caches:  # the kernels have stopped: their compile caches go
        import shutil

        shutil.rmtree(_inductor_caches.pop(), ignore_errors=True)
    over = {nb: mib for nb, mib in _peaks.items() if mib > KERNEL_PEAK_BUDGET_MIB}
    if over and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        for nb, mib in over.items():
            print(f"\nFAIL: {nb} kernel peaked at {mib:.0f} MiB > {KERNEL_PEAK_BUDGET_MIB} MiB")
