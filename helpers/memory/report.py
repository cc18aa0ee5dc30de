"""What ``measure_step`` returns: :class:`MemoryReport`, its per-step parts and its timeline.

Plain data (ints and strings, no tensors), so a report can be kept, compared, printed, shown
as HTML, plotted (:meth:`MemoryReport.plot_timeline`) or exported
(:meth:`Timeline.records`, :meth:`Timeline.to_csv`, :meth:`MemoryReport.to_dict`).
"""

from __future__ import annotations

import csv
import html
import io
from dataclasses import dataclass, field

from ..core.checks import flag
from ..core.fmt import ShownAsTable, Table, fmt_bytes

__all__ = ["MemoryReport", "StepMemory", "Timeline", "CudaStats", "CATEGORIES", "PHASES",
           "WORKSPACE"]

CATEGORIES = (
    "parameters", "gradients", "optimizer_state", "activations", "temporaries", "inputs",
    "other",
)
CATEGORY_TITLES = {
    "parameters": "parameters (and buffers)",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations (kept for backward)",
    "temporaries": "temporaries",
    "inputs": "inputs (batch, labels)",
    "other": "other tensors on the device",
    "workspace": "library workspaces (cuBLAS, cuDNN)",
}
#: the category of library workspaces: present only when a ``VirtualGPU(workspaces=True)``
#: models them (after the tensor categories in every table, dict and timeline column)
WORKSPACE = "workspace"
PHASES = ("forward", "backward", "optimizer", "other")
PHASE_TITLES = {"forward": "forward", "backward": "backward", "optimizer": "optimizer step",
                "other": "other"}
_COLOURS = {
    "parameters": "#4c72b0", "gradients": "#dd8452", "optimizer_state": "#55a868",
    "activations": "#c44e52", "temporaries": "#8172b3", "inputs": "#937860",
    "other": "#b0b0b0", "workspace": "#da8bc3",
}
_STACK_ORDER = ("parameters", "optimizer_state", "gradients", "inputs", "other",
                "activations", "temporaries", "workspace")
_PHASE_SHADES = {"forward": "#e8f0fb", "backward": "#fdeee4", "optimizer": "#e9f5ec",
                 "other": "#f4f4f4"}


def category_bytes(category: str) -> property:
    """A read-only property: the largest size of ``category`` (``category_max``), 0 if absent
    (``report.activation_bytes``, ...)."""
    return property(lambda self: self.category_max.get(category, 0),
                    doc=f"The largest size of the {category!r} category, in bytes.")


@dataclass(frozen=True)
class CudaStats:
    """The real CUDA caching allocator's statistics around a measured step (CUDA only)."""

    device_name: str
    total_bytes: int
    allocated_before_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    allocated_after_bytes: int
    reserved_after_bytes: int


@dataclass
class Timeline:
    """Live bytes after every operation that allocated, by category.

    Columns (``columns[name]`` is a list, one entry per point): ``point``, ``step``,
    ``phase``, ``op``, ``module``, ``total`` (exact live bytes), one column per category, and
    ``allocated``/``reserved`` (what a CUDA-like allocator would hold; equal to ``total``
    without allocator rounding).  Inside ``VirtualGPU(..., workspaces=True)`` a
    ``workspace`` column follows the categories (cuBLAS workspaces held, plus a
    convolution's cuDNN allowance at its point) and ``total`` includes it.
    """

    columns: dict[str, list]

    def __len__(self) -> int:
        return len(self.columns["point"])

    @property
    def names(self) -> list[str]:
        return list(self.columns)

    def records(self) -> list[dict]:
        """One dict per point (e.g. for ``pandas.DataFrame(report.timeline.records())``)."""
        keys = list(self.columns)
        return [dict(zip(keys, row, strict=True)) for row in zip(*self.columns.values(),
                                                                  strict=True)]

    def to_csv(self, path=None) -> str:
        """The timeline as CSV text; also written to ``path`` when given."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows(zip(*self.columns.values(), strict=True))
        text = buf.getvalue()
        if path is not None:
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
        return text

    def __repr__(self) -> str:
        return f"Timeline({len(self)} points; columns: {', '.join(self.columns)})"


@dataclass
class StepMemory:
    """One measured step: its peak, where it happened and the peak of each phase."""

    step: int
    peak_bytes: int
    peak_phase: str
    peak_op: str
    peak_module: str
    at_peak: dict[str, int]
    phase_peaks: dict[str, int]
    start_bytes: int
    end_bytes: int
    peak_reserved_bytes: int | None = None

    def where(self) -> str:
        """Where the peak happened, e.g. ``"backward, at mm (AddmmBackward0) in MLP.head"``."""
        place = f"{self.peak_op} in {self.peak_module}" if self.peak_module else self.peak_op
        return f"{PHASE_TITLES[self.peak_phase]}, at {place}"


@dataclass(repr=False)
class MemoryReport(ShownAsTable):
    """Memory of a measured training step (``helpers.measure_step``).

    Exact bytes of live tensor storages, counted by the engine.  ``at_peak`` splits the peak
    by category; ``category_max`` holds each category's own maximum (e.g. all activations at
    the end of the forward pass); ``phase_peaks`` the peak within each phase.  Inside
    ``VirtualGPU(..., workspaces=True)`` the library workspaces are one more category,
    ``"workspace"``, and every peak includes them (``peak_bytes`` is then the virtual GPU's
    ``peak_allocated_bytes`` over the step, without allocator rounding).
    """

    peak_bytes: int
    peak_step: int
    peak_phase: str
    peak_op: str
    peak_module: str
    at_peak: dict[str, int]
    category_max: dict[str, int]
    phase_peaks: dict[str, int]
    steps: list[StepMemory]
    baseline_bytes: int
    end_bytes: int
    timeline: Timeline
    device: str = "cpu"
    fake: bool = False
    title: str = "training step"
    virtual_gpu: str | None = None
    capacity_bytes: int | None = None
    context_bytes: int = 0
    rounding: bool = False
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    cuda: CudaStats | None = None
    notes: list[str] = field(default_factory=list)

    # -------------------------------------------------------------- convenience
    parameter_bytes = category_bytes("parameters")
    gradient_bytes = category_bytes("gradients")
    optimizer_state_bytes = category_bytes("optimizer_state")
    activation_bytes = category_bytes("activations")
    temporary_bytes = category_bytes("temporaries")
    input_bytes = category_bytes("inputs")
    workspace_bytes = category_bytes(WORKSPACE)

    @property
    def first_step(self) -> StepMemory:
        return self.steps[0]

    @property
    def steady_state(self) -> StepMemory | None:
        """The last measured step when more than one was measured, else None."""
        return self.steps[-1] if len(self.steps) > 1 else None

    where = StepMemory.where

    # -------------------------------------------------------------- text and HTML
    def _how(self) -> str:
        bits = ["fake tensors (full scale)" if self.fake else "exact", f"on {self.device}"]
        if self.virtual_gpu:
            bits.append(f"virtual GPU {self.virtual_gpu}")
        return ", ".join(bits)

    def _header(self) -> list[str]:
        n = len(self.steps)
        lines = [f"Memory of {self.title} ({n} step{'s' if n > 1 else ''}, {self._how()})"]
        step = f"step {self.peak_step}, " if n > 1 else ""
        lines.append(f"peak {fmt_bytes(self.peak_bytes)} ({step}{self.where()})")
        return lines

    def table(self) -> Table:
        rows = []
        for cat in (*CATEGORIES, WORKSPACE):
            # a workspace row whenever they are modelled (0 when none was charged)
            if self.category_max.get(cat, 0) or self.at_peak.get(cat, 0) or \
                    (cat == WORKSPACE and cat in self.category_max):
                rows.append([CATEGORY_TITLES[cat], fmt_bytes(self.at_peak.get(cat, 0)),
                             fmt_bytes(self.category_max.get(cat, 0))])
        rows.append(["total", fmt_bytes(self.peak_bytes), ""])
        return Table(["category", "at peak", "largest"], rows)

    def _footer(self) -> list[str]:
        phases = ", ".join(f"{PHASE_TITLES[p]} {fmt_bytes(b)}" for p, b in
                           self.phase_peaks.items())
        lines = [f"phase peaks: {phases}"]
        if len(self.steps) > 1:
            first, last = self.steps[0], self.steps[-1]
            lines.append(
                f"first step peak {fmt_bytes(first.peak_bytes)} ({first.where()}); "
                f"steady state (step {last.step}) {fmt_bytes(last.peak_bytes)} "
                f"({last.where()})"
            )
        if self.peak_reserved_bytes is not None and self.rounding:
            lines.append(
                f"CUDA-like allocator: peak {fmt_bytes(self.peak_allocated_bytes)} allocated "
                f"(512-byte blocks), {fmt_bytes(self.peak_reserved_bytes)} reserved "
                "(2 MiB/20 MiB segments, cache)"
            )
        if self.capacity_bytes is not None:
            used = self.context_bytes + (self.peak_reserved_bytes or self.peak_bytes)
            lines.append(
                f"{self.virtual_gpu}: {fmt_bytes(used)} of {fmt_bytes(self.capacity_bytes)} "
                f"at the peak ({used / self.capacity_bytes:.0%})"
            )
        if self.cuda is not None:
            c = self.cuda
            lines.append(
                f"CUDA allocator ({c.device_name}): peak {fmt_bytes(c.peak_allocated_bytes)} "
                f"allocated, {fmt_bytes(c.peak_reserved_bytes)} reserved"
            )
        lines.extend(self.notes)
        return lines

    def text(self) -> str:
        return "\n".join(self._header() + [self.table().text()] + self._footer())

    def _html(self) -> str:
        head = "<br>".join(html.escape(line) for line in self._header())
        foot = "<br>".join(html.escape(line) for line in self._footer())
        return f"<div><p>{head}</p>{self.table()._repr_html_()}<p>{foot}</p></div>"

    def to_dict(self) -> dict:
        """A JSON-serialisable summary (no timeline; see ``timeline.records()``)."""
        return {
            "title": self.title, "device": self.device, "fake": self.fake,
            "virtual_gpu": self.virtual_gpu, "capacity_bytes": self.capacity_bytes,
            "peak_bytes": self.peak_bytes, "peak_step": self.peak_step,
            "peak_phase": self.peak_phase, "peak_op": self.peak_op,
            "peak_module": self.peak_module, "at_peak": dict(self.at_peak),
            "category_max": dict(self.category_max), "phase_peaks": dict(self.phase_peaks),
            "baseline_bytes": self.baseline_bytes, "end_bytes": self.end_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "steps": [s.__dict__.copy() for s in self.steps],
            "cuda": None if self.cuda is None else self.cuda.__dict__.copy(),
        }

    # -------------------------------------------------------------- plot
    def plot_timeline(self, ax=None, *, unit: str | None = None, title: str | None = None,
                      legend: bool = True):
        """Draw the memory timeline: categories stacked, phases shaded, the peak marked.

        Args:
            ax: a matplotlib Axes to draw into; by default a new figure is made.
            unit: "MiB" or "GiB"; by default the one that suits the peak.
            title: the axes title (default: the report's title and peak).
            legend: draw the legend.

        Returns:
            The matplotlib Figure (displayed when it ends a notebook cell).
        """
        import matplotlib.pyplot as plt
        from matplotlib.axes import Axes

        if ax is not None and not isinstance(ax, Axes):
            shape = getattr(ax, "shape", None)
            hint = (f"; plt.subplots() returned an array of axes {tuple(shape)}: pass one of "
                    "them, such as axes[0]" if shape is not None else "")
            raise TypeError(f"ax must be a matplotlib Axes or None, got "
                            f"{type(ax).__name__}{hint}")
        if title is not None and not isinstance(title, str):
            raise TypeError(f"title must be a string or None, got {type(title).__name__}")
        legend = flag(legend, "legend")
        if unit not in (None, "MiB", "GiB"):
            raise ValueError(f"unit must be 'MiB', 'GiB' or None, got {unit!r}")
        cols = self.timeline.columns
        if unit is None:
            unit = "GiB" if self.peak_bytes >= 2 * 1024**3 else "MiB"
        scale = 1024**3 if unit == "GiB" else 1024**2
        if ax is None:
            fig, ax = plt.subplots(figsize=(8, 3.6), dpi=80)
            plt.close(fig)  # returned and displayed once, never by pyplot again
        fig = ax.figure
        x = cols["point"]
        n = len(x)
        if n == 0:
            raise ValueError("this report recorded no memory to plot: measure the step inside "
                             "a helpers.VirtualGPU (or on a CUDA GPU), which counts its tensors")
        # phase shading: contiguous runs
        start = 0
        labelled = set()
        for i in range(1, n + 1):
            if i == n or cols["phase"][i] != cols["phase"][start] or cols["step"][i] != \
                    cols["step"][start]:
                ph = cols["phase"][start]
                ax.axvspan(x[start] - 0.5, x[i - 1] + 0.5, color=_PHASE_SHADES[ph], lw=0,
                           label=None if ph in labelled else f"{PHASE_TITLES[ph]} phase")
                labelled.add(ph)
                start = i
        # long-lived categories at the bottom, short-lived ones on top
        cats = [c for c in _STACK_ORDER if any(cols.get(c, ()))]
        ys = [[v / scale for v in cols[c]] for c in cats]
        polys = [] if not cats else ax.stackplot(x, *ys, labels=[CATEGORY_TITLES[c] for c in cats],
                             colors=[_COLOURS[c] for c in cats], step="post")
        for poly in polys:  # no hairline gaps between the steps
            poly.set_edgecolor("face")
            poly.set_linewidth(0.4)
        if self.rounding:
            ax.step(x, [v / scale for v in cols["reserved"]], where="post", color="black",
                    lw=1, ls="--", label="reserved (CUDA-like allocator)")
        for s in sorted(set(cols["step"]))[1:]:
            first = cols["step"].index(s)
            ax.axvline(x[first] - 0.5, color="grey", lw=0.8, ls=":")
        ipeak = max(range(n), key=lambda i: (cols["total"][i], -i))
        peak = cols["total"][ipeak] / scale
        ax.plot([x[ipeak]], [peak], marker="v", color="black", ms=7, zorder=5)
        where = cols["op"][ipeak] + (f"\nin {cols['module'][ipeak]}" if cols["module"][ipeak]
                                     else "")
        ax.annotate(f"peak {fmt_bytes(cols['total'][ipeak])}\n{where}", (x[ipeak], peak),
                    xytext=(0.5 if x[ipeak] > n * 0.6 else 0.55, 0.97),
                    textcoords="axes fraction", ha="right" if x[ipeak] > n * 0.6 else "left",
                    va="top", fontsize=8, arrowprops={"arrowstyle": "-", "color": "black",
                                                      "lw": 0.6})
        if self.capacity_bytes is not None:
            cap = (self.capacity_bytes - self.context_bytes) / scale
            if cap <= peak * 1.6:
                ax.axhline(cap, color="red", lw=1.2, label=f"{self.virtual_gpu} capacity")
        ax.set_xlim(x[0] - 0.5, x[-1] + 0.5)
        ax.set_ylim(0, max(peak * 1.35, 1e-9))
        ax.set_xlabel("operation (in execution order)")
        ax.set_ylabel(f"live memory ({unit})")
        ax.set_title(title if title is not None else
                     f"{self.title}: peak {fmt_bytes(self.peak_bytes)}", fontsize=10)
        if legend:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        fig.tight_layout()
        return fig
