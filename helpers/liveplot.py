"""A live training plot: loss, memory and samples/s against step, updated in place (lesson 04).

::

    plot = helpers.LivePlot(title="SmallCNN")          # shows a memory gauge and the plot
    for x, y in loader:
        ...
        plot.step(loss=loss, samples=len(x))          # a tensor is fine: no sync per step
    plot.close()                                      # final figure + one summary line

    model.fit(x, y, batch_size=64, callbacks=[plot.keras_callback(batch_size=64)])

Design, so that watching never slows training down noticeably:

* ``step()`` only appends to lists (a few microseconds).  Losses given as tensors are
  converted in one batch when the figure is drawn, not one ``.item()`` sync per step.
* Redraws are throttled by time: at most every ``min_interval`` seconds, and rarer when a
  redraw is slow, so redrawing takes at most ``budget`` (1%) of the training time.
* Drawn series are downsampled into at most ``max_points`` buckets (neighbours merge when
  full), so a redraw costs the same after 100 steps or 10 million.
* Matplotlib is only used from the kernel's main thread, through its object API (no pyplot
  state); the figure paints its own white background, so it reads in dark themes too.

In JupyterLab / Notebook 7 the plot is an ``ipywidgets.Image`` replaced in place (one output,
no flicker).  Headless (nbval, nbconvert, scripts) nothing is drawn during training;
``close()`` shows the final PNG and returns a deterministic one-line summary.
"""

from __future__ import annotations

import io
import math
import sys
import threading
import time
from dataclasses import dataclass

from .fmt import GiB, MiB, fmt_rate
from .runtime import headless, in_kernel

__all__ = ["LivePlot", "LivePlotSummary"]

RATE_WINDOW = 0.2  # seconds of training per samples/s point
_COLOURS = {"loss": "#0072B2", "used": "#CC79A7", "tensors": "#0072B2", "rate": "#009E73"}


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


@dataclass(frozen=True)
class LivePlotSummary:
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

    def __repr__(self) -> str:
        return self.text()


def _check_positive(value, name: str, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= minimum):
        raise ValueError(f"{name} must be a number >= {minimum}, got {value!r}")
    return float(value)


def _as_floats(values: list) -> list[float]:
    """Losses to floats: tensors are stacked and copied to the CPU once (one sync)."""
    if not values:
        return []
    torch = sys.modules.get("torch")
    if torch is not None and all(isinstance(v, torch.Tensor) for v in values):
        try:
            return torch.stack([v.reshape(()) for v in values]).float().cpu().tolist()
        except (RuntimeError, ValueError):  # different devices or shapes: one by one
            pass
    out = []
    for v in values:
        if v is None:
            out.append(math.nan)
        elif hasattr(v, "item"):
            out.append(float(v.item()))
        else:
            out.append(float(v))
    return out


class LivePlot:
    """Loss, memory and throughput against step, live in the notebook (lesson 04).

    Args:
        title: a title for the figure.
        gauge: ``True`` (default) creates a :class:`helpers.MemoryGauge` shown above the plot
            and plots its readings; pass an existing gauge to plot its readings (it is not
            shown twice), or ``False`` for no memory panel.
        min_interval: seconds between redraws, at least (>= 0.1; default 0.5).
        budget: largest share of the training time redraws may take (default 0.01); slow
            redraws are spaced out to stay within it.
        max_points: points drawn per line, at most (>= 20); older steps are averaged.
        show: display the plot now (in a live notebook).
    """

    def __init__(self, title: str = "", *, gauge=True, min_interval: float = 0.5,
                 budget: float = 0.01, max_points: int = 400, show: bool = True):
        from .gauge import MemoryGauge

        if not isinstance(title, str):
            raise TypeError(f"title must be a string, got {type(title).__name__}")
        if gauge is True:
            gauge = MemoryGauge()
            self._show_gauge = True
        elif gauge is False or gauge is None:
            gauge, self._show_gauge = None, False
        elif isinstance(gauge, MemoryGauge):
            self._show_gauge = False
        else:
            raise TypeError(f"gauge must be True, False or a helpers.MemoryGauge, got {gauge!r}")
        self.min_interval = _check_positive(min_interval, "min_interval", 0.1)
        self.budget = _check_positive(budget, "budget", 1e-4)
        if self.budget > 0.5:
            raise ValueError(f"budget is a share of the training time (<= 0.5), got {budget}")
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 20:
            raise ValueError(f"max_points must be an integer >= 20, got {max_points!r}")
        if not isinstance(show, bool):
            raise TypeError(f"show must be True or False, got {show!r}")
        self.title = title
        self.gauge = gauge
        self.max_points = max_points
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
        self._last_reading = None
        self._busy = 0.0  # seconds inside step() and redraws
        self._gauge_in_step = 0.0
        self._gauge_busy0 = gauge.busy_seconds if gauge is not None else 0.0
        self._next_draw = 0.0
        self._next_memory = 0.0
        self.redraws = 0
        self.draw_seconds = 0.0
        self.closed = False
        self._fig = None
        self._widget = None
        self._image = None
        self._status = None
        self._handle = None
        self._live = not headless()
        if show and self._live:
            self._display()

    # ------------------------------------------------------------------ recording
    def step(self, loss=None, *, samples: int | None = None, step: int | None = None) -> None:
        """Record one training step.

        Args:
            loss: the step's loss: a float, or a 0-d tensor (converted in batches later,
                so no GPU sync per step).  None if this step has no loss.
            samples: how many samples the step processed (for samples/s).
            step: the x value; default: the number of steps recorded so far.
        """
        t0 = time.perf_counter()
        if self.closed:
            raise RuntimeError("this LivePlot is closed; create a new one for a new run")
        if step is None:
            step = len(self._steps)
        elif isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int, got {type(step).__name__}")
        if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int)
                                    or samples < 0):
            raise ValueError(f"samples must be a non-negative int, got {samples!r}")
        if loss is not None and hasattr(loss, "detach"):
            loss = loss.detach()
        self._steps.append(step)
        self._times.append(t0)
        self._losses.append(loss)
        self._samples.append(samples or 0)
        if self.gauge is not None and t0 >= self._next_memory:
            g0 = time.perf_counter()
            reading = self.gauge.update()
            self._gauge_in_step += time.perf_counter() - g0
            if reading is not self._last_reading:
                self._last_reading = reading
                self._mem.append((step, reading.used_bytes, reading.bands[0][1]))
            self._next_memory = t0 + 0.1
        if len(self._losses) - self._flushed > 4096:  # bound pending tensors, one sync
            self._flush()
        if t0 >= self._next_draw:
            if len(self._steps) == 1:  # first step: draw after min_interval of training
                self._next_draw = t0 + self.min_interval
            elif self._live and threading.current_thread() is threading.main_thread():
                self._draw()
        self._busy += time.perf_counter() - t0

    def _flush(self) -> None:
        new = self._losses[self._flushed:]
        floats = _as_floats(new)
        start = self._flushed
        self._losses[start:] = floats
        for i, value in enumerate(floats, start):
            step = self._steps[i]
            if not math.isnan(value):
                self._loss_series.add(step, value)
            if i > 0:  # samples/s over windows of >= RATE_WINDOW s: readable, not jittery
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
        self._mem_flushed = len(self._mem)

    # ------------------------------------------------------------------ drawing
    def _figure(self):
        if self._fig is None:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure

            n = 3 if self.gauge is not None else 2
            fig = Figure(figsize=(7.0, 1.7 * n + 0.6), dpi=72, facecolor="white")
            FigureCanvasAgg(fig)
            axes = fig.subplots(n, 1, sharex=True)
            fig.subplots_adjust(left=0.11, right=0.97, top=0.93, bottom=0.1, hspace=0.28)
            self._ax = dict(zip(["loss", "memory", "rate"] if n == 3 else ["loss", "rate"],
                                axes, strict=True))
            self._lines = {}
            for ax in self._ax.values():
                ax.set_facecolor("white")
                ax.grid(True, color="#dddddd", linewidth=0.6)
                ax.tick_params(labelsize=8, colors="#333333")
            self._lines["loss"], = self._ax["loss"].plot([], [], color=_COLOURS["loss"])
            self._ax["loss"].set_ylabel("loss", fontsize=9)
            self._lines["rate"], = self._ax["rate"].plot([], [], color=_COLOURS["rate"])
            self._ax["rate"].set_ylabel("samples/s", fontsize=9)
            self._ax["rate"].set_xlabel("step", fontsize=9)
            if "memory" in self._ax:
                self._lines["used"], = self._ax["memory"].plot(
                    [], [], color=_COLOURS["used"], label="used (all processes)")
                self._lines["part"], = self._ax["memory"].plot(
                    [], [], color=_COLOURS["tensors"], linestyle="--")
                self._legend_for = None
            fig.suptitle(self.title or "training", fontsize=10)
            self._fig = fig
        return self._fig

    def _update_artists(self) -> None:
        self._figure()
        xs, ys = self._loss_series.arrays()
        self._lines["loss"].set_data(xs, ys)
        xs, ys = self._rate_series.arrays()
        acc = self._rate_acc
        if acc[3] > 0:  # the window still filling
            xs, ys = xs + [acc[0] / acc[1]], ys + [acc[2] / acc[3]]
        self._lines["rate"].set_data(xs, ys)
        if "memory" in self._ax and self.gauge is not None:
            reading = self.gauge.reading
            unit, scale = ("GiB", GiB) if reading.total_bytes >= GiB else ("MiB", MiB)
            xs, ys = self._used_series.arrays()
            self._lines["used"].set_data(xs, [y / scale for y in ys])
            xs, ys = self._part_series.arrays()
            self._lines["part"].set_data(xs, [y / scale for y in ys])
            if reading.label != self._legend_for:  # the source changed (or first draw)
                # RAM: "used" is the whole machine (other users too): show this process only
                self._lines["used"].set_visible(reading.label != "RAM")
                self._lines["part"].set_label(reading.bands[0][0])
                shown = [ln for ln in (self._lines["used"], self._lines["part"])
                         if ln.get_visible()]
                self._ax["memory"].legend(handles=shown, loc="upper left", fontsize=7,
                                          frameon=False)
                self._legend_for = reading.label
            self._ax["memory"].set_ylabel(f"memory ({unit})", fontsize=9)
            self._ax["memory"].set_title(f"{reading.label}: {reading.source}", fontsize=8,
                                         loc="left", color="#555555")
        for name, ax in self._ax.items():
            ax.relim()
            ax.autoscale_view()
            if name != "loss":
                ax.set_ylim(bottom=0)

    def png(self) -> bytes:
        """The figure as PNG bytes, as it is now (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("matplotlib is only used from the main thread; call png() there")
        self._flush()
        self._update_artists()
        buf = io.BytesIO()
        self._fig.savefig(buf, format="png", facecolor="white")
        return buf.getvalue()

    def _status_html(self, state: str) -> str:
        import html

        s = self.summary()
        parts = [f"step {s.steps}"]
        if s.last_loss is not None:
            parts.append(f"loss {s.last_loss:.3f}")
        if s.samples_per_second is not None:
            parts.append(fmt_rate(s.samples_per_second))
        parts.append(f"plot {100 * s.plot_share:.2f}% + gauge {100 * s.gauge_share:.2f}% "
                     "of training time")
        return (f'<div class="gl-liveplot-status" data-steps="{s.steps}" data-state="{state}" '
                f'data-redraws="{self.redraws}" style="font-family:var(--jp-ui-font-family,'
                f'sans-serif);font-size:12px;color:var(--jp-ui-font-color2,#616161)">'
                f"{html.escape(' · '.join(parts))}</div>")

    def _display(self) -> None:
        from IPython.display import display

        try:
            import ipywidgets
        except ImportError:
            ipywidgets = None
        png = self._timed_png()
        if ipywidgets is None:  # no widgets: a display handle, replaced in place
            self._handle = display({"image/png": png, "text/plain": self.summary().text()},
                                   raw=True, display_id=True)
            return
        self._image = ipywidgets.Image(value=png, format="png")
        self._image.add_class("gl-liveplot-image")
        self._status = ipywidgets.HTML(value=self._status_html("waiting"))
        children = [self._image, self._status]
        if self._show_gauge:
            children.insert(0, self.gauge.widget() or ipywidgets.HTML(self.gauge.html()))
        self._widget = ipywidgets.VBox(children)
        self._widget.add_class("gl-liveplot")
        display(self)

    def _timed_png(self) -> bytes:
        t0 = time.perf_counter()
        png = self.png()
        self.draw_seconds += time.perf_counter() - t0
        self.redraws += 1
        return png

    def _draw(self, state: str = "running") -> None:
        t0 = time.perf_counter()
        png = self._timed_png()
        if self._image is not None:
            self._image.value = png
            self._status.value = self._status_html(state)
        elif self._handle is not None:
            self._handle.update({"image/png": png, "text/plain": self.summary().text()},
                                raw=True)
        cost = time.perf_counter() - t0
        self._next_draw = time.perf_counter() + max(self.min_interval, cost / self.budget)

    def _repr_mimebundle_(self, include=None, exclude=None):
        text = self.summary().text()
        if self._widget is not None:
            bundle = self._widget._repr_mimebundle_()
            bundle["text/plain"] = text
            return bundle
        return {"text/plain": text}

    def __repr__(self) -> str:
        return self.summary().text()

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
        losses = [v for v in self._losses if not math.isnan(v)]
        seconds = self._times[-1] - self._times[0] if n > 1 else 0.0
        rate = sum(self._samples[1:]) / seconds if seconds > 0 and any(self._samples) else None
        gauge_busy = 0.0
        if self.gauge is not None:
            gauge_busy = self.gauge.busy_seconds - self._gauge_busy0
        plot_busy = self._busy - self._gauge_in_step
        span = seconds if seconds > 0 else math.inf
        label = self.gauge.reading.label if self.gauge is not None else None
        # RAM: the machine's "used" includes other users; this process is what matters
        column, what = (2, "this process") if label == "RAM" else (1, "used")
        peak = max((m[column] for m in self._mem), default=None)
        return LivePlotSummary(
            steps=n,
            first_loss=losses[0] if losses else None,
            last_loss=losses[-1] if losses else None,
            lowest_loss=min(losses) if losses else None,
            samples_per_second=rate,
            peak_memory_bytes=peak,
            memory_label=f"{label}, {what}" if label else None,
            memory_total_bytes=self.gauge.reading.total_bytes if label else None,
            overhead_share=(plot_busy + gauge_busy) / span,
            plot_share=plot_busy / span,
            gauge_share=gauge_busy / span,
            redraws=self.redraws,
            seconds=seconds,
        )

    def close(self) -> LivePlotSummary:
        """Draw the final figure and return the summary.  Live: the plot is redrawn in
        place.  Headless: the final PNG is displayed here (one static image)."""
        if not self.closed:
            self.closed = True
            if threading.current_thread() is threading.main_thread():
                if self._image is not None or self._handle is not None:
                    self._draw(state="done")
                elif self._steps and in_kernel():
                    from IPython.display import display

                    display({"image/png": self.png(), "text/plain": (
                        f"[figure: loss, memory and samples/s over {len(self._steps)} steps]")},
                        raw=True)
        return self.summary()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ Keras
    def keras_callback(self, batch_size: int):
        """A Keras callback that records every training batch (``model.fit``).

        Args:
            batch_size: the batch size given to ``fit`` (for samples/s).

        Keras reports the loss as the running mean over the epoch so far, so the curve is
        smoother than a PyTorch per-step loss.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        return _keras_callback_class()(self, batch_size)


_keras_class: list = []


def _keras_callback_class():
    if not _keras_class:
        import keras

        class LivePlotCallback(keras.callbacks.Callback):
            """Sends each training batch's loss to a :class:`LivePlot`."""

            def __init__(self, plot: LivePlot, batch_size: int):
                super().__init__()
                self.plot, self.batch_size = plot, batch_size

            def on_train_batch_end(self, batch, logs=None):
                self.plot.step(loss=(logs or {}).get("loss"), samples=self.batch_size)

        _keras_class.append(LivePlotCallback)
    return _keras_class[0]
