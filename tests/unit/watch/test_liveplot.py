"""Live training plot: recording, downsampling, throttling, threads, Keras (lesson 04)."""

import io
import math
import re
import threading
import types

import pytest

import helpers
from helpers.core.fmt import GiB, MiB
from helpers.watch import base, gauge, liveplot
from helpers.watch.liveplot import LivePlot, _Series


class StandInVGPU:
    name = "test"
    capacity_bytes = GiB
    allocated_bytes = 64 * MiB
    reserved_bytes = 96 * MiB
    context_bytes = 32 * MiB


@pytest.fixture(autouse=True)
def no_pollers_left():
    yield
    gauge._stop_poller("gauge")


def test_series_merges_buckets_and_keeps_means_and_maxima():
    mean, peak, rate = _Series(8, "mean"), _Series(8, "max"), _Series(8, "rate")
    for i in range(1000):
        mean.add(i, float(i))
        peak.add(i, float(i % 7))
        rate.add(i, 10, 0.5)  # 10 samples in 0.5 s = 20/s
    for s in (mean, peak, rate):
        assert 4 <= len(s) <= 8
    xs, ys = mean.arrays()
    assert xs == ys  # mean of steps == mean of values when value == step
    assert sum(n * y for n, y in zip(mean.n, ys, strict=True)) / 1000 == pytest.approx(499.5)
    assert max(peak.arrays()[1]) == 6.0
    assert set(rate.arrays()[1]) == {20.0}


def points(svg: str, key: str) -> int:
    match = re.search(rf'class="gl-line-{key}" points="([^"]*)"', svg)
    return len(match.group(1).split()) if match and match.group(1) else 0


def test_draw_cost_does_not_grow_with_history():
    """A frame never holds more than max_points per line: after 10,000 steps a redraw
    handles as many points as after 100 (benchmarks/widgets.py times it)."""
    plot = LivePlot(gauge=False, max_points=50, show=False)
    for i in range(10_000):
        plot.step(loss=1.0 / (i + 1), samples=32)
    svg = plot.svg()
    assert 25 <= points(svg, "loss") <= 50
    assert points(svg, "rate") <= 51
    assert len(plot.history["loss"]) == 10_000


def test_summary_line_is_deterministic_apart_from_measured_numbers():
    plot = LivePlot("t", gauge=helpers.MemoryGauge(StandInVGPU()), show=False)
    for i, loss in enumerate([2.0, 1.5, 1.0, 1.25]):
        plot.step(loss=loss, samples=8, step=10 * i)
    s = plot.close()
    assert s.steps == 4 and (s.first_loss, s.last_loss, s.lowest_loss) == (2.0, 1.25, 1.0)
    text = s.text()
    assert text.startswith("LivePlot: 4 steps, loss 2.000 -> 1.250 (lowest 1.000), ~")
    assert "highest memory seen ~0.1 GiB (vGPU, used)" in text
    assert text.endswith("% of training time")
    assert repr(s) == text
    assert plot.history["step"] == [0, 10, 20, 30]
    with pytest.raises(RuntimeError, match="closed"):
        plot.step(loss=1.0)


class GPULoss:
    """Stands in for a CUDA loss tensor: .item() would make the CPU wait for the GPU."""

    items = 0
    device = types.SimpleNamespace(type="cuda")

    def __init__(self, value):
        self.value = value

    def detach(self):
        return self

    def item(self):
        GPULoss.items += 1
        return self.value


def test_gpu_losses_are_converted_at_redraws_not_per_step():
    plot = LivePlot(gauge=False, show=False)
    GPULoss.items = 0
    for i in range(5):
        plot.step(loss=GPULoss(float(i)))
    assert GPULoss.items == 0 and len(plot._losses) == 5  # no sync yet
    assert plot.history["loss"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    for _ in range(300):  # at most 256 pending: a long run between redraws stays bounded
        plot.step(loss=GPULoss(1.0))
    assert len(plot._losses) - plot._flushed <= 256


def test_cpu_tensor_losses_are_read_at_once_and_keep_nothing_alive():
    import torch

    plot = LivePlot(gauge=False, show=False)
    w = torch.ones(3, requires_grad=True)
    for i in range(5):
        plot.step(loss=(w * i).sum())
    assert plot._losses == [0.0, 3.0, 6.0, 9.0, 12.0]
    fake = torch.empty((), device="meta")  # no data, like full-scale fake tensors
    plot.step(loss=fake)
    assert math.isnan(plot.history["loss"][-1])


def test_steps_without_loss_or_samples_are_fine():
    plot = LivePlot(gauge=False, show=False)
    for _ in range(3):
        plot.step()
    s = plot.summary()
    assert s.steps == 3 and s.first_loss is None and s.samples_per_second is None
    assert math.isnan(plot.history["loss"][0])


@pytest.mark.parametrize("kwargs, match", [
    ({"min_interval": 0.01}, "min_interval"),
    ({"budget": 0}, "budget"),
    ({"budget": 0.9}, "budget"),
    ({"max_points": 5}, "max_points"),
    ({"gauge": "yes"}, "gauge"),
    ({"show": 1}, "show"),
])
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        LivePlot(**kwargs)


def test_bad_steps_are_rejected():
    plot = LivePlot(gauge=False, show=False)
    with pytest.raises(ValueError, match="samples"):
        plot.step(loss=1.0, samples=-1)
    with pytest.raises(TypeError, match="step"):
        plot.step(loss=1.0, step=1.5)
    with pytest.raises(TypeError, match="title"):
        LivePlot(3)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_redraws_are_throttled_by_time_and_budget(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(liveplot.time, "perf_counter", clock)
    plot = LivePlot(gauge=False, show=False, min_interval=0.5, budget=0.01)
    plot._widget = types.SimpleNamespace(value="")  # shown live
    plot._last_cost = 0.02  # as measured by the first frame when the plot is shown
    draws = []

    def slow_frame():  # every live frame takes 20 ms
        draws.append(clock.now)
        clock.now += 0.02
        return "<svg></svg>"

    monkeypatch.setattr(plot, "svg", slow_frame)
    for _ in range(20_000):  # 20 s of 1 ms steps
        plot.step(loss=1.0, samples=1)
        clock.now += 0.001
    elapsed = clock.now - plot._times[0]
    # redraws never took more than 1% of the training time so far (plus the one in flight)
    for i, t in enumerate(draws):
        assert 0.02 * i <= 0.01 * (t - plot._times[0]) + 1e-9
    assert 0.02 * len(draws) <= 0.01 * elapsed + 0.02
    assert len(draws) >= 8  # ... yet the plot stays live: every ~2 s here
    assert all(b - a >= 0.5 for a, b in zip(draws, draws[1:], strict=False))
    s = plot.summary()
    assert s.plot_share < 0.02 and s.redraws == len(draws)


def test_live_frames_are_themed_svg_with_limits_that_never_shrink():
    plot = LivePlot("svg <test>", gauge=helpers.MemoryGauge(StandInVGPU()), total=1000,
                    show=False)
    for i in range(200):
        plot.step(loss=2.0 - i / 300, samples=8)
    svg = plot.svg()
    assert svg.startswith('<svg class="gl-liveplot-svg"') and svg.endswith("</svg>")
    assert "svg &lt;test&gt;" in svg  # the title is escaped
    assert "var(--jp-ui-font-color1" in svg and "var(--jp-border-color2" in svg
    assert points(svg, "loss") == 200 and points(svg, "used") >= 1
    assert ">used (all processes)</text>" in svg and ">tensors</text>" in svg
    assert "vGPU: virtual GPU" in svg and "memory (GiB)" in svg
    assert ">1000</text>" in svg and ">step</text>" in svg
    assert plot._live_limits["x"] == (0.0, 1000)  # total fixes the x-axis
    loss_hi = plot._live_limits["loss"][1]
    assert loss_hi == 2.5
    plot.step(loss=0.1)
    plot.svg()
    assert plot._live_limits["loss"][1] == loss_hi  # never shrinks: no jumping picture
    plot.step(loss=7.0)
    plot.svg()
    assert plot._live_limits["loss"][1] == 8.0
    for _ in range(1000):  # more steps than expected: the axis grows past total
        plot.step(loss=1.0)
    plot.svg()
    assert plot._live_limits["x"] == (0.0, 1500)


def test_ram_memory_panel_shows_this_process_only():
    plot = LivePlot(gauge=helpers.MemoryGauge("ram"), show=False)
    plot.step(loss=1.0)
    svg = plot.svg()
    assert ">this process</text>" in svg and "gl-line-used" not in svg


@pytest.mark.parametrize("value, text", [(0, "0"), (0.125, "0.125"), (2.5, "2.5"),
                                         (420, "420"), (12_500, "12.5k"), (3e6, "3M")])
def test_tick_labels(value, text):
    assert liveplot._tick(value) == text


@pytest.mark.parametrize("value, nice", [(0, 1.0), (0.7, 0.8), (1, 1), (1.1, 1.25),
                                         (3301, 4000), (9e6, 1e7), (float("nan"), 1.0)])
def test_nice_axis_limits(value, nice):
    assert liveplot._nice(value) == pytest.approx(nice)


def test_matplotlib_is_only_touched_from_the_main_thread(monkeypatch):
    plot = LivePlot(gauge=False, show=False, min_interval=0.1)
    plot._widget = types.SimpleNamespace(value="")  # shown live
    threads = []
    monkeypatch.setattr(plot, "_tick", lambda: threads.append(threading.current_thread()))
    plot._next = 0.0
    plot.step(loss=1.0)  # first step schedules the first redraw
    plot._next = 0.0

    def worker():
        for _ in range(100):
            plot.step(loss=1.0)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert threads == []
    errors = []

    def draw_elsewhere():
        try:
            plot.png()
        except RuntimeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=draw_elsewhere)
    t.start()
    t.join()
    assert errors and "main thread" in errors[0]
    plot.step(loss=1.0)
    assert threads == [threading.main_thread()]


def test_png_paints_its_own_white_background():
    from PIL import Image

    plot = LivePlot(gauge=helpers.MemoryGauge(StandInVGPU()), show=False)
    for i in range(20):
        plot.step(loss=1.0 / (i + 1), samples=4)
    image = Image.open(io.BytesIO(plot.png())).convert("RGBA")
    assert image.getpixel((1, 1)) == (255, 255, 255, 255)
    assert image.size[0] <= 600  # small enough to store in a notebook


def test_own_cost_is_measured_and_split_between_plot_and_gauge():
    g = helpers.MemoryGauge(StandInVGPU())
    plot = LivePlot(gauge=g, show=False)
    for _ in range(2000):
        plot.step(loss=1.0, samples=1)
    s = plot.summary()
    assert s.plot_share > 0 and s.gauge_share >= 0
    assert s.overhead_share == pytest.approx(s.plot_share + s.gauge_share)


def test_live_mode_builds_one_widget_and_updates_it_in_place(monkeypatch):
    monkeypatch.setattr(base, "headless", lambda: False)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: shown.append(a))
    plot = LivePlot("live", min_interval=0.1)
    assert len(shown) == 1 and shown[0][0] is plot
    assert "gl-liveplot" in plot._box._dom_classes
    first = plot._widget.value
    assert 'data-state="waiting"' in first and "<svg" in first
    for i in range(50):
        plot.step(loss=1.0 / (i + 1), samples=4)
    plot.close()
    assert len(shown) == 1  # still one output: the frame was replaced, not appended
    final = plot._widget.value
    assert final != first and 'data-state="done"' in final and 'data-steps="50"' in final
    assert points(final, "loss") == 50
    bundle = plot._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_a_slow_display_does_not_hold_back_the_first_live_frames(monkeypatch):
    # Showing the plot (widget, comm, front end) takes 2 s on a busy machine; a frame 1 ms.
    # The budget is estimated from one frame, so live frames still come every min_interval.
    clock = Clock()
    monkeypatch.setattr(liveplot.time, "perf_counter", clock)
    monkeypatch.setattr(base.time, "perf_counter", clock)
    monkeypatch.setattr(base, "headless", lambda: False)

    def slow_display(*args, **kwargs):
        clock.now += 2.0

    monkeypatch.setattr("IPython.display.display", slow_display)
    plot = LivePlot("busy", gauge=False, show=False, min_interval=0.5, budget=0.01)
    draws = []

    def frame():
        draws.append(clock.now)
        clock.now += 0.001
        return "<svg></svg>"

    monkeypatch.setattr(plot, "svg", frame)
    plot.show()
    assert plot._last_cost == pytest.approx(0.001)
    for _ in range(3000):  # 3 s of 1 ms steps
        plot.step(loss=1.0, samples=1)
        clock.now += 0.001
    assert len(draws) >= 1 + 4  # the first frame, then one about every 0.5 s


def test_keras_callback_records_every_batch():
    pytest.importorskip("tensorflow", reason="TensorFlow is not installed")
    from helpers.core.environment import quiet_tensorflow_env

    quiet_tensorflow_env()
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(96, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    plot = LivePlot(gauge=False, show=False)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0,
              callbacks=[plot.keras_callback(batch_size=32)])
    s = plot.close()
    assert s.steps == 6 and s.first_loss is not None
    assert plot.history["samples"] == [32] * 6
    with pytest.raises(ValueError, match="batch_size"):
        plot.keras_callback(batch_size=0)


def test_without_ipywidgets_a_display_handle_is_updated_in_place(monkeypatch):
    monkeypatch.setattr(base, "headless", lambda: False)
    monkeypatch.setitem(__import__("sys").modules, "ipywidgets", None)  # not installed
    handles = []

    class Handle:
        def __init__(self, bundle):
            self.bundles = [bundle]

        def update(self, bundle, raw=False):
            self.bundles.append(bundle)

    def display(bundle, raw=False, display_id=False):
        handles.append(Handle(bundle))
        return handles[-1]

    monkeypatch.setattr("IPython.display.display", display)
    plot = LivePlot("no widgets", gauge=False, min_interval=0.1)
    for i in range(20):
        plot.step(loss=1.0 / (i + 1), samples=4)
    plot.close()
    assert len(handles) == 1  # one output, replaced in place
    frames = handles[0].bundles
    assert 'data-state="waiting"' in frames[0]["text/html"]
    assert 'data-state="done"' in frames[-1]["text/html"]
    assert frames[-1]["text/plain"].startswith("LivePlot: 20 steps")
