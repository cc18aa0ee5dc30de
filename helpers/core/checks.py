"""Argument checks shared by the helpers modules (bad input gets a clear error)."""

from __future__ import annotations

import numbers

__all__ = ["positive_int", "whole_number"]


def positive_int(value, name: str) -> int:
    """``value`` as an int if it is a whole number >= 1 (Python or NumPy), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def whole_number(value, name: str, minimum: int) -> int:
    """``value`` as an int: TypeError unless a whole number (Python or NumPy, not a bool),
    ValueError below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number, got {type(value).__name__}: {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)
