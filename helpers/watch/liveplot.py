"""A live training plot: loss, memory and samples/s against step, updated in place (lesson 04).

::

    plot = helpers.LivePlot(title="SmallCNN")          # shows a memory gauge and the plot
    for x, y in loader:
        ...
        plot.step(loss=loss, samples=len(x))          # a tensor is fine: no sync per step
    plot.close()                                      # final figure + one summary line

    model.fit(x, y, batch_size=64, callbacks=[plot.keras_callback(batch_size=64)])

Design, so that watching never slows training down noticeably:

* ``step()`` only appends to lists (a few microseconds).  Losses given as GPU tensors are
  converted in one batch when the figure is drawn, not one ``.item()`` sync per step.
* Redraws are throttled by time: at most every ``min_interval`` seconds, and only while the
  redraws fit in ``budget`` (1%) of the training time.
* Drawn series are downsampled into at most ``max_points`` buckets (neighbours merge when
  full), so a redraw costs the same after 100 steps or 10 million.
* Live frames are inline SVG in one ``ipywidgets.HTML`` (a few milliseconds each, replaced in
  place: one output, no flicker; text and grid follow the light or dark theme).  Matplotlib
  draws only the final static PNG, from the kernel's main thread, through its object API
  (no pyplot state), on its own white background.

Headless (nbval, nbconvert, scripts) nothing is drawn during training; ``close()`` shows the
final PNG and returns a deterministic one-line summary.
"""

from __future__ import annotations

import functools
import html as _html
import math
import sys
import threading
import time
from dataclasses import dataclass

from ..core.checks import LARGEST, flag, positive_int, real_number, text, whole_number
from ..core.fmt import GiB, MiB, ShownAsTable, fmt_rate
from .base import LiveView, new_figure, png_bytes

__all__ = ["LivePlot", "LivePlotSummary"]

RATE_WINDOW = 0.2  # seconds of training per samples/s point
_COLOURS = {"loss": "#0072B2", "used": "#CC79A7", "tensors": "#0072B2", "rate": "#009E73"}
# theme colours in JupyterLab; the host's text colour / translucent grey elsewhere
_SVG_TEXT = "var(--jp-ui-font-color1, currentColor)"
_SVG_GRID = "var(--jp-border-color2, rgba(128, 128, 128, 0.4))"


def _tick(value: float) -> str:
    """A short axis label: 0, 0.25, 1.5, 120, 4.5k, 2M."""
    a = abs(value)
    if a >= 1e6:
        return f"{value / 1e6:.3g}M"
    if a >= 1e4:
        return f"{value / 1e3:.3g}k"
    if a >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _nice(value: float) -> float:
    """A round number >= value (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of
    ten): axis limits that leave little empty space yet change rarely."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for m in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * power >= value * (1 - 1e-12):
            return m * power
    return 10 * power  # pragma: no cover


class _Series:
    """At most ``capacity`` buckets; when full, neighbours merge and each bucket covers twice
    as many steps.  Adding is O(1) amortised; reading is O(capacity), whatever the history."""

    def __init__(self, capacity: int, how: str):
        self.capacity = capacity - capacity % 2
        self.how = how  # "mean", "max" or "rate" (sum a / sum b)
        self.per_bucket = 1
        self.x: list[float] = []
        self.a: list[float] = []
        self.b: list[float] = []
        self.n: list[int] = []

    def add(self, x: float, a: float, b: float = 0.0) -> None:
        if not self.n or self.n[-1] >= self.per_bucket:
            if len(self.n) >= self.capacity:
                self._merge()
            self.x.append(0.0)
            self.a.append(-math.inf if self.how == "max" else 0.0)
            self.b.append(0.0)
            self.n.append(0)
        self.x[-1] += x
        self.n[-1] += 1
        if self.how == "max":
            self.a[-1] = max(self.a[-1], a)
        else:
            self.a[-1] += a
            self.b[-1] += b

    def _merge(self) -> None:
        pick = max if self.how == "max" else (lambda u, v: u + v)
        self.x = [self.x[i] + self.x[i + 1] for i in range(0, len(self.x), 2)]
        self.a = [pick(self.a[i], self.a[i + 1]) for i in range(0, len(self.a), 2)]
        self.b = [self.b[i] + self.b[i + 1] for i in range(0, len(self.b), 2)]
        self.n = [self.n[i] + self.n[i + 1] for i in range(0, len(self.n), 2)]
        self.per_bucket *= 2

    def __len__(self) -> int:
        return len(self.n)

    def arrays(self) -> tuple[list[float], list[float]]:
        xs = [x / n for x, n in zip(self.x, self.n, strict=True)]
        if self.how == "max":
            return xs, list(self.a)
        if self.how == "mean":
            return xs, [a / n for a, n in zip(self.a, self.n, strict=True)]
        keep = [i for i, b in enumerate(self.b) if b > 0]
        return [xs[i] for i in keep], [self.a[i] / self.b[i] for i in keep]


@dataclass(frozen=True, repr=False)
class LivePlotSummary(ShownAsTable):
    """What a training run looked like; prints as one line that tests can compare."""

    steps: int
    first_loss: float | None
    last_loss: float | None
    lowest_loss: float | None
    samples_per_second: float | None
    peak_memory_bytes: int | None
    memory_label: str | None
    memory_total_bytes: int | None
    overhead_share: float  # plot + gauge time / training time
    plot_share: float
    gauge_share: float
    redraws: int
    seconds: float

    def text(self) -> str:
        parts = [f"LivePlot: {self.steps} steps"]
        if self.first_loss is not None:
            parts.append(f"loss {self.first_loss:.3f} -> {self.last_loss:.3f} "
                         f"(lowest {self.lowest_loss:.3f})")
        if self.samples_per_second is not None:
            parts.append(fmt_rate(self.samples_per_second))
        if self.peak_memory_bytes is not None:  # the unit follows the device, not the value
            unit, scale = ("GiB", GiB) if self.memory_total_bytes >= GiB else ("MiB", MiB)
            parts.append(f"highest memory seen ~{self.peak_memory_bytes / scale:.1f} {unit} "
                         f"({self.memory_label})")
        parts.append(f"plot+gauge cost ~{100 * self.overhead_share:.2f}% of training time")
        return ", ".join(parts)


def _item(value) -> float:
    """A loss as a float; NaN when it has no value (None, a fake or meta tensor)."""
    if value is None:
        return math.nan
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except Exception:  # noqa: BLE001 - fake tensors (full-scale mode) have no data
        return math.nan


def _as_floats(values: list) -> list[float]:
    """Losses to floats: accelerator tensors are stacked and copied to the CPU in one go (one
    sync per redraw instead of one per step)."""
    if not values:
        return []
    torch = sys.modules.get("torch")
    if torch is not None and all(isinstance(v, torch.Tensor) for v in values):
        try:
            return torch.stack([v.reshape(()) for v in values]).float().cpu().tolist()
        except Exception:  # noqa: BLE001 - mixed devices, fake tensors: one by one
            pass
    return [v if isinstance(v, float) else _item(v) for v in values]


class LivePlot(LiveView):
    """Loss, memory and throughput against step, live in the notebook (lesson 04).

    Args:
        title: a title for the figure.
        total: the number of steps you expect, if known: the x-axis spans it from the start
            (live frames stay cheap, and you see how far training has come).
        gauge: ``True`` (default) creates a :class:`helpers.MemoryGauge` shown above the plot
            and plots its readings; pass an existing gauge to plot its readings (it is not
            shown twice), or ``False`` for no memory panel.
        min_interval: seconds between redraws, at least (>= 0.1; default 0.5).
        budget: largest share of the training time redraws may take (default 0.01); slow
            redraws are spaced out to stay within it.
        max_points: points drawn per line, at most (>= 20); older steps are averaged.
        show: display the plot now (in a live notebook).
    """

    kind = "liveplot"

    def __init__(self, title: str = "", *, total: int | None = None, gauge=True,
                 min_interval: float = 0.5, budget: float = 0.01, max_points: int = 240,
                 show: bool = True):
        from .gauge import MemoryGauge

        self.title = text(title, "title", empty=True)
        if gauge is True:
            gauge = MemoryGauge()
            self._show_gauge = True
        elif gauge is False or gauge is None:
            gauge, self._show_gauge = None, False
        elif isinstance(gauge, MemoryGauge):
            self._show_gauge = False
        else:
            raise TypeError(f"gauge must be True, False or a helpers.MemoryGauge, got {gauge!r}")
        self._init_view(real_number(min_interval, "min_interval", 0.1, 3600.0),
                        real_number(budget, "budget", 1e-4, 0.5))
        self.max_points = whole_number(max_points, "max_points", 20, 100_000)
        self.total = None if total is None else positive_int(total, "total")
        show = flag(show, "show")
        self.gauge = gauge
        # raw history (plain lists: appending costs ~50 ns)
        self._steps: list[int] = []
        self._times: list[float] = []
        self._losses: list = []  # floats, or tensors until the next flush
        self._samples: list[int] = []
        self._mem: list[tuple[int, int, int]] = []  # (step, used, tensors-or-process)
        self._flushed = 0
        self._loss_series = _Series(max_points, "mean")
        self._rate_series = _Series(max_points, "rate")
        self._used_series = _Series(max_points, "max")
        self._part_series = _Series(max_points, "max")
        self._mem_flushed = 0
        self._rate_acc = [0.0, 0, 0, 0.0]  # sum of steps, steps, samples, seconds
        # running totals, so a summary (shown with every frame) costs the same at any length
        self._totals = {"first": None, "last": None, "lowest": math.inf, "samples": 0,
                        "used": -1, "part": -1}
        self._last_reading = None
        self._busy = 0.0  # seconds inside step() and redraws
        self._gauge_in_step = 0.0
        self._gauge_busy0 = gauge.busy_seconds if gauge is not None else 0.0
        self._next_memory = 0.0
        self._live_limits: dict = {}
        self._fig = None
        if show:
            self.show()

    # ------------------------------------------------------------------ recording
    def step(self, loss=None, *, samples: int | None = None, step: int | None = None) -> None:
        """Record one training step.

        Args:
            loss: the step's loss: a float or a 0-d tensor.  A GPU tensor is kept until
                the next redraw and converted with the others in one copy, so there is no
                GPU sync per step.  None if this step has no loss.
            samples: how many samples the step processed (for samples/s).
            step: the x value; default: the number of steps recorded so far.
        """
        t0 = time.perf_counter()
        if self.closed:
            raise RuntimeError("this LivePlot is closed; create a new one for a new run")
        step = len(self._steps) if step is None else whole_number(step, "step", -LARGEST)
        samples = 0 if samples is None else whole_number(samples, "samples")
        if isinstance(loss, (str, bytes)):
            raise TypeError(f"loss must be a number or a 0-d tensor, got {loss!r:.40}")
        if loss is not None and hasattr(loss, "detach"):
            loss = loss.detach()
            if loss.device.type == "cpu":  # no sync to avoid: convert now, keep no storage
                loss = _item(loss)
        self._steps.append(step)
        self._times.append(t0)
        self._losses.append(loss)
        self._samples.append(samples)
        if self.gauge is not None and t0 >= self._next_memory:
            g0 = time.perf_counter()
            # a polling gauge is fresh already; otherwise update it (it throttles itself)
            reading = self.gauge.reading if self.gauge.polling else self.gauge.update()
            self._gauge_in_step += time.perf_counter() - g0
            if reading is not self._last_reading:
                self._last_reading = reading
                part = reading.bands[0][1] if reading.bands else 0
                self._mem.append((step, reading.used_bytes, part))
            self._next_memory = t0 + 0.1
        if len(self._losses) - self._flushed > 256:  # keep few loss tensors alive
            self._flush()
        if t0 >= self._next:
            if len(self._steps) == 1:  # training starts: the budget counts from here
                self._start, self._spent = t0, 0.0
                self._schedule(t0)
            elif self._live and threading.current_thread() is threading.main_thread():
                self._tick()
        self._busy += time.perf_counter() - t0

    def _flush(self) -> None:
        new = self._losses[self._flushed:]
        floats = _as_floats(new)
        start = self._flushed
        self._losses[start:] = floats
        totals = self._totals
        for i, value in enumerate(floats, start):
            step = self._steps[i]
            if not math.isnan(value):
                self._loss_series.add(step, value)
                if totals["first"] is None:
                    totals["first"] = value
                totals["last"] = value
                totals["lowest"] = min(value, totals["lowest"])
            if i > 0:  # samples/s over windows of >= RATE_WINDOW s: readable, not jittery
                totals["samples"] += self._samples[i]
                acc = self._rate_acc
                acc[0] += step
                acc[1] += 1
                acc[2] += self._samples[i]
                acc[3] += self._times[i] - self._times[i - 1]
                if acc[3] >= RATE_WINDOW:
                    self._rate_series.add(acc[0] / acc[1], acc[2], acc[3])
                    self._rate_acc = [0.0, 0, 0, 0.0]
        self._flushed = len(self._losses)
        for step, used, part in self._mem[self._mem_flushed:]:
            self._used_series.add(step, used)
            self._part_series.add(step, part)
            totals["used"] = max(used, totals["used"])
            totals["part"] = max(part, totals["part"])
        self._mem_flushed = len(self._mem)

    # ------------------------------------------------------------------ drawing
    @property
    def _panels(self) -> list[str]:
        return ["loss", "memory", "rate"] if self.gauge is not None else ["loss", "rate"]

    def _memory_unit(self) -> tuple[str, int]:
        reading = self.gauge.reading
        return ("GiB", GiB) if reading.total_bytes >= GiB else ("MiB", MiB)

    def _line_data(self) -> dict[str, tuple[list[float], list[float]]]:
        """The downsampled lines (at most max_points each), memory in the gauge's unit."""
        data = {"loss": self._loss_series.arrays()}
        xs, ys = self._rate_series.arrays()
        acc = self._rate_acc
        if acc[3] > 0:  # the window still filling
            xs, ys = xs + [acc[0] / acc[1]], ys + [acc[2] / acc[3]]
        data["rate"] = (xs, ys)
        if self.gauge is not None:
            scale = self._memory_unit()[1]
            for name, series in (("used", self._used_series), ("part", self._part_series)):
                xs, ys = series.arrays()
                data[name] = (xs, [y / scale for y in ys])
        return data

    def _memory_lines(self) -> list[tuple[str, str, str]]:
        """(data key, legend label, colour) of the memory panel's lines."""
        reading = self.gauge.reading
        if reading.label == "RAM":  # "used" is the whole machine, other users too
            return [("part", "this process", _COLOURS["tensors"])]
        return [("used", "used (all processes)", _COLOURS["used"]),
                ("part", reading.bands[0][0], _COLOURS["tensors"])]

    def _limits(self, data) -> dict[str, tuple[float, float]]:
        """y-limits per panel and the shared x-limit ("x"): round numbers that never shrink
        during a run, so the picture does not jump around."""
        limits = {}
        x_hi = max((max(xs) for xs, _ in data.values() if xs), default=1.0)
        old = self._live_limits
        if self.total and x_hi <= self.total:  # the axis spans the expected run exactly
            x_hi = float(self.total)
        else:
            x_hi = _nice(x_hi * 1.05)
        limits["x"] = (0.0, max(x_hi, old.get("x", (0, 0))[1]))
        for name in self._panels:
            keys = ("used", "part") if name == "memory" else (name,)
            values = [v for key in keys for v in data[key][1] if math.isfinite(v)]
            lo = min(0.0, min(values, default=0.0))
            lo = -_nice(-lo) if lo < 0 else 0.0
            hi = _nice(max(values, default=0.0) * 1.05)
            if name in old:
                lo, hi = min(lo, old[name][0]), max(hi, old[name][1])
            limits[name] = (lo, hi)
        self._live_limits = limits
        return limits

    def svg(self) -> str:
        """The live figure as inline SVG: a few milliseconds whatever the history, and its
        text and grid follow the JupyterLab theme (light or dark)."""
        self._flush()
        data = self._line_data()
        limits = self._limits(data)
        width, left, right, panel_h, gap, top = 640, 56, 12, 110, 26, 22
        height = top + len(self._panels) * (panel_h + gap) + 8
        x0, x1 = limits["x"]
        plot_w = width - left - right

        def px(x):
            return left + plot_w * (x - x0) / (x1 - x0)

        esc = _html.escape
        out = [
            f'<svg class="gl-liveplot-svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" style="max-width:100%;height:auto;font-family:'
            f'var(--jp-ui-font-family,sans-serif);font-size:10px;fill:{_SVG_TEXT}">',
            f'<text x="{width / 2}" y="14" text-anchor="middle" style="font-size:12px">'
            f"{esc(self.title or 'training')}</text>",
        ]
        for i, name in enumerate(self._panels):
            y_top = top + i * (panel_h + gap)
            lo, hi = limits[name]

            def py(y, y_top=y_top, lo=lo, hi=hi):
                return y_top + panel_h * (1 - (y - lo) / (hi - lo))

            out.append(f'<rect x="{left}" y="{y_top}" width="{plot_w}" height="{panel_h}" '
                       f'style="fill:none;stroke:{_SVG_GRID}"/>')
            for frac in (0.0, 0.5, 1.0):  # y ticks
                value = lo + frac * (hi - lo)
                y = py(value)
                out.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                           f'style="stroke:{_SVG_GRID};stroke-width:0.5"/>'
                           f'<text x="{left - 4}" y="{y + 3:.1f}" text-anchor="end">'
                           f"{_tick(value)}</text>")
            if name == "memory":
                unit = self._memory_unit()[0]
                lines = self._memory_lines()
                label = f"memory ({unit})"
                reading = self.gauge.reading
                out.append(f'<text x="{left + 4}" y="{y_top - 4}" style="font-size:9px">'
                           f"{esc(reading.label)}: {esc(reading.source)}</text>")
            else:
                lines = [(name, "", _COLOURS[name])]
                label = "loss" if name == "loss" else "samples/s"
            out.append(f'<text transform="translate(12,{y_top + panel_h / 2}) rotate(-90)" '
                       f'text-anchor="middle">{label}</text>')
            legend_x = left + 8
            for key, legend, colour in lines:
                xs, ys = data[key]
                xy = [(px(x), py(y)) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
                points = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
                dash = "stroke-dasharray:5 3;" if key == "part" else ""
                out.append(f'<polyline class="gl-line-{key}" points="{points}" style="fill:none;'
                           f'stroke:{colour};stroke-width:1.6;{dash}"/>')
                if xy:  # the latest value as a dot (visible even with a single point)
                    out.append(f'<circle cx="{xy[-1][0]:.1f}" cy="{xy[-1][1]:.1f}" r="2.5" '
                               f'style="fill:{colour}"/>')
                if legend:
                    out.append(f'<text x="{legend_x}" y="{y_top + 12}" style="fill:{colour}">'
                               f"{esc(legend)}</text>")
                    legend_x += 7 * len(legend) + 16
        bottom = top + len(self._panels) * (panel_h + gap) - gap
        for frac in (0.0, 0.25, 0.5, 0.75, 1.0):  # shared x ticks under the last panel
            x = x0 + frac * (x1 - x0)
            out.append(f'<text x="{px(x):.1f}" y="{bottom + 12}" text-anchor="middle">'
                       f"{_tick(x)}</text>")
        out.append(f'<text x="{left + plot_w / 2}" y="{bottom + 23}" text-anchor="middle">'
                   "step</text></svg>")
        return "".join(out)

    def _figure(self):
        if self._fig is None:
            n = len(self._panels)
            fig = new_figure(7.0, 1.7 * n + 0.6)
            axes = fig.subplots(n, 1, sharex=True)
            fig.subplots_adjust(left=0.11, right=0.97, top=0.93, bottom=0.1, hspace=0.28)
            self._ax = dict(zip(self._panels, axes, strict=True))
            for ax in axes:
                ax.set_facecolor("white")
                ax.grid(True, color="#dddddd", linewidth=0.6)
                ax.tick_params(labelsize=8, colors="#333333")
            self._ax["loss"].set_ylabel("loss", fontsize=9)
            self._ax["rate"].set_ylabel("samples/s", fontsize=9)
            self._ax["rate"].set_xlabel("step", fontsize=9)
            fig.suptitle(self.title or "training", fontsize=10)
            self._fig = fig
        return self._fig

    def png(self) -> bytes:
        """The whole run as a static PNG (matplotlib; main thread only).  Headless runs show
        it when the plot closes; it paints its own white background."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("matplotlib is only used from the main thread; call png() there")
        self._flush()
        fig = self._figure()
        data = self._line_data()
        for ax in self._ax.values():
            for line in list(ax.lines):
                line.remove()
        self._ax["loss"].plot(*data["loss"], color=_COLOURS["loss"])
        self._ax["rate"].plot(*data["rate"], color=_COLOURS["rate"])
        if "memory" in self._ax:
            ax = self._ax["memory"]
            for key, legend, colour in self._memory_lines():
                ax.plot(*data[key], color=colour, label=legend,
                        linestyle="--" if key == "part" else "-")
            ax.legend(loc="upper left", fontsize=7, frameon=False)
            reading = self.gauge.reading
            ax.set_ylabel(f"memory ({self._memory_unit()[0]})", fontsize=9)
            ax.set_title(f"{reading.label}: {reading.source}", fontsize=8, loc="left",
                         color="#555555")
        for name, ax in self._ax.items():
            ax.relim()
            ax.autoscale_view()
            if name != "loss":
                ax.set_ylim(bottom=0, auto=True)
        return png_bytes(fig)

    def _status_html(self, state: str) -> str:
        s = self.summary()
        parts = [f"step {s.steps}" + (f" of {self.total}" if self.total else "")]
        if s.last_loss is not None:
            parts.append(f"loss {s.last_loss:.3f}")
        if s.samples_per_second is not None:
            parts.append(fmt_rate(s.samples_per_second))
        parts.append(f"plot {100 * s.plot_share:.2f}% + gauge {100 * s.gauge_share:.2f}% "
                     "of training time")
        return (f'<div class="gl-liveplot-status" data-steps="{s.steps}" data-state="{state}" '
                f'data-redraws="{self.redraws}" style="font-family:var(--jp-ui-font-family,'
                f'sans-serif);font-size:12px;color:var(--jp-ui-font-color2,inherit)">'
                f"{_html.escape(' · '.join(parts))}</div>")

    def _frame(self) -> str:
        state = "done" if self.closed else "running" if self._steps else "waiting"
        return self.svg() + self._status_html(state)

    def _container(self, html_widget):
        """The frame under the gauge (when this plot made it), in one box."""
        import ipywidgets

        html_widget.add_class("gl-liveplot-frame")
        children = [html_widget]
        if self._show_gauge:
            children.insert(0, self.gauge.widget() or ipywidgets.HTML(self.gauge.html()))
        box = ipywidgets.VBox(children)
        box.add_class("gl-liveplot")
        return box

    def text(self) -> str:
        return self.summary().text()

    @property
    def redraws(self) -> int:
        """Frames drawn since the plot was shown (none headless)."""
        return self.updates

    # ------------------------------------------------------------------ results
    @property
    def history(self) -> dict[str, list]:
        """Every recorded step: ``step``, ``loss``, ``samples``, ``time`` (perf_counter
        seconds), and ``memory`` as (step, used bytes, tensor bytes) samples."""
        self._flush()
        return {"step": list(self._steps), "loss": list(self._losses),
                "samples": list(self._samples), "time": list(self._times),
                "memory": list(self._mem)}

    def summary(self) -> LivePlotSummary:
        """The run so far (see :class:`LivePlotSummary`)."""
        self._flush()
        n = len(self._steps)
        totals = self._totals
        seconds = self._times[-1] - self._times[0] if n > 1 else 0.0
        rate = totals["samples"] / seconds if seconds > 0 and totals["samples"] else None
        gauge_busy = 0.0
        if self.gauge is not None:
            gauge_busy = self.gauge.busy_seconds - self._gauge_busy0
        plot_busy = self._busy - self._gauge_in_step
        span = seconds if seconds > 0 else math.inf
        reading = self.gauge.reading if self.gauge is not None else None
        label = reading.label if reading is not None and reading.total_bytes else None
        # RAM: the machine's "used" includes other users; this process is what matters
        column, what = ("part", "this process") if label == "RAM" else ("used", "used")
        peak = totals[column] if label and totals[column] >= 0 else None
        return LivePlotSummary(
            steps=n,
            first_loss=totals["first"],
            last_loss=totals["last"],
            lowest_loss=totals["lowest"] if totals["first"] is not None else None,
            samples_per_second=rate,
            peak_memory_bytes=peak,
            memory_label=f"{label}, {what}" if label else None,
            memory_total_bytes=reading.total_bytes if label else None,
            overhead_share=(plot_busy + gauge_busy) / span,
            plot_share=plot_busy / span,
            gauge_share=gauge_busy / span,
            redraws=self.redraws,
            seconds=seconds,
        )

    _value = summary

    def _figure_caption(self) -> str:
        n = len(self._steps)
        return f"[figure: loss, memory and samples/s over {n} steps]" if n else ""

    def close(self) -> LivePlotSummary:
        """Draw the final figure and return the summary.  Live: the plot is redrawn in
        place.  Headless: the final PNG is displayed here (one static image)."""
        return super().close()

    # ------------------------------------------------------------------ Keras
    def keras_callback(self, batch_size: int):
        """A Keras callback that records every training batch (``model.fit``).

        Args:
            batch_size: the batch size given to ``fit`` (for samples/s).

        Keras reports the loss as the running mean over the epoch so far, so the curve is
        smoother than a PyTorch per-step loss.  Import keras before asking for the callback
        (this module never imports it).
        """
        batch_size = positive_int(batch_size, "batch_size")
        keras = sys.modules.get("keras")  # the learner's, already imported (never here)
        if keras is None:
            raise RuntimeError("keras_callback() is for Keras' model.fit: import keras first")
        return _keras_callback_class(keras)(self, batch_size)


@functools.cache
def _keras_callback_class(keras):
    class LivePlotCallback(keras.callbacks.Callback):
        """Sends each training batch's loss to a :class:`LivePlot`."""

        def __init__(self, plot: LivePlot, batch_size: int):
            super().__init__()
            self.plot, self.batch_size = plot, batch_size

        def on_train_batch_end(self, batch, logs=None):
            self.plot.step(loss=(logs or {}).get("loss"), samples=self.batch_size)

    return LivePlotCallback
