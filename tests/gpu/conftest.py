"""tests/gpu: a GPU that NVML sees but torch cannot use is a FAILURE, never a quiet skip.

helpers.core.gpu_visibility compares NVML's GPUs with torch.cuda's once per session:

* broken (driver too old for the wheel's CUDA, CPU-only torch, unsupported GPU...): every test
  in tests/gpu fails with the verdict's message (cause and fix);
* hidden on purpose (CUDA_VISIBLE_DEVICES, SLURM job without GPUs, MIG) or no GPU: the tests
  that need CUDA skip, and their skip reason names the verdict;
* usable: nothing changes.

The verdict is printed in the session header.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import helpers.core.gpu_visibility as _gv

HERE = Path(__file__).resolve().parent
_verdict: list = []


def visibility():
    """This session's verdict (computed once; module attribute so tests can replace it)."""
    if not _verdict:
        _verdict.append(_gv.gpu_visibility())
    return _verdict[0]


def _in_here(item) -> bool:
    return Path(str(item.fspath)).resolve().is_relative_to(HERE)


def pytest_report_header(config):
    return str(visibility())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the tests' own skipif(no CUDA) markers: a broken GPU setup fails every test."""
    if _in_here(item) and visibility().broken:
        pytest.fail(f"{visibility()}", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    verdict = visibility()
    if (report.skipped and _in_here(item) and not verdict.usable
            and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3):
        path, line, reason = report.longrepr
        report.longrepr = (path, line, f"{reason} [{verdict}]")
