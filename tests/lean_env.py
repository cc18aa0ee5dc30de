"""Tests that need what only the full environment has: skip elsewhere, naming it; fail in CI.

The unit tests run in the full environment (``make setup``, CI) and in lean ones: the GPU
test mode over a cluster's Python (``make setup SITE=1``, ``.venv-site``), which has no
TensorFlow, JupyterLab or playwright (scripts/site_env.py never installs them). A test that
needs one of those calls :func:`require` (or :func:`missing` for other reasons) and is skipped
there with the reason. Under ``CI=true`` it fails instead, as the browser tests do
(tests/browser/conftest.py): CI is the full environment by construction, so a missing piece
there is a broken setup that a skip would hide. ``pyproject.toml`` puts tests/ on sys.path.
"""

from __future__ import annotations

import importlib.util
import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(reason: str) -> NoReturn:
    """Skip the calling test (or module) with ``reason``; under CI=true fail with it.

    The reason starts with the test's id: the summary line's location is this file. (Not
    while collecting: PYTEST_CURRENT_TEST may then be inherited, e.g. helpers.authoring.build's
    KERNEL_ENV that scripts/gpu_check.py passes to its steps.)"""
    test, _, phase = os.environ.get("PYTEST_CURRENT_TEST", "").rpartition(" (")
    if "::" in test and phase in ("setup)", "call)", "teardown)"):
        reason = f"{test}: {reason}"
    if in_ci():
        pytest.fail(f"CI=true (the full environment) but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str, why: str) -> None:
    """Skip (fail under CI=true) unless the top-level ``module`` is installed; ``why`` says
    what needs it. An installed module that fails to import is not skipped: import it."""
    if importlib.util.find_spec(module) is None:
        missing(f"{module} is not installed here: {why}")


_HIDING = '''
import sys

HIDDEN = {names!r}


class _Hide:
    """Wraps each import finder: the hidden modules and distributions are not found."""

    def __init__(self, finder):
        self._finder = finder

    def __getattr__(self, name):
        return getattr(self._finder, name)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN or not hasattr(self._finder, "find_spec"):
            return None
        return self._finder.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):
        find = getattr(self._finder, "find_distributions", None)
        for dist in find(*args, **kwargs) if find else ():
            if dist.metadata["Name"].lower().replace("-", "_") not in HIDDEN:
                yield dist


sys.meta_path[:] = [_Hide(finder) for finder in sys.meta_path]
'''


def hiding_sitecustomize(*names: str) -> str:
    """The text of a sitecustomize.py that makes ``names`` (top-level modules, distribution
    names with ``_`` for ``-``) unimportable and unlisted in a child process whose PYTHONPATH
    holds its folder: a lean environment, made from the full one."""
    return _HIDING.format(names=tuple(names))


def fake_kernelspec(jupyter_path, name: str, python) -> None:
    """Install the Jupyter kernel ``name``, started by the interpreter ``python`` (a script
    that changes what it sees), under ``jupyter_path``; point JUPYTER_PATH there to use it."""
    import json
    from pathlib import Path

    spec = Path(jupyter_path) / "kernels" / name
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"fake kernel {name}", "language": "python"}))
