"""Load a file of scripts/ as a module: the scripts are not a package, and their tests (unit,
rehearsal, GPU) import them by path. ``pyproject.toml`` puts tests/ on ``sys.path``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str, module_name: str | None = None) -> ModuleType:
    """``scripts/<name>.py`` run as a fresh module named ``module_name`` (default ``name``),
    registered in ``sys.modules`` under that name (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(module_name or name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
