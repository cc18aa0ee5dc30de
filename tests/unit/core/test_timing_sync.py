"""GPU timings read the clock only after the GPU has finished.

CUDA kernels run asynchronously: a clock read right after launching work measures how fast
Python queued it, not how long the GPU took. Every timing helper therefore goes through one
path, ``helpers.core.timing.sync_function``, and synchronises before each clock read that closes a
timing. These tests rehearse the CUDA branch on a CPU: ``torch.cuda.is_available`` says True,
``torch.cuda.synchronize`` and ``time.perf_counter`` write into one ordered event log, and the
workloads log "work". A clock read after work with no synchronize in between is a bug.
"""

import time

import pytest
import torch

import helpers
from helpers import throughput
from helpers.core import nvml, timing


class EventLog:
    """One ordered log of work, synchronize and clock events."""

    def __init__(self):
        self.events: list[tuple] = []

    def work(self, samples=1):
        def fn():
            self.events.append(("work",))
            return samples
        return fn

    def kinds(self):
        return [e[0] for e in self.events]

    def unsynced_clock_reads(self) -> list[int]:
        """Indices of clock reads that follow work with no synchronize since that work."""
        dirty, bad = False, []
        for i, event in enumerate(self.events):
            if event[0] == "work":
                dirty = True
            elif event[0] == "sync":
                dirty = False
            elif event[0] == "clock" and dirty:
                bad.append(i)
        return bad

    def closing_clock_reads(self) -> int:
        """How many clock reads come after some work (each one closes a timing)."""
        seen_work, n = False, 0
        for event in self.events:
            seen_work = seen_work or event[0] == "work"
            n += event[0] == "clock" and seen_work
        return n


@pytest.fixture
def fake_cuda(monkeypatch):
    """A CPU machine that says it has 2 CUDA GPUs; synchronize and the clock are logged."""
    log = EventLog()
    real_clock = time.perf_counter
    ticks = iter(range(10**6))

    def clock():
        log.events.append(("clock",))
        return real_clock() + next(ticks)  # strictly increasing, so no timing is zero

    def synchronize(device=None):
        log.events.append(("sync", None if device is None else str(torch.device(device))))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(nvml, "nvml_status", lambda: (False, "no driver (test)"))
    return log


def assert_synced(log: EventLog, min_timings: int):
    assert log.closing_clock_reads() >= min_timings, log.kinds()
    bad = log.unsynced_clock_reads()
    assert not bad, f"clock read without a synchronize after work at {bad}: {log.kinds()}"


def test_compare_synchronises_before_each_clock_read(fake_cuda):
    log = fake_cuda
    result = helpers.compare({"a": log.work(8), "b": log.work(8)}, rounds=2, sync="cuda")
    assert [r.samples for r in result.rows] == [8, 8]
    assert_synced(log, min_timings=4)  # 2 rungs x 2 rounds
    assert ("sync", "cuda") in log.events


def test_compare_syncs_the_device_it_is_given(fake_cuda):
    log = fake_cuda
    helpers.compare({"a": log.work()}, rounds=1, sync=torch.device("cuda:1"))
    assert {e for e in log.events if e[0] == "sync"} == {("sync", "cuda:1")}
    assert_synced(log, min_timings=1)


def test_compare_times_synchronises_before_each_clock_read(fake_cuda):
    log = fake_cuda
    times = helpers.compare_times({"a": log.work(), "b": log.work()}, rounds=3, number=2,
                                  warmup=1, sync="cuda:0")
    assert len(times.samples["a"]) == 3
    assert_synced(log, min_timings=6)
    assert {e for e in log.events if e[0] == "sync"} == {("sync", "cuda:0")}


def test_step_timer_synchronises_before_each_clock_read(fake_cuda):
    log = fake_cuda
    work = log.work()
    timer = helpers.StepTimer(sync="cuda", show=False)
    for _ in timer.wrap(range(3)):
        work()
        timer.step(samples=1)
    assert timer.summary().steps == 3
    assert_synced(log, min_timings=3)


def test_the_rehearsal_catches_a_missing_sync(fake_cuda):
    """The check above can fail: without ``sync`` the CUDA work is timed unsynchronised."""
    log = fake_cuda
    helpers.compare({"a": log.work()}, rounds=1)
    assert "sync" not in log.kinds()
    assert log.unsynced_clock_reads()


def test_sync_function_is_public_and_the_one_path():
    assert "sync_function" in timing.__all__
    assert not hasattr(throughput, "_sync_function")  # no private import from timing
    assert timing.sync_function(None) is None
    assert timing.sync_function("cpu") is None
    assert timing.sync_function(torch.device("cpu")) is None
    assert timing.sync_function(print) is print


@pytest.mark.parametrize("bad", ["cuda:x", "cuda:", "cuda:-1", "cuda:0:1"])
def test_malformed_cuda_strings_are_value_errors_naming_sync(fake_cuda, bad):
    with pytest.raises(ValueError, match="sync"):
        timing.sync_function(bad)


def test_a_gpu_index_this_machine_lacks_is_a_value_error(fake_cuda):
    with pytest.raises(ValueError, match=r"sync.*cuda:2.*2 CUDA GPU"):
        timing.sync_function("cuda:2")


@pytest.mark.parametrize("sync", ["cuda", "cuda:0"])
def test_cuda_without_cuda_is_a_clear_value_error(monkeypatch, sync):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def must_not_be_called(*args):
        raise AssertionError("reached torch.cuda.synchronize")

    monkeypatch.setattr(torch.cuda, "synchronize", must_not_be_called)
    with pytest.raises(ValueError, match="sync.*no usable CUDA GPU"):
        timing.sync_function(sync)
    with pytest.raises(ValueError, match="sync.*no usable CUDA GPU"):
        helpers.compare({"a": lambda: 1}, sync=sync)
