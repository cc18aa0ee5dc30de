"""Where is this code running?  Detected once, used by every widget and progress bar.

Three modes:

* ``"jupyter"``  – an IPython kernel with a live front end (JupyterLab, Notebook 7, VS Code);
* ``"headless"`` – an IPython kernel without one (nbval, nbclient, ``make outputs``);
* ``"script"``   – plain Python (``python script.py``, pytest unit tests, torchrun workers).

Headless kernels are recognised from the environment: ``GPU_LESSONS_HEADLESS=1`` (set by
``make outputs`` and the notebook tests) or ``PYTEST_CURRENT_TEST`` (set by pytest, which
nbval's kernels inherit).  Widgets fall back to stable plain text there, so stored outputs
are exactly what the tests see.
"""

from __future__ import annotations

import os
import sys

__all__ = ["MODE", "headless", "in_kernel", "mode"]


def in_kernel() -> bool:
    """True inside an IPython kernel (not a terminal IPython, not plain Python)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def _detect() -> str:
    if not in_kernel():
        return "script"
    if os.environ.get("GPU_LESSONS_HEADLESS") == "1" or "PYTEST_CURRENT_TEST" in os.environ:
        return "headless"
    return "jupyter"


MODE = _detect()


def mode() -> str:
    """The mode detected when helpers was imported: "jupyter", "headless" or "script"."""
    return MODE


def headless() -> bool:
    """True when nobody is watching live output (headless kernel or plain script)."""
    return MODE != "jupyter"
