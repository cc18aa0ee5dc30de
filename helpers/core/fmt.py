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
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "KiB",
    "MiB",
    "GiB",
    "fmt_bytes",
    "fmt_mib",
    "fmt_gib",
    "fmt_seconds",
    "fmt_rate",
    "fmt_ratio",
    "Table",
    "ShownAsTable",
]

KiB = 1024
MiB = 1024**2
GiB = 1024**3


def _check_number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}")
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return float(value)


def fmt_bytes(n_bytes, digits: int = 2) -> str:
    """Bytes as a human-readable binary size: ``fmt_bytes(3 * 2**20) == '3.00 MiB'``."""
    n = _check_number(n_bytes, "n_bytes")
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.{digits}f} {unit}"
    return f"{sign}{int(n)} B"


def fmt_mib(n_bytes, digits: int = 1) -> str:
    """Bytes in MiB, always in MiB (for columns of a table)."""
    return f"{_check_number(n_bytes, 'n_bytes') / MiB:,.{digits}f} MiB"


def fmt_gib(n_bytes, digits: int = 2) -> str:
    """Bytes in GiB, always in GiB."""
    return f"{_check_number(n_bytes, 'n_bytes') / GiB:,.{digits}f} GiB"


def fmt_seconds(seconds, digits: int = 3) -> str:
    """A *measured* duration with a tilde and a sensible unit: ``'~12.3 ms'``."""
    s = _check_number(seconds, "seconds")
    if s < 0:
        raise ValueError(f"seconds must be >= 0, got {s}")
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale or unit == "µs":
            value = s / scale
            return f"~{value:.{_sig(value, digits)}f} {unit}"
    raise AssertionError("unreachable")


def _sig(value: float, digits: int) -> int:
    """Decimals needed to show ``digits`` significant digits of ``value``."""
    if value == 0:
        return 0
    return max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))


def fmt_rate(per_second, unit: str = "samples/s") -> str:
    """A *measured* throughput with a tilde: ``'~1,234 samples/s'``."""
    r = _check_number(per_second, "per_second")
    if r < 0:
        raise ValueError(f"per_second must be >= 0, got {r}")
    if r >= 100:
        return f"~{r:,.0f} {unit}"
    return f"~{r:.{_sig(r, 3)}f} {unit}"


def fmt_ratio(ratio, digits: int = 2, measured: bool = True) -> str:
    """A ratio as ``'~1.83x'`` (measured, masked in tests) or ``'0.52x'`` (exact)."""
    r = _check_number(ratio, "ratio")
    return f"{'~' if measured else ''}{r:.{digits}f}x"


@dataclass
class Table:
    """A small table that prints as aligned text and renders as HTML in notebooks.

    >>> Table(["batch", "peak"], [[32, "1.00 GiB"], [64, "2.00 GiB"]])
    """

    headers: Sequence[str]
    rows: Sequence[Sequence[object]]
    title: str | None = None

    def __post_init__(self):
        self.headers = [str(h) for h in self.headers]
        self.rows = [list(r) for r in self.rows]
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
        esc = html.escape
        head = "".join(f"<th>{esc(h)}</th>" for h in self.headers)
        body = "".join(
            "<tr>" + "".join(f"<td>{esc(self._cell(v))}</td>" for v in row) + "</tr>"
            for row in self.rows
        )
        caption = f"<caption>{esc(self.title)}</caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class ShownAsTable:
    """Mixin for results that show themselves as their ``table()``: as aligned text in a
    terminal and in ``repr``, as HTML in a notebook. (On a dataclass, pass ``repr=False``.)"""

    def table(self) -> Table:
        raise NotImplementedError

    def text(self) -> str:
        return self.table().text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()
