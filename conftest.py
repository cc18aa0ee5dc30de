"""pytest configuration shared by the unit tests and the nbval notebook tests.

For notebooks (``pytest --nbval lessons solutions``) it:

* runs kernels headless, with the same settings ``make outputs`` uses
  (helpers.authoring.build), so the stored outputs are exactly what the tests see;
* reads each notebook kernel's peak memory (VmHWM) just before the kernel stops, reports it
  per notebook and fails the run if one exceeds the Binder-sized budget;
* reports how many code cells with output are compared and how many are ignored.
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
    over = {nb: mib for nb, mib in _peaks.items() if mib > KERNEL_PEAK_BUDGET_MIB}
    if over and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        for nb, mib in over.items():
            print(f"\nFAIL: {nb} kernel peaked at {mib:.0f} MiB > {KERNEL_PEAK_BUDGET_MIB} MiB")
