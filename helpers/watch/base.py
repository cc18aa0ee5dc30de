"""One live view under every widget of the kit: MemoryGauge, GpuWatch, LivePlot, StepTimer.

A :class:`LiveView` shows its state one way or another, depending on who is watching:

* **a live notebook** (JupyterLab, Notebook 7, VS Code): one ``ipywidgets.HTML`` whose value is
  replaced in place on every update (one output, no flicker); without ipywidgets, a display
  handle updated in place;
* **headless** (nbval, nbconvert, ``make outputs``, scripts): plain text (``text()``) and, for
  the views that draw one, a single static PNG shown by ``close()``, so stored outputs are
  what the tests see.

Watching must never slow training down noticeably, so every view shares one throttle:
``update()`` redraws at most every ``min_interval`` seconds, and only while the redraws so far
(plus the next, estimated by the last) fit in ``budget`` of the time since the view started.

Gauges can also update from a background thread (:meth:`LiveView.start`).  There is exactly
one poller thread per kind ("gauge", "watch"): starting a new view's poller hands the running
thread to it instead of starting another, so re-running a cell, a reading that blocks (a
wedged driver) or views created from several threads at once never pile threads up.
"""

from __future__ import annotations

import io
import threading
import time

from ..core.checks import real_number
from ..core.runtime import headless, in_kernel

__all__ = ["LiveView", "polling_threads", "stop_poller", "check_interval", "new_figure",
           "png_bytes", "MIN_POLL_INTERVAL", "MAX_POLL_INTERVAL"]

MIN_POLL_INTERVAL = 0.25  # seconds; faster polling only burns the CPU the training needs
MAX_POLL_INTERVAL = 24 * 3600.0  # a day: anything longer is a typo (and overflows a wait)


def check_interval(value, name: str = "interval") -> float:
    """A polling interval in seconds, from 0.25 s to a day."""
    return real_number(value, name, MIN_POLL_INTERVAL, MAX_POLL_INTERVAL)


def new_figure(width: float, height: float):
    """A matplotlib Figure through its object API (no pyplot state), on its own white
    background: the closing PNG reads the same on light and dark themes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=72, facecolor="white")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor="white")
    return buf.getvalue()


# -------------------------------------------------------------------------------- pollers
class _Poller(threading.Thread):
    """Calls ``view.update()`` every ``interval`` seconds until its view is taken away (a
    new view of its kind takes it over instead of starting another thread)."""

    def __init__(self, kind: str, view, interval: float):
        super().__init__(name=f"helpers-{kind}-poller", daemon=True)
        self.kind, self.view, self.interval, self.wake = kind, view, interval, threading.Event()

    def run(self):
        while True:
            self.wake.wait(self.interval)
            with _pollers_lock:
                self.wake.clear()
                view = self.view
                if view is None:  # stopped: leave the registry as this thread ends
                    if _pollers.get(self.kind) is self:
                        del _pollers[self.kind]
                    return
            try:
                view.update()  # throttled like any update: a slow front end slows the poller
            except Exception:  # noqa: BLE001 - a poller must never die noisily
                pass


_pollers: dict[str, _Poller] = {}
_pollers_lock = threading.Lock()


def _start_poller(kind: str, view, interval: float) -> None:
    with _pollers_lock:
        poller = _pollers.get(kind)
        if poller is not None and poller.is_alive():  # hand the running thread over
            poller.view, poller.interval = view, interval
            poller.wake.set()
            return
        poller = _pollers[kind] = _Poller(kind, view, interval)
        poller.start()  # inside the lock: nobody can see (or join) a thread not started


def stop_poller(kind: str, owner=None) -> None:
    """Stop the ``kind`` poller (only if it polls ``owner``, when given).  Waits up to 1 s
    for the thread to end; a thread stuck in a reading ends when the reading returns, and
    until then a new view of this kind reuses it."""
    with _pollers_lock:
        poller = _pollers.get(kind)
        if poller is None or (owner is not None and poller.view is not owner):
            return
        poller.view = None
        poller.wake.set()
    if poller is not threading.current_thread():
        poller.join(timeout=1)


def polling_threads() -> list[str]:
    """Names of the gauge/watch polling threads alive now (at most one of each kind)."""
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith("helpers-") and t.name.endswith("-poller"))


# ----------------------------------------------------------------------------- the view
class LiveView:
    """What every live widget shares: throttle, in-place widget, headless text/PNG on close.

    Subclasses set ``kind`` and implement ``_frame()`` (HTML of the current state) and
    ``text()``; optionally ``_refresh()`` (read new data before a redraw), ``_value()`` (what
    ``update()`` and ``close()`` return), ``png()`` with ``_figure_caption()`` (a final static
    figure), and ``_container()`` (what is displayed around the in-place HTML).
    """

    kind = "view"
    static_html = False  # headless displays add the static HTML frame to the text
    png_when_live = False  # close() shows the PNG in a live notebook too (after the widget)

    def _init_view(self, min_interval: float = MIN_POLL_INTERVAL, budget: float = 0.005):
        self.min_interval, self.budget = min_interval, budget
        self._lock = threading.RLock()
        self._widget = None  # the ipywidgets.HTML updated in place
        self._box = None  # what is displayed around it (LivePlot: with its gauge)
        self._handle = None  # a display handle, where ipywidgets is missing
        self._start = time.perf_counter()  # the budget counts from here
        self._spent = 0.0  # time of the updates counted against the budget
        self._last_cost = 0.0  # the last update's: the estimate of the next one
        self._next = 0.0
        self.busy_seconds = 0.0  # reading and rendering: wall time (main), CPU time (poller)
        self.updates = 0
        self.closed = False

    # ---------------------------------------------------------------- subclass hooks
    def _refresh(self) -> None:
        """Read new data before a redraw (default: nothing to read)."""

    def _frame(self) -> str:  # pragma: no cover - subclasses
        raise NotImplementedError

    def text(self) -> str:  # pragma: no cover - subclasses
        raise NotImplementedError

    def _value(self):
        return None

    def _figure_caption(self) -> str:
        """The text/plain beside the PNG that close() shows; "" for no figure."""
        return ""

    def png(self) -> bytes:  # pragma: no cover - views with a figure
        raise NotImplementedError

    def _container(self, html_widget):
        return html_widget

    # ---------------------------------------------------------------- the widget
    def widget(self):
        """The ipywidgets.HTML showing this view (created on first use), or None headless
        or without ipywidgets."""
        if self._widget is None and not headless():
            try:
                import ipywidgets
            except ImportError:
                return None
            self._widget = ipywidgets.HTML(value=self._timed_frame())
            self._widget.add_class(f"gl-{self.kind}-widget")
        return self._widget

    @property
    def _live(self) -> bool:
        """True once shown in a live notebook: a widget or a display handle to update."""
        return self._widget is not None or self._handle is not None

    def _shown(self):
        if self._box is None and self.widget() is not None:
            self._box = self._container(self._widget)
        return self._box

    def show(self) -> None:
        """Display the view now, in a live notebook (headless: nothing, close() shows it)."""
        if headless():
            return
        from IPython.display import display

        if self._shown() is not None:
            display(self)
        else:  # no ipywidgets: a display handle, replaced in place
            self._handle = display({"text/html": self._timed_frame(), "text/plain": self.text()},
                                   raw=True, display_id=True)

    def _timed_frame(self) -> str:
        """The first frame, timed: its cost estimates the next frames'.  Creating the widget
        and displaying it happen once and can take far longer on a busy machine; counted
        against the budget they would hold back the first live frames for seconds."""
        c0 = time.perf_counter()
        frame = self._frame()
        self._last_cost = time.perf_counter() - c0
        return frame

    def _repr_mimebundle_(self, include=None, exclude=None):
        shown = self._shown()
        if shown is not None:
            bundle = shown._repr_mimebundle_()
        else:
            bundle = {"text/html": self._frame()} if self.static_html else {}
        bundle["text/plain"] = self.text()
        return bundle

    def __repr__(self) -> str:
        return self.text()

    # ---------------------------------------------------------------- updating
    def update(self, force: bool = False):
        """Read again and redraw, unless the last update was less than ``min_interval``
        seconds ago or the updates would exceed ``budget`` of the time (``force=True``
        skips that throttle).  Cheap enough to call every training step."""
        if force or time.perf_counter() >= self._next:
            self._tick()
        return self._value()

    def _tick(self) -> None:
        # The main thread's updates delay training by their wall time.  A poller's run
        # beside it and take from training only the CPU time they use (and hold the GIL
        # for): count that, not the wall time a busy machine stretches them to.
        clock = (time.perf_counter if threading.current_thread() is threading.main_thread()
                 else time.thread_time)
        with self._lock:
            c0 = clock()
            self._refresh()
            frame = self._frame() if self._live else None
            if self._widget is not None:
                self._widget.value = frame
            elif self._handle is not None:
                self._handle.update({"text/html": frame, "text/plain": self.text()}, raw=True)
            cost = clock() - c0
            self.busy_seconds += cost
            self._spent += cost
            self._last_cost = cost
            self.updates += 1
            self._schedule(time.perf_counter())

    def _schedule(self, now: float) -> None:
        """Next update: after min_interval, and only once the updates so far plus the next
        one (estimated by the last) fit in ``budget`` of the time since the start."""
        afford = self._start + (self._spent + self._last_cost) / self.budget
        self._next = max(now + self.min_interval, afford)

    # ---------------------------------------------------------------- polling
    def start(self, interval: float = 0.5) -> None:
        """Update from a background thread every ``interval`` seconds (0.25 s to a day).
        Only one poller of each kind runs: starting this one stops any older view's."""
        _start_poller(self.kind, self, check_interval(interval))

    def stop(self) -> None:
        """Stop this view's background poller (if it has one)."""
        stop_poller(self.kind, owner=self)

    @property
    def polling(self) -> bool:
        poller = _pollers.get(self.kind)
        return poller is not None and poller.view is self and poller.is_alive()

    # ---------------------------------------------------------------- closing
    def close(self):
        """Finish: stop polling and draw the final frame in place (live); headless, show
        the final figure as one static PNG.  Returns what :meth:`update` returns."""
        if not self.closed:
            self.closed = True
            self.stop()
            main = threading.current_thread() is threading.main_thread()
            live = self._live
            if live and main:
                self._tick()
            caption = self._figure_caption()
            if caption and main and in_kernel() and (self.png_when_live or not live):
                from IPython.display import display

                display({"image/png": self.png(), "text/plain": caption}, raw=True)
        return self._value()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
