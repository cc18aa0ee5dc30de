"""Issue 15's fuzz cases for the live views: case 3 (poller threads piling up), case 9
(StepTimer's device string), case 11 (huge numbers, psutil missing)."""

import sys
import threading
import time

import pytest

import helpers
from helpers.core.fmt import GiB, MiB
from helpers.watch import gauge
from helpers.watch.liveplot import LivePlot


@pytest.fixture(autouse=True)
def no_pollers_left():
    yield
    for kind in ("gauge", "watch"):
        gauge.stop_poller(kind)


class BlockingVGPU:
    """A virtual GPU whose reading blocks in poller threads until released (a wedged
    driver); readings from other threads answer at once."""

    name = "wedged"
    capacity_bytes = GiB
    reserved_bytes = context_bytes = 0

    def __init__(self):
        self.release = threading.Event()

    @property
    def allocated_bytes(self):
        if threading.current_thread().name.endswith("-poller"):
            self.release.wait(30)
        return MiB


def test_case_3_a_blocked_reading_does_not_pile_up_pollers():
    """Fuzz case 3: re-running MemoryGauge(poll=0.25) while the poller's reading blocks
    left one more thread per re-run (and blocked each re-run 5 s)."""
    vgpu = BlockingVGPU()
    helpers.MemoryGauge(vgpu, poll=0.25)
    time.sleep(0.5)  # the poller is now stuck in its reading
    t0 = time.perf_counter()
    gauges = [helpers.MemoryGauge(vgpu, poll=0.25) for _ in range(4)]
    assert time.perf_counter() - t0 < 1.0  # no join on the stuck thread
    assert gauge.polling_threads() == ["helpers-gauge-poller"]
    assert gauges[-1].polling and not any(g.polling for g in gauges[:-1])
    vgpu.release.set()
    gauges[-1].stop()
    assert gauge.polling_threads() == []


def test_case_3_gauges_created_from_several_threads_leave_one_poller():
    """Fuzz case 3: 4 threads creating MemoryGauge(poll=0.25) x5 at once left up to 5 pollers
    and raised 'cannot join thread before it is started'."""
    errors, start = [], threading.Barrier(4)

    def create():
        start.wait()
        try:
            for _ in range(5):
                helpers.MemoryGauge(poll=0.25)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert gauge.polling_threads() == ["helpers-gauge-poller"]


def test_case_3_a_rejected_gauge_leaves_the_running_one_alone():
    """Fuzz case 3 (widget re-runs): a call that raises must not stop the previous poller."""
    w = helpers.watch_gpus(0.25)
    g = helpers.MemoryGauge(poll=0.25)
    with pytest.raises(ValueError):
        helpers.GpuWatch(interval=0.01)
    with pytest.raises(ValueError):
        helpers.MemoryGauge(source="bogus", poll=0.25)
    assert w.polling and g.polling


@pytest.mark.parametrize("poll", [1e300, float("inf"), 10**400, 86_401])
def test_case_11_huge_poll_intervals_are_refused(poll):
    """Fuzz case 11: MemoryGauge(poll=1e300) was accepted, then its thread died."""
    with pytest.raises(ValueError, match="poll"):
        helpers.MemoryGauge(poll=poll)
    with pytest.raises(ValueError, match="interval"):
        helpers.watch_gpus(poll)
    assert gauge.polling_threads() == []


def test_case_11_without_psutil_views_explain_instead_of_raising(monkeypatch):
    """Fuzz case 11: without psutil, read_memory(), the gauges and LivePlot raised
    ModuleNotFoundError."""
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError
    for source in ("auto", "ram", "cuda"):
        reading = helpers.read_memory(source)
        assert reading.label == "RAM" and "psutil is not installed" in reading.source
        assert "psutil is not installed" in reading.text() and reading.html()
    g = helpers.MemoryGauge(poll=0.25)
    assert "psutil" in g.update(force=True).source
    assert "CPU n/a (psutil is not installed)" in helpers.watch_gpus(None).text()
    plot = LivePlot(show=True)
    for _ in range(5):
        plot.step(loss=1.0, samples=2)
    assert plot.close().text().startswith("LivePlot: 5 steps")
    assert "memory" not in plot.summary().text()
    plot.svg()


def test_case_11_huge_sample_and_step_numbers_are_refused():
    """Fuzz case 11: LivePlot.step(samples=10**400) then summary() raised OverflowError;
    so did StepTimer.step(samples=10**400) and LivePlot.step(step=10**400)."""
    plot = LivePlot(gauge=False, show=False)
    plot.step(loss=1.0, samples=1)
    with pytest.raises(ValueError, match="samples"):
        plot.step(loss=1.0, samples=10**400)
    with pytest.raises(ValueError, match="step"):
        plot.step(loss=1.0, step=10**400)
    with pytest.raises(TypeError, match="loss"):
        plot.step(loss="T2")
    plot.step(loss=1.0, samples=1)
    assert plot.summary().steps == 2 and plot.svg()
    timer = helpers.StepTimer(show=False, gpu_util=False)
    timer.step()
    with pytest.raises(ValueError, match="samples"):
        timer.step(samples=10**400)
    assert timer.summary().text().startswith("StepTimer: 1 steps")


def test_case_11_absurd_virtual_gpu_numbers_fall_back_with_a_reason():
    """Fuzz case 11: a virtual GPU with 10**400 bytes gave OverflowError in text()."""

    class Absurd:
        name = "absurd"
        capacity_bytes = 10**400
        allocated_bytes = reserved_bytes = context_bytes = 0

    reading = helpers.MemoryGauge(Absurd()).reading
    assert reading.label == "RAM" and "capacity_bytes" in reading.detail
    with pytest.raises(ValueError, match="width"):
        reading.bar(-5)
    with pytest.raises(TypeError, match="width"):
        reading.text([])


@pytest.mark.parametrize("sync", ["cuda:x", "cuda:-1", "gpu"])
def test_case_9_step_timer_checks_its_device_string(sync):
    """Fuzz case 9: StepTimer(sync='cuda:x') reached torch (RuntimeError: Invalid device
    string) instead of a clear error."""
    with pytest.raises(ValueError, match="sync"):
        helpers.StepTimer(sync=sync, show=False)
