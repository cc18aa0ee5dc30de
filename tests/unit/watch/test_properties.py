"""Property tests for the live views' constructors and readers: every valid
input works, every bad one raises only ValueError or TypeError naming the argument."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import helpers
from helpers.core.fmt import GiB
from helpers.watch import gauge
from helpers.watch.liveplot import LivePlot

anything = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.lists(st.integers(), max_size=2), st.just(object()))


@pytest.fixture(autouse=True)
def no_pollers_left():
    yield
    for kind in ("gauge", "watch"):
        gauge.stop_poller(kind)


def accepted_or_named(fn, *names):
    """Run fn(); a failure must be ValueError/TypeError whose message names the argument."""
    try:
        return fn()
    except (ValueError, TypeError) as exc:
        assert any(name in str(exc) for name in names), exc
        return None


class StandInVGPU:
    name = "prop"
    capacity_bytes = GiB
    allocated_bytes = reserved_bytes = context_bytes = 0


@given(source=anything, width=anything)
def test_memory_gauge_source_and_width(source, width):
    g = accepted_or_named(lambda: helpers.MemoryGauge(source, width=width), "source", "width")
    if g is not None:
        assert g.text().startswith(("RAM", "GPU", "vGPU"))
        assert not g.polling


@given(poll=anything)
def test_memory_gauge_poll(poll):
    g = accepted_or_named(lambda: helpers.MemoryGauge(StandInVGPU(), poll=poll), "poll")
    if g is not None and poll is not None:
        assert 0.25 <= poll <= 86_400 and g.polling
        g.stop()


@given(interval=anything, width=anything)
def test_gpu_watch_interval_and_width(interval, width):
    w = accepted_or_named(lambda: helpers.GpuWatch(interval, width=width), "interval", "width")
    if w is not None:
        assert w.text() and w.html().startswith('<div class="gl-watch"')
        w.stop()


@given(interval=anything)
def test_watch_gpus_interval(interval):
    w = accepted_or_named(lambda: helpers.watch_gpus(interval), "interval")
    if w is not None:
        w.stop()


@given(source=anything)
def test_read_memory_source(source):
    reading = accepted_or_named(lambda: helpers.read_memory(source), "source")
    if reading is not None:
        assert reading.used_bytes >= 0 and reading.text()


@given(width=anything)
def test_reading_bar_and_text_width(width):
    reading = helpers.read_memory(StandInVGPU())
    accepted_or_named(lambda: reading.text(width), "width")
    accepted_or_named(lambda: reading.bar(width), "width")


@given(title=anything, total=anything, min_interval=anything, budget=anything,
       max_points=anything, show=anything)
def test_live_plot_arguments(title, total, min_interval, budget, max_points, show):
    plot = accepted_or_named(
        lambda: LivePlot(title, total=total, gauge=False, min_interval=min_interval,
                         budget=budget, max_points=max_points, show=show),
        "title", "total", "min_interval", "budget", "max_points", "show")
    if plot is not None:
        plot.step(loss=1.0, samples=1)
        assert plot.close().steps == 1


@given(loss=anything, samples=anything, step=anything)
def test_live_plot_step_arguments(loss, samples, step):
    plot = LivePlot(gauge=False, show=False)
    accepted_or_named(lambda: plot.step(loss=loss, samples=samples, step=step),
                      "loss", "samples", "step")
    plot.step(loss=0.5, samples=2)
    s = plot.summary()
    assert s.text().startswith("LivePlot:") and plot.svg().endswith("</svg>")
    assert s.samples_per_second is None or math.isfinite(s.samples_per_second)


@given(sync=anything, gpu_util=anything, show=anything, min_interval=anything)
def test_step_timer_arguments(sync, gpu_util, show, min_interval):
    if callable(sync):
        return
    timer = accepted_or_named(
        lambda: helpers.StepTimer(sync, gpu_util=gpu_util, show=show,
                                  min_interval=min_interval),
        "sync", "gpu_util", "show", "min_interval")
    if timer is not None:
        timer.step(samples=1)
        assert timer.close().steps == 1


@given(samples=anything, last=anything)
def test_step_timer_step_and_html(samples, last):
    timer = helpers.StepTimer(show=False, gpu_util=False)
    accepted_or_named(lambda: timer.step(samples=samples), "samples")
    accepted_or_named(lambda: timer.html(last), "last")
    assert timer.summary().text().startswith("StepTimer:")
