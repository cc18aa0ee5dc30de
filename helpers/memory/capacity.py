"""GPU memory capacities: ``parse_capacity("48GB")`` and the cards the kit knows by name.

A capacity is one of

* a whole number of bytes (``int``, or a float with no fractional part such as ``48e9``);
* a string with a unit: decimal ``B, KB, MB, GB, TB`` (powers of 1000, how cards are sold) or
  binary ``KiB, MiB, GiB, TiB`` (powers of 1024, how programs count), e.g. ``"48GB"``,
  ``"48 GiB"``, ``"1.5 TiB"``; units are case-insensitive, a bare ``G``/``M``/``K`` is refused
  because it could mean either;
* a known card name (``KNOWN_GPUS``), e.g. ``"L40S"`` or ``"A100-80GB"``.  Vendor spellings
  work too (``"NVIDIA A100-SXM4-80GB"``, ``"Tesla V100-PCIE-32GB"``, ``"NVIDIA H100 80GB
  HBM3"``), so ``torch.cuda.get_device_name()`` can be passed straight in.  A name that fits
  several cards (``"A100"``) is refused with the choices.

A card's capacity is the total its driver reports (``nvidia-smi``'s ``Memory-Usage`` total,
NVML's ``total``), not the marketing figure: an "L40S 48GB" shows 46068 MiB (44.99 GiB).
"""

from __future__ import annotations

import math
import numbers
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from types import MappingProxyType

from ..core.checks import LARGEST, flag, shown

__all__ = ["KNOWN_GPUS", "GPU_NOTES", "COMPUTE_CAPABILITY", "PINNED_TORCH_NEEDS",
           "pinned_torch_runs_on", "parse_capacity", "resolve_capacity", "card_name"]

MiB = 1024**2

# Totals as nvidia-smi / NVML report them (MiB).  Sources: nvidia-smi tables published with
# the card names below (NVIDIA driver 470-580 era), cross-checked across several machines;
# Modal's list of nvidia-smi totals for H100, A100 40/80GB, L40S and T4 (modal-client PR 2797).
# PCIe and SXM variants of the same card report the same total.
_TOTALS_MIB = {
    "T4": 15360,
    "V100-16GB": 16160,
    "V100-32GB": 32510,
    "A100-40GB": 40960,
    "L40S": 46068,
    "H100-80GB": 81559,
    "A100-80GB": 81920,
    "H200": 143771,
}

#: Known cards: name -> capacity in bytes (what the driver reports), smallest first.
KNOWN_GPUS = MappingProxyType({name: mib * MiB for name, mib in _TOTALS_MIB.items()})

#: Compute capability of each known card (NVIDIA's "CUDA GPUs" table).
COMPUTE_CAPABILITY = MappingProxyType({
    "T4": (7, 5), "V100-16GB": (7, 0), "V100-32GB": (7, 0), "A100-40GB": (8, 0),
    "L40S": (8, 9), "H100-80GB": (9, 0), "A100-80GB": (8, 0), "H200": (9, 0),
})

#: What a real GPU needs for the pinned torch (2.13; PyPI's Linux wheels are CUDA 13 builds,
#: which have no Maxwell, Pascal or Volta code and need an R580 driver).
PINNED_TORCH_NEEDS = MappingProxyType({"compute_capability": (7, 5), "driver": 580})

_CANNOT_RUN = ("; cannot run torch 2.13's CUDA 13 wheels (compute capability 7.0, they need "
               "7.5 or newer): simulate it with VirtualGPU, or use an older torch")

#: One line per card: what it is sold as and what the driver reports (and, for cards the
#: pinned torch cannot drive, that it cannot).
GPU_NOTES = MappingProxyType({
    "T4": "Tesla T4, sold as 16 GB; nvidia-smi shows 15360 MiB",
    "V100-16GB": "Tesla V100 16GB (SXM2/PCIe); nvidia-smi shows 16160 MiB" + _CANNOT_RUN,
    "V100-32GB": ("Tesla V100 32GB (SXM2/PCIe, also V100S); nvidia-smi shows 32510 MiB"
                  + _CANNOT_RUN),
    "A100-40GB": "A100 40GB (SXM4/PCIe); nvidia-smi shows 40960 MiB",
    "L40S": "L40S, sold as 48 GB; nvidia-smi shows 46068 MiB",
    "H100-80GB": "H100 80GB (SXM5 HBM3/PCIe); nvidia-smi shows 81559 MiB",
    "A100-80GB": "A100 80GB (SXM4/PCIe); nvidia-smi shows 81920 MiB",
    "H200": "H200 (SXM/NVL), sold as 141 GB; nvidia-smi shows 143771 MiB",
})

# marketing sizes a learner may attach to single-variant cards ("L40S 48GB", "H200 141GB")
_MARKETING_GB = {"T4": 16, "L40S": 48, "H200": 141}
# cards that exist in several memory sizes: a bare model name is ambiguous
_VARIANTS = {
    "A100": ("A100-40GB", "A100-80GB"),
    "V100": ("V100-16GB", "V100-32GB"),
    "V100S": ("V100-32GB",),
    "H100": ("H100-80GB",),  # also 94 GB (NVL) and 96 GB (GH200): the size must be given
}
_VENDOR_TOKENS = {"NVIDIA", "TESLA", "GEFORCE"}
_FORM_TOKENS = {"SXM", "SXM2", "SXM3", "SXM4", "SXM5", "PCIE", "HBM2", "HBM2E", "HBM3",
                "HBM3E", "NVL", "DGXS"}

_DECIMAL_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BINARY_UNITS = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_UNITS = {**_DECIMAL_UNITS, **_BINARY_UNITS, "BYTES": 1, "BYTE": 1}
_AMBIGUOUS_UNITS = {"K": "KB or KiB", "M": "MB or MiB", "G": "GB or GiB", "T": "TB or TiB"}
_NUMBER_UNIT = re.compile(r"^\s*(\d[\d_]*(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")

ACCEPTED = (
    "a whole number of bytes (e.g. 48_000_000_000), a size with a unit such as '48GB' "
    "(10^9 bytes) or '48 GiB' (2^30 bytes) -- units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB -- "
    f"or a known card: {', '.join(_TOTALS_MIB)}"
)


def _tokens(name: str) -> list[str]:
    raw = re.split(r"[\s_\-/]+", name.strip().upper())
    out = []
    for tok in raw:
        if not tok or tok in _VENDOR_TOKENS or tok in _FORM_TOKENS:
            continue
        m = re.fullmatch(r"(\d+)\s*G(?:B|IB)?", tok)
        out.append(f"{m.group(1)}GB" if m else tok)
    return out


def card_name(name: str) -> str:
    """The canonical ``KNOWN_GPUS`` key for a card name; ValueError if unknown or ambiguous."""
    if not isinstance(name, str):
        raise TypeError(f"a card name must be a string, got {type(name).__name__}")
    toks = _tokens(name)
    key = "-".join(toks)
    if key in KNOWN_GPUS:
        return key
    if len(toks) == 2 and toks[0] in _MARKETING_GB and toks[1] == f"{_MARKETING_GB[toks[0]]}GB":
        return toks[0]
    if len(toks) == 1 and toks[0] in _VARIANTS:
        choices = _VARIANTS[toks[0]]
        which = (f"did you mean {choices[0]}?" if len(choices) == 1
                 else f"say which: {' or '.join(choices)}.")
        raise ValueError(
            f"{name!r} is ambiguous: that card is made with different amounts of memory; "
            f"{which} Known cards: {', '.join(_TOTALS_MIB)}."
        )
    if len(toks) == 2 and toks[0] == "V100S":
        return card_name(f"V100-{toks[1]}")
    raise ValueError(f"unknown GPU {name!r}. Accepted: {ACCEPTED}.")


def pinned_torch_runs_on(card: str) -> bool:
    """Can the pinned torch (2.13, CUDA 13 wheels) use a real ``card``?  Its memory can be
    simulated either way (``VirtualGPU("V100-32GB")``).  ValueError for unknown cards."""
    return COMPUTE_CAPABILITY[card_name(card)] >= PINNED_TORCH_NEEDS["compute_capability"]


def _from_number(value) -> int:
    if isinstance(value, numbers.Integral):
        return int(value)
    try:
        value = float(value)
    except OverflowError:  # a Fraction or Decimal beyond float's range
        value = math.inf
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"capacity must be a finite number of bytes, got {value!r}")
    if not value.is_integer():
        raise ValueError(
            f"capacity {value!r} is not a whole number of bytes; give an int or a string "
            "with a unit such as '1.5 GiB'"
        )
    return int(value)


def _from_string(text: str) -> tuple[str | None, int]:
    m = _NUMBER_UNIT.match(text)
    if m is None and re.match(r"^\s*-\s*[\d.]", text):
        raise ValueError(f"capacity must be more than 0 bytes, got {text!r}")
    if m is None:
        canonical = card_name(text)
        return canonical, KNOWN_GPUS[canonical]
    number, unit = m.group(1).replace("_", ""), m.group(2).upper()
    if not unit:
        raise ValueError(
            f"capacity {text!r} has no unit: write e.g. '{number}GB' (10^9 bytes) or "
            f"'{number}GiB' (2^30 bytes), or pass an int to mean bytes"
        )
    if unit in _AMBIGUOUS_UNITS:
        raise ValueError(
            f"unit {m.group(2)!r} in {text!r} is ambiguous: write {_AMBIGUOUS_UNITS[unit]} "
            "(decimal GB = 10^9 bytes as cards are sold, binary GiB = 2^30 as programs count)"
        )
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {m.group(2)!r} in {text!r}. Accepted: {ACCEPTED}.")
    try:
        amount = Decimal(number) * _UNITS[unit]
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
        raise ValueError(f"cannot read the number in {text!r}") from exc
    return None, int(amount.to_integral_value(rounding=ROUND_HALF_UP))


def resolve_capacity(value, *, what: str = "capacity", allow_zero: bool = False):
    """Like :func:`parse_capacity` but returns ``(card, n_bytes)``.

    ``card`` is the ``KNOWN_GPUS`` name when ``value`` names a card, else None.
    """
    if isinstance(value, (str, numbers.Real)) and not isinstance(value, bool):
        try:
            label, n_bytes = (_from_string(value) if isinstance(value, str)
                              else (None, _from_number(value)))
        except ValueError as exc:  # the message names the argument
            message = str(exc)
            raise ValueError(message if message.startswith(what) else f"{what}: {message}") \
                from None
    else:
        hint = " (a bool)" if isinstance(value, bool) else ""
        raise TypeError(
            f"{what} must be a number of bytes or a string, got "
            f"{type(value).__name__}{hint}: {value!r}. Accepted: {ACCEPTED}."
        )
    if n_bytes < 0 or (n_bytes == 0 and not allow_zero):
        least = "0 or more" if allow_zero else "more than 0"
        raise ValueError(f"{what} must be {least} bytes, got {shown(value)}")
    if n_bytes > LARGEST:
        raise ValueError(f"{what} is too large: at most {LARGEST} bytes (4 EiB), got "
                         f"{shown(value)}")
    return label, n_bytes


def parse_capacity(value, *, allow_zero: bool = False) -> int:
    """A GPU memory capacity in bytes, from bytes, ``"48GB"``, ``"48 GiB"`` or a card name.

    Args:
        value: an int (bytes), a string with a unit (``"48GB"`` = 48*10^9 bytes, ``"48 GiB"``
            = 48*2^30 bytes) or a known card (``"L40S"``, ``"A100-80GB"``, ...; see
            ``KNOWN_GPUS``). Fractions of a byte are rounded to the nearest byte.
        allow_zero: accept 0 (used for overheads such as ``context_bytes``).

    Returns:
        The number of bytes, an int.

    Raises:
        ValueError: zero, negative, unknown units or cards, ambiguous names like ``"A100"``
            (the message lists what is accepted). TypeError: not a number or string.
    """
    return resolve_capacity(value, allow_zero=flag(allow_zero, "allow_zero"))[1]
