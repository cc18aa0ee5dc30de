"""Which virtual GPU is active (importable without torch, so pollers can ask cheaply)."""

from __future__ import annotations

import threading

__all__ = ["current_virtual_gpu"]

_lock = threading.Lock()
_active = None  # the active VirtualGPU, shared by all threads (a widget poller reads it)


def current_virtual_gpu():
    """The :class:`helpers.VirtualGPU` whose ``with`` block is running, or None."""
    return _active


def _activate(gpu) -> None:
    global _active
    with _lock:
        if _active is not None:
            raise RuntimeError(
                f"a VirtualGPU ({_active.name}) is already active: virtual GPUs cannot be "
                "nested. Leave the first `with` block before starting another."
            )
        _active = gpu


def _deactivate(gpu) -> None:
    global _active
    with _lock:
        if _active is gpu:
            _active = None
