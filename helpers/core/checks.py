"""Argument checks: every public helper validates its input here, so bad input gets one clear
error that names the argument and what is accepted.

The rule, everywhere in the kit:

* ``TypeError`` when the value is of the wrong *kind*: a string where a number is wanted, a
  ``bool`` where a count is wanted (``True`` is an ``int`` to Python, never to us), a float
  where a whole number is wanted, anything that is not a device where a device is wanted;
* ``ValueError`` when the kind is right but the value is not accepted: out of range, not
  finite, too large to be meant, an unknown name, a device this machine does not have.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

__all__ = ["whole_number", "positive_int", "real_number", "choice", "flag", "text",
           "device_arg", "shown", "LARGEST"]

# the largest count or size any helper accepts: far above any real batch, step count or byte
# count (2**62 bytes is 4 EiB), far below what overflows a C long or a float's exact integers
LARGEST = 2**62


def whole_number(value, name: str, minimum: int = 0, maximum: int = LARGEST) -> int:
    """``value`` as an ``int``: TypeError unless a whole number (Python or NumPy, not a bool),
    ValueError outside ``minimum``..``maximum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number, got {type(value).__name__}: "
                        f"{shown(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {shown(value)}")
    if value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {shown(value)}")
    return int(value)


def positive_int(value, name: str, maximum: int = LARGEST) -> int:
    """A whole number >= 1 (see :func:`whole_number`)."""
    return whole_number(value, name, 1, maximum)


def real_number(value, name: str, minimum: float | None = None, maximum: float | None = None,
                *, above: bool = False, finite: bool = True) -> float:
    """``value`` as a ``float``: TypeError unless a real number (int, float, NumPy, Fraction;
    not a bool), ValueError if NaN, infinite (unless ``finite=False``, which also turns a
    number beyond a float's range into an infinity), below ``minimum`` (or equal to it with
    ``above=True``) or above ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer or Fraction beyond a float's range
        if finite:
            raise ValueError(f"{name} is too large: {shown(value)}") from None
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number) or (finite and math.isinf(number)):
        word = "finite number" if finite else "number, not NaN"
        raise ValueError(f"{name} must be a {word}, got {shown(value)}")
    if minimum is not None and (number < minimum or (above and number == minimum)):
        word = "greater than" if above else "at least"
        raise ValueError(f"{name} must be {word} {minimum}, got {shown(value)}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {shown(value)}")
    return number


def choice(value, name: str, options: Iterable[str]) -> str:
    """``value`` if it is one of ``options`` (strings): TypeError for a non-string,
    ValueError for an unknown one."""
    options = list(options)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {options}, got {type(value).__name__}: "
                        f"{shown(value)}")
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {shown(value)}")
    return value


def flag(value, name: str) -> bool:
    """``value`` if it is ``True`` or ``False`` (NumPy bools too), else TypeError."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}: "
                        f"{shown(value)}")
    return bool(value)


def text(value, name: str, *, empty: bool = False, longest: int = 10_000) -> str:
    """``value`` if it is a ``str`` (TypeError otherwise), not empty unless ``empty=True`` and
    at most ``longest`` characters (ValueError)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}: {shown(value)}")
    if not empty and not value.strip():
        raise ValueError(f"{name} must not be empty")
    if len(value) > longest:
        raise ValueError(f"{name} is too long ({len(value)} characters, at most {longest})")
    return value


def device_arg(value, name: str):
    """A ``torch.device`` for ``value`` (a string such as ``"cuda:0"`` or a ``torch.device``)
    that this machine has: TypeError for anything else, ValueError for a malformed string or
    a device that is not here (``"cuda"`` without CUDA, ``"cuda:3"`` on a 2-GPU machine).
    ``meta`` is accepted (the lessons use it as a stand-in device)."""
    import torch

    if not isinstance(value, (str, torch.device)):
        raise TypeError(f"{name} must be a device such as 'cpu' or 'cuda:0', got "
                        f"{type(value).__name__}: {shown(value)}")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{name} is not a device name: {shown(value)} (examples: 'cpu', "
                         f"'cuda', 'cuda:1', 'mps')") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{name} is {shown(value)}, but this machine has no usable CUDA "
                             f"GPU (torch.cuda.is_available() is False)")
        if device.index is not None and device.index >= count:
            raise ValueError(f"{name} is {shown(value)}, but this machine has {count} CUDA "
                             f"GPU(s): indices 0..{count - 1}")
    elif device.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(f"{name} is {shown(value)}, but MPS is not available here")
    elif device.type not in ("cpu", "meta"):
        raise ValueError(f"{name} is {shown(value)}: the lessons run on 'cpu', 'cuda' or "
                         f"'mps'")
    return device


def shown(value, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a 100,000-character string or a 5,000-digit
    integer must not fill the error message; Python refuses to print the latter at all)."""
    try:
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
            return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
        shown = repr(value)
    except Exception:  # noqa: BLE001 -- a broken __repr__ must not hide the real error
        shown = f"<{type(value).__name__}>"
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


_short = shown  # the earlier private name
