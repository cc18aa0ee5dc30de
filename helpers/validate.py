"""Argument checks shared by the helpers modules (bad input gets a clear error)."""

from __future__ import annotations

import numbers

__all__ = ["positive_int"]


def positive_int(value, name: str) -> int:
    """``value`` as an int if it is a whole number >= 1 (Python or NumPy), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
