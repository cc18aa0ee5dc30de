"""Run the lessons where TensorFlow is absent: its cells print why they were skipped.

Convention (CONTRIBUTING.md): every code cell of solutions/*.ipynb that needs TensorFlow or Keras
(imports it, or uses a name such a cell defined) carries the cell tag ``tensorflow``;
``make lessons`` copies tags into lessons/. A GPU node that has PyTorch but no TensorFlow (or
``gpu_check.py --hide-tensorflow``) then runs every other cell unchanged:

    from tf_cells import kernel_python, skip_tensorflow_cells, tensorflow_available
    if not tensorflow_available(env, python=kernel_python("gpu-lessons-tf"))[0]:
        skip_tensorflow_cells(nb, reason="TensorFlow is not installed")

``python scripts/tf_cells.py`` lists the tagged cells of every solutions notebook.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

TAG = "tensorflow"
DEFAULT_REASON = "TensorFlow is not installed"
MODULES = ("tensorflow", "keras")

_PROBE = ("import importlib.util as u, sys; "
          "sys.exit(0 if u.find_spec('tensorflow') is not None else 3)")


def _check_notebook(nb, argument: str = "nb") -> None:
    cells = getattr(nb, "cells", None) if not isinstance(nb, dict) else nb.get("cells")
    if not isinstance(cells, list):
        raise TypeError(f"{argument} must be a notebook (nbformat.NotebookNode with cells), "
                        f"got {type(nb).__name__}")


def tensorflow_cells(nb) -> list[int]:
    """Indices of the code cells tagged ``tensorflow``."""
    _check_notebook(nb)
    return [i for i, cell in enumerate(nb["cells"])
            if cell.get("cell_type") == "code"
            and TAG in (cell.get("metadata", {}).get("tags") or [])]


def skip_line(reason: str = DEFAULT_REASON) -> str:
    """The one-line source that replaces a TensorFlow cell."""
    return f"print({f'skipped: {reason} (this cell needs TensorFlow)'!r})"


def skip_tensorflow_cells(nb, reason: str = DEFAULT_REASON) -> list[int]:
    """Replace each tagged code cell's source by a print of why it is skipped, in place.

    The cell keeps its id and metadata; its stored outputs are cleared. Returns the indices
    replaced.
    """
    _check_notebook(nb)
    if not isinstance(reason, str) or not reason.strip() or "\n" in reason:
        raise ValueError(f"reason must be a non-empty one-line string, got {reason!r}")
    indices = tensorflow_cells(nb)
    for i in indices:
        cell = nb["cells"][i]
        cell["source"] = skip_line(reason)
        cell["outputs"] = []
        cell["execution_count"] = None
    return indices


def kernel_python(name: str) -> str:
    """The interpreter Jupyter starts for the kernel ``name``: its kernelspec's ``argv[0]``,
    substituted as jupyter_client does (``python``, ``python3``, ``python3.X``: this
    interpreter; ``{prefix}``, ``{resource_dir}``). A bare command name is looked up on the
    kernel environment's PATH when it starts, as by ``tensorflow_available``.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a Jupyter kernel name (str), got {type(name).__name__}")
    if not name.strip():
        raise ValueError(f"name must be a non-empty Jupyter kernel name, got {name!r}")
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(name)
    first = spec.argv[0] if spec.argv else "python"
    major, minor = sys.version_info[:2]
    if first in {"python", f"python{major}", f"python{major}.{minor}"}:
        return sys.executable
    return first.replace("{prefix}", sys.prefix).replace("{resource_dir}", spec.resource_dir)


def tensorflow_available(env: dict | None = None,
                         python: str | os.PathLike | None = None) -> tuple[bool, str]:
    """Whether ``import tensorflow`` can find TensorFlow, and a one-line reason.

    Without ``env`` and ``python``: this interpreter (``importlib.util.find_spec``). Otherwise
    a child process of ``python`` (default: this interpreter; a kernel's: ``kernel_python``)
    run with ``env`` (default: this process's environment), as a kernel started that way would
    see it (a sitecustomize on its PYTHONPATH that hides TensorFlow included). An interpreter
    that cannot be started counts as no TensorFlow, with the reason.
    """
    if python is not None:
        if not isinstance(python, (str, os.PathLike)):
            raise TypeError(f"python must be the path or command name of a Python interpreter, "
                            f"got {type(python).__name__}")
        if not os.fspath(python).strip():
            raise ValueError(f"python must be the path or command name of a Python "
                             f"interpreter, got {python!r}")
    if env is None and python is None:
        try:
            found = importlib.util.find_spec("tensorflow") is not None
        except (ImportError, ValueError) as exc:
            return False, f"TensorFlow cannot be found ({type(exc).__name__}: {exc})"
    else:
        if env is not None and not isinstance(env, dict):
            raise TypeError(f"env must be a dict of environment variables, got "
                            f"{type(env).__name__}")
        interpreter = os.fspath(python) if python is not None else sys.executable
        try:
            done = subprocess.run([interpreter, "-c", _PROBE], env=env, capture_output=True,
                                  text=True, timeout=120)
        except OSError as exc:  # the kernel could not start either: its step fails
            return False, f"the TensorFlow probe cannot run {interpreter} ({exc})"
        if done.returncode not in (0, 3):
            return False, (f"the TensorFlow probe failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-300:]}")
        found = done.returncode == 0
    if found:
        return True, "TensorFlow is installed"
    return False, "TensorFlow is not installed (or hidden)"


def main(argv: list[str] | None = None) -> None:
    import argparse

    import nbformat

    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(
        description="List the code cells tagged 'tensorflow' in each lesson notebook: the "
                    "cells the GPU check skips, with a printed reason, where TensorFlow is "
                    "not installed.")
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to read (default: solutions/NN_*.ipynb)")
    args = parser.parse_args(argv)
    for path in args.notebooks or sorted((root / "solutions").glob("[0-9]*.ipynb")):
        cells = tensorflow_cells(nbformat.read(path, as_version=4))
        print(f"{path.name}: {len(cells)} cells tagged {TAG!r}: {cells}")


if __name__ == "__main__":
    main()
