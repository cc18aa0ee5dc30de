"""Formatting numbers the way every lesson prints them.

Convention used throughout the kit (and by ``tests/sanitize.cfg``):

* exact quantities (bytes counted by the memory engine, batch sizes, shapes) print as they are:
  ``"12.50 MiB"``;
* *measured* quantities that change from run to run and machine to machine (times, rates,
  speed-ups) print with a leading tilde: ``"~3.1 ms"``, ``"~1,250 samples/s"``, ``"~1.8x"``.
  The notebook tests mask ``~<number>``, and learners read the tilde as "about".
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .checks import flag, real_number, text, whole_number

__all__ = ["KiB", "MiB", "GiB", "fmt_bytes", "fmt_mib", "fmt_gib", "fmt_seconds", "fmt_rate",
           "fmt_ratio", "Table", "ShownAsTable"]

KiB = 1024
MiB = 1024**2
GiB = 1024**3


def _number(value, name: str) -> float:
    """``value`` as a float to print: any real number (not a bool; TypeError otherwise), NaN a
    ValueError; a number beyond a float's range (``10**400``) prints as ``inf``."""
    return real_number(value, name, finite=False)


def _fixed(value: float, digits: int, grouping: str = "") -> str:
    """``value`` with ``digits`` decimals, in scientific notation from 1e15 up (no real size,
    time or rate is that large, but it should still print as one short number)."""
    if math.isfinite(value) and abs(value) >= 1e15:
        return f"{value:.{digits}e}"
    return f"{value:{grouping}.{digits}f}"


def _digits(digits) -> int:
    return whole_number(digits, "digits", 0, 15)


def fmt_bytes(n_bytes, digits: int = 2) -> str:
    """Bytes as a human-readable binary size: ``fmt_bytes(3 * 2**20) == '3.00 MiB'``.

    Every ``fmt_*`` takes any real number (int, float, NumPy, Fraction); NaN is a ValueError
    and anything else a TypeError naming the argument. Infinity (or an integer too large for a
    float) prints as ``inf``, numbers of 1e15 and more in the chosen unit in scientific
    notation (``1.00e+20 GiB``).
    """
    n = _number(n_bytes, "n_bytes")
    digits = _digits(digits)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{_fixed(n / size, digits)} {unit}"
    return f"{sign}{int(n)} B"


def fmt_mib(n_bytes, digits: int = 1) -> str:
    """Bytes in MiB, always in MiB (for columns of a table)."""
    return f"{_fixed(_number(n_bytes, 'n_bytes') / MiB, _digits(digits), ',')} MiB"


def fmt_gib(n_bytes, digits: int = 2) -> str:
    """Bytes in GiB, always in GiB."""
    return f"{_fixed(_number(n_bytes, 'n_bytes') / GiB, _digits(digits), ',')} GiB"


def fmt_seconds(seconds, digits: int = 3) -> str:
    """A *measured* duration with a tilde and a sensible unit: ``'~12.3 ms'``."""
    s = real_number(seconds, "seconds", 0, finite=False)
    digits = whole_number(digits, "digits", 1, 15)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale or unit == "µs":
            value = s / scale
            return f"~{_significant(value, digits)} {unit}"
    raise AssertionError("unreachable")


def _sig(value: float, digits: int) -> int:
    """Decimals needed to show ``digits`` significant digits of ``value``."""
    if value == 0 or not math.isfinite(value):
        return 0
    return max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))


def _significant(value: float, digits: int, zero_decimals: int = 0) -> str:
    """``value`` to ``digits`` significant digits; scientific notation where that would take
    more than 9 decimals (only absurdly small numbers) or the number is 1e15 or more."""
    decimals = _sig(value, digits) if value else zero_decimals
    if decimals > 9:
        return f"{value:.{digits - 1}e}"
    return _fixed(value, decimals)


def fmt_rate(per_second, unit: str = "samples/s") -> str:
    """A *measured* throughput with a tilde: ``'~1,234 samples/s'``."""
    r = real_number(per_second, "per_second", 0, finite=False)
    unit = text(unit, "unit", empty=True, longest=100)  # "" when a column header says it
    if r >= 100:
        return f"~{_fixed(r, 0, ',')} {unit}"
    return f"~{_significant(r, 3)} {unit}"


def fmt_ratio(ratio, digits: int = 2, measured: bool = True) -> str:
    """A ratio as ``'~1.83x'`` (measured, masked in tests) or ``'0.52x'`` (exact)."""
    r = _number(ratio, "ratio")
    tilde = "~" if flag(measured, "measured") else ""
    return f"{tilde}{_fixed(r, _digits(digits))}x"


@dataclass
class Table:
    """A small table that prints as aligned text and renders as HTML in notebooks.

    >>> Table(["batch", "peak"], [[32, "1.00 GiB"], [64, "2.00 GiB"]])
    """

    headers: Sequence[str]
    rows: Sequence[Sequence[object]]
    title: str | None = None

    def __post_init__(self):
        self.headers = [str(h) for h in _iterable(self.headers, "headers")]
        self.rows = [list(_iterable(r, f"row {i}"))
                     for i, r in enumerate(_iterable(self.rows, "rows"))]
        if self.title is not None:
            self.title = text(self.title, "title", empty=True)
        self._check_rows()

    def _check_rows(self) -> None:
        """Every row has one cell per header (checked again when shown: rows is a list)."""
        for i, row in enumerate(self.rows):
            if len(row) != len(self.headers):
                raise ValueError(
                    f"row {i} has {len(row)} cells but there are {len(self.headers)} headers"
                )

    @staticmethod
    def _cell(value) -> str:
        if isinstance(value, float):
            return f"{value:,.3g}"
        return str(value)

    def _numeric(self, col: int) -> bool:
        return all(isinstance(r[col], (int, float)) for r in self.rows)

    def text(self) -> str:
        self._check_rows()
        cells = [[self._cell(v) for v in row] for row in self.rows]
        widths = [
            max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(self.headers)
        ]

        numeric = [bool(self.rows) and self._numeric(i) for i in range(len(self.headers))]

        def line(values):
            out = [v.rjust(w) if num else v.ljust(w)
                   for v, w, num in zip(values, widths, numeric, strict=True)]
            return "  ".join(out).rstrip()

        parts = []
        if self.title:
            parts.append(self.title)
        parts.append(line(self.headers))
        parts.append("  ".join("-" * w for w in widths))
        parts.extend(line(r) for r in cells)
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        self._check_rows()
        esc = html.escape
        head = "".join(f"<th>{esc(h)}</th>" for h in self.headers)
        body = "".join(
            "<tr>" + "".join(f"<td>{esc(self._cell(v))}</td>" for v in row) + "</tr>"
            for row in self.rows
        )
        caption = f"<caption>{esc(self.title)}</caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _iterable(value, name: str) -> Iterable:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")
    return value


class ShownAsTable:
    """Mixin for every result that shows itself: as text in a terminal and in ``repr``, as
    HTML in a notebook. (On a dataclass, pass ``repr=False``.)

    By default both come from ``table()``. A result whose text is not a table overrides
    ``text()``, and ``_html()`` for its own HTML; without a ``table()`` or ``_html()`` a
    notebook shows the text alone.
    """

    def table(self) -> Table:
        raise NotImplementedError

    def text(self) -> str:
        return self.table().text()

    def _html(self) -> str | None:
        """HTML for notebooks, or None for text only."""
        if type(self).table is ShownAsTable.table:
            return None
        return self.table()._repr_html_()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str | None:
        return self._html()
