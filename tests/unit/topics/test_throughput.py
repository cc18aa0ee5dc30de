"""Throughput tools: slow data set, step timer, side-by-side comparison, recorded results
(lesson 09).  Timing logic is tested on a fake clock, never against thresholds."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import helpers
from helpers import throughput
from helpers.core import nvml, timing
from helpers.core.recorded import KIND
from helpers.throughput import (
    Comparison,
    RungResult,
    SlowDataset,
    StepTimer,
    StepTimes,
    compare,
    throughput_gpu_results,
)

ROOT = Path(__file__).resolve().parents[3]


class FakeClock:
    """Stands in for time.perf_counter; tests move it forward by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(throughput.time, "perf_counter", fake)
    return fake


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setattr(nvml, "nvml_status", lambda: (False, "no driver (test)"))


class SlowIterable:
    """Each next() takes `waits[i]` seconds of fake time."""

    def __init__(self, clock, waits):
        self.clock, self.waits = clock, waits

    def __iter__(self):
        for i, wait in enumerate(self.waits):
            self.clock.advance(wait)
            yield i


# ------------------------------------------------------------------ SlowDataset
def test_slow_dataset_is_deterministic_and_decodes_bytes_to_floats():
    a, b = SlowDataset(16, n_features=8, latency_s=0), SlowDataset(16, n_features=8, latency_s=0)
    assert len(a) == 16 and a.raw.dtype == np.uint8
    x, y = a[3]
    assert x.dtype == np.float32 and x.shape == (8,) and isinstance(y, np.int64)
    np.testing.assert_array_equal(x, b[3][0])
    np.testing.assert_array_equal(a.decode(-1)[0], a.decode(15)[0])
    original, _ = helpers.classification_data(16, 8, 10, seed=0, noise=12.0)
    assert np.abs(x - original[3]).max() <= 0.5 / a.scale + 1e-6  # quantised to bytes
    assert "16 samples x 8 features" in repr(a) and "0 ms I/O" in repr(a)


def test_batched_fetch_matches_single_fetch_and_waits_for_the_whole_batch():
    ds = SlowDataset(32, n_features=4, latency_s=0.005)
    start = time.perf_counter()
    batch = ds.__getitems__([5, 1, 7, 2])
    assert time.perf_counter() - start >= 4 * 0.005  # sleep never returns early
    for (xb, yb), i in zip(batch, [5, 1, 7, 2], strict=True):
        x, y = ds.decode(i)
        np.testing.assert_array_equal(xb, x)
        assert yb == y
    x, y = ds.load_batch(np.array([5, 1, 7, 2]))
    assert x.shape == (4, 4) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(x[0], ds.decode(5)[0])


@pytest.mark.parametrize("kwargs, error", [
    ({"latency_s": -1}, "latency_s"), ({"latency_s": float("nan")}, "latency_s"),
    ({"n_samples": 0}, "n_samples"), ({"latency_s": True}, "latency_s"),
    ({"latency_s": 1e300}, "latency_s"),  # fuzz case 11: time.sleep would overflow
])
def test_slow_dataset_rejects_bad_arguments(kwargs, error):
    with pytest.raises((TypeError, ValueError), match=error):
        SlowDataset(**kwargs)


def test_slow_dataset_rejects_bad_indices():
    ds = SlowDataset(4, n_features=2, latency_s=0)
    with pytest.raises(IndexError, match="out of range for a data set of 4"):
        ds.decode(4)
    with pytest.raises(TypeError, match="index must be an int"):
        ds.decode(1.5)


def test_dataloader_workers_give_the_same_batches():
    import torch
    from torch.utils.data import DataLoader

    ds = SlowDataset(64, n_features=4, latency_s=0)

    def batches(**kw):
        loader = DataLoader(ds, batch_size=16, shuffle=True,
                            generator=torch.Generator().manual_seed(1), **kw)
        return [(x, y) for x, y in loader]

    plain, parallel = batches(), batches(num_workers=2)
    assert len(plain) == 4
    for (x0, y0), (x1, y1) in zip(plain, parallel, strict=True):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
        assert x0.dtype == torch.float32 and y0.dtype == torch.int64


# ------------------------------------------------------------------ StepTimer
def test_step_timer_splits_wait_from_compute(clock, no_nvml):
    timer = StepTimer(show=False)
    for i in timer.wrap(SlowIterable(clock, [0.030, 0.010, 0.020])):
        clock.advance([0.010, 0.030, 0.020][i])  # the "training step"
        timer.step(samples=64)
    assert timer.wait_s == pytest.approx([0.030, 0.010, 0.020])
    assert timer.compute_s == pytest.approx([0.010, 0.030, 0.020])
    s = timer.close()
    assert (s.steps, s.samples) == (3, 192)
    assert s.wait_share == pytest.approx(0.5) and s.samples_per_second == pytest.approx(1600)
    assert s.bound == "input-bound"
    assert s.text() == ("StepTimer: 3 steps, 192 samples, ~1,600 samples/s, data wait ~50% "
                        "of step time, compute ~50%")
    assert repr(s) == s.text() and s.gpu_util_pct is None
    assert "no driver (test)" in s.gpu_util_note


def test_gaps_between_epochs_are_not_counted(clock, no_nvml):
    timer = StepTimer(show=False)
    for _ in range(2):
        for _ in timer.wrap(SlowIterable(clock, [0.01])):
            clock.advance(0.01)
            timer.step()
        clock.advance(5.0)  # evaluation, checkpointing ...: not part of any step
    assert sum(timer.wait_s) + sum(timer.compute_s) == pytest.approx(0.04)
    assert timer.summary().samples_per_second is None  # no samples given


def test_sync_runs_before_each_step_is_timed(clock, no_nvml):
    calls = []
    timer = StepTimer(sync=lambda: (calls.append(1), clock.advance(0.5)), show=False)
    for _ in timer.wrap(SlowIterable(clock, [0.0, 0.0])):
        timer.step()
    assert len(calls) == 2
    assert timer.compute_s == pytest.approx([0.5, 0.5])  # the GPU's work lands in its step


@pytest.mark.parametrize("share, bound", [(0.9, "input-bound"), (0.5, "input-bound"),
                                          (0.3, "partly input-bound"), (0.05, "compute-bound")])
def test_verdicts(share, bound):
    s = StepTimes(steps=10, samples=0, wait_seconds=share, compute_seconds=1 - share,
                  gpu_util_pct=None, gpu_util_note="")
    assert s.bound == bound


def test_sync_accepts_devices_and_rejects_the_rest():
    assert timing.sync_function(None) is None
    assert timing.sync_function("cpu") is None
    fn = print
    assert timing.sync_function(fn) is fn
    import torch

    assert timing.sync_function(torch.device("cpu")) is None
    if not torch.cuda.is_available():  # a clear error instead of torch's AssertionError
        with pytest.raises(ValueError, match="no (usable )?CUDA GPU"):
            timing.sync_function("cuda:0")
    with pytest.raises(ValueError, match="'tpu'"):
        timing.sync_function("tpu")
    with pytest.raises(TypeError, match="sync"):
        timing.sync_function(3)


def test_gpu_util_is_sampled_from_nvml(clock, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the one GPU is not hidden
    monkeypatch.setattr(nvml, "nvml_status", lambda: (True, "driver 999 (test)"))
    monkeypatch.setattr(nvml, "gpu_count", lambda: 1)
    readings = iter([30, 50, 70])
    monkeypatch.setattr(nvml, "gpu_utilization", lambda i: (next(readings), 5))
    timer = StepTimer(show=False)
    for _ in timer.wrap(SlowIterable(clock, [0.1] * 6)):
        clock.advance(0.05)
        timer.step(samples=8)
    assert timer.util == [(0, 30), (2, 50), (4, 70)]  # at most every 0.2 s
    s = timer.summary()
    assert s.gpu_util_pct == 50.0 and s.text().endswith("GPU-Util ~50%")
    assert timer.png()[:8] == b"\x89PNG\r\n\x1a\n"  # with the GPU-Util axis
    assert "GPU-Util 70% (NVML)" in timer.html()


def test_gpu_util_arguments(monkeypatch):
    monkeypatch.setattr(nvml, "nvml_status", lambda: (True, "driver 999 (test)"))
    monkeypatch.setattr(nvml, "gpu_count", lambda: 1)
    assert "there is no GPU 3" in StepTimer(gpu_util=3, show=False).gpu_util_note
    assert "gpu_util=False" in StepTimer(gpu_util=False, show=False).gpu_util_note
    with pytest.raises(ValueError, match="gpu_util .None, False or a GPU index. must be at "):
        StepTimer(gpu_util=-1, show=False)


def test_step_timer_validates_and_closes(clock, no_nvml):
    with pytest.raises(ValueError, match="min_interval must be at least 0.1"):
        StepTimer(min_interval=0.01, show=False)
    with pytest.raises(TypeError, match="show must be True or False"):
        StepTimer(show=1)
    timer = StepTimer(show=False)
    with pytest.raises(ValueError, match="samples must be at least 0"):
        timer.step(samples=-1)
    with timer:
        for _ in timer.wrap(SlowIterable(clock, [0.01])):
            timer.step(samples=1)
    assert timer.closed
    with pytest.raises(RuntimeError, match="closed"):
        timer.step()
    with pytest.raises(RuntimeError, match="closed"):
        next(timer.wrap([1]))
    assert timer.png()[:4] == b"\x89PNG"
    assert timer.html().count("background:") == 2  # one step: a wait bar and a compute bar


# ------------------------------------------------------------------ compare
def test_compare_keeps_the_best_round_and_computes_speedups(clock):
    durations = {"slow": iter([2.0, 1.0]), "fast": iter([0.5, 0.6])}

    def run(name):
        def fn():
            clock.advance(next(durations[name]))
            return 100
        return fn

    result = compare({"slow": run("slow"), "fast": run("fast")}, rounds=2,
                     skipped={"gpu": "needs a CUDA GPU"}, notes={"fast": "workers"})
    assert [r.name for r in result.rows] == ["slow", "fast", "gpu"]
    assert result["slow"].seconds == 1.0 and result["slow"].all_seconds == (2.0, 1.0)
    assert result.rate("fast") == pytest.approx(200.0)
    assert result.speedup("fast") == pytest.approx(2.0)
    assert result.speedup("slow", over="fast") == pytest.approx(0.5)
    assert result.rate("gpu") is None and result.speedup("gpu") is None
    text = result.table("t").text().splitlines()
    assert text[0] == "t"
    assert text[1].split() == ["rung", "samples/s", "vs", "baseline", "vs", "previous", "note"]
    assert text[4].split() == ["fast", "~200", "samples/s", "~2.00x", "~2.00x", "workers"]
    assert text[5].split()[:3] == ["gpu", "not", "run"] and text[5].endswith("needs a CUDA GPU")
    with pytest.raises(KeyError, match="no rung named 'nope'; rungs: slow, fast, gpu"):
        result["nope"]


def test_compare_interleaves_rounds():
    order = []
    compare({"a": lambda: order.append("a") or 1, "b": lambda: order.append("b") or 1},
            rounds=3)
    assert order == ["a", "b"] * 3


def test_compare_table_without_notes_has_four_columns():
    result = compare({"only": lambda: 5}, rounds=1)
    assert result.table().headers == ["rung", "samples/s", "vs baseline", "vs previous"]
    assert repr(result) == result.table().text()
    assert isinstance(result, Comparison) and result.rounds == 1


@pytest.mark.parametrize("runs, kwargs, error", [
    ({}, {}, "non-empty dict"),
    ({"a": 3}, {}, "map names"),
    ({"a": lambda: 0}, {}, "positive int"),
    ({"a": lambda: 1.5}, {}, "positive int"),
    ({"a": lambda: None}, {}, "positive int"),
    ({"a": lambda: 1}, {"rounds": 0}, "rounds"),
    ({"a": lambda: 1}, {"skipped": {"a": "x"}}, "both run and skipped"),
    ({"a": lambda: 1}, {"skipped": {"b": 3}}, "must be a string"),
])
def test_compare_rejects_bad_input(runs, kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error):
        compare(runs, **kwargs)


def test_compare_insists_on_the_same_work_every_round():
    sizes = iter([10, 20])
    with pytest.raises(ValueError, match="processed 10 samples in one round and 20"):
        compare({"a": lambda: next(sizes)}, rounds=2)


# ------------------------------------------------------------------ recorded results
def record(**overrides):
    data = {"kind": KIND, "lesson": "09_throughput", "date": "2027-01-15",
            "hardware": {"gpu": "NVIDIA H100 80GB HBM3", "cpu_cores": 16},
            "versions": {"torch": "2.13.0", "cuda": "12.8"},
            "rungs": [{"part": "PyTorch input", "name": "0 workers (baseline)",
                       "samples_per_second": 3000.0, "speedup": 1.0},
                      {"part": "PyTorch input", "name": "4 workers",
                       "samples_per_second": 11500.0, "speedup": 3.83}]}
    data.update(overrides)
    return data


def test_no_record_means_none(tmp_path):
    assert throughput_gpu_results(results_dir=tmp_path) is None


def test_a_record_loads_and_prints_labelled(tmp_path):
    (tmp_path / "09_throughput.json").write_text(json.dumps(record()))
    rec = throughput_gpu_results(results_dir=tmp_path)
    assert rec.hardware["gpu"] == "NVIDIA H100 80GB HBM3" and rec.path == "09_throughput.json"
    lines = rec.table().text().splitlines()
    assert lines[0] == ("Recorded on NVIDIA H100 80GB HBM3 (2027-01-15; torch 2.13.0, "
                        "CUDA 12.8), not measured in this run")
    assert lines[-1].split() == ["PyTorch", "input", "4", "workers", "~11,500", "samples/s",
                                 "~3.83x"]
    assert repr(rec) == rec.table().text()


@pytest.mark.parametrize("content, error", [
    ("{not json", "not valid JSON"),
    (json.dumps({"date": "x"}), "not a recorded GPU results file"),
    (json.dumps({"kind": KIND, "date": "x"}), "lacks hardware, versions, rungs"),
    (json.dumps(record(hardware={"cpu_cores": 2})), "names no GPU"),
    (json.dumps(record(rungs=[{"name": "a"}])), "each rung needs"),
])
def test_broken_records_are_errors_not_silence(tmp_path, content, error):
    (tmp_path / "09_throughput.json").write_text(content)
    with pytest.raises(ValueError, match=error):
        throughput_gpu_results(results_dir=tmp_path)


def test_the_kits_record_if_present_is_valid():
    rec = throughput_gpu_results()
    if rec is not None:
        assert rec.rungs and rec.hardware["gpu"]


# ------------------------------------------------------------------ the GPU script
SCRIPT = ROOT / "tests" / "gpu" / "throughput_gpu.py"


def test_gpu_script_without_a_gpu_records_nothing():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the script would record for real")
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "No CUDA GPU here" in out.stdout and "Nothing recorded" in out.stdout
    assert not (ROOT / "tests" / "gpu" / "results" / "09_throughput.json").exists() or \
        throughput_gpu_results() is not None  # a real record from a GPU run may be committed


def test_gpu_script_cpu_mode_needs_an_explicit_file():
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "never recorded as GPU results" in out.stderr


@pytest.mark.slow
def test_gpu_script_writes_the_record_format(tmp_path):
    target = tmp_path / "run.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out",
                          str(target)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(target.read_text())
    assert {"kind", "lesson", "date", "hardware", "versions", "rungs", "settings"} <= set(data)
    assert "gpu" not in data["hardware"]  # a CPU run never passes for a GPU record
    names = [r["name"] for r in data["rungs"]]
    assert names[0] == "0 workers (baseline)" and "+ batch 256" in names
    assert "+ torch.compile" not in names  # GPU rungs only run on a GPU
    assert all(r["samples_per_second"] > 0 for r in data["rungs"])
    target.rename(tmp_path / "09_throughput.json")
    with pytest.raises(ValueError, match="names no GPU"):
        throughput_gpu_results(results_dir=tmp_path)


def test_live_view_keeps_ordinary_steps_visible_next_to_one_slow_start():
    timer = StepTimer(show=False, gpu_util=False)
    timer.wait_s = [1.0] + [0.016] * 20  # workers starting, then ordinary steps
    timer.compute_s = [0.0] + [0.004] * 20
    timer.samples = [64] * 21
    html = timer.html()
    heights = [float(h) for h in
               re.findall(r"height:([0-9.]+)px;background", html)]
    assert max(heights) <= 60.0  # the slow first step is clipped
    assert heights[2] + heights[3] == pytest.approx(20.0)  # an ordinary step: a third
    assert "data wait 94%" in html  # (1 + 20 * 0.016) / 1.4


def test_tables_of_measured_numbers_compare_equal_after_the_notebook_sanitizer():
    """nbval masks ~numbers (tests/sanitize.cfg); column padding must not leak their width."""
    text = (ROOT / "tests" / "sanitize.cfg").read_text()
    patterns = re.findall("^regex: (.*)$\n^replace: (.*)$", text, flags=re.MULTILINE)  # nbval

    def sanitized(seconds):
        rows = [RungResult(name, 1000, s) for name, s in zip(["base", "workers", "warm"],
                                                             seconds, strict=True)]
        table = Comparison(rows).table("t").text()
        for regex, replace in patterns:
            table = re.sub(regex, replace, table)
        return table

    narrow, wide = sanitized([1.0, 0.5, 0.4]), sanitized([1.0, 0.001, 0.00001])
    assert narrow == wide
    assert "~N samples/s<pad>~Nx" in narrow and "\n---<pad>---" in narrow


def test_live_step_timer_is_one_widget_updated_in_place(clock, no_nvml, monkeypatch):
    from helpers.watch import base

    monkeypatch.setattr(base, "headless", lambda: False)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: shown.append(a))
    timer = StepTimer(min_interval=0.1)
    assert len(shown) == 1 and shown[0][0] is timer
    assert "gl-steptimer-widget" in timer.widget()._dom_classes
    for _ in timer.wrap(SlowIterable(clock, [0.1] * 5)):
        clock.advance(0.1)
        timer.step(samples=2)
    timer.close()
    assert len(shown) == 1 and timer.updates >= 2
    assert "5 steps" in timer.widget().value and "data wait 50%" in timer.widget().value


def test_fuzz_leftovers_are_clear_errors():
    """Fuzz run after the redesign: an empty Comparison's speedup() was an IndexError, and a run
    returning a 400-digit sample count an OverflowError; both are ValueErrors now."""
    with pytest.raises(ValueError, match="no rungs"):
        helpers.Comparison().speedup("a")
    with pytest.raises(ValueError, match="about 400 digits"):
        helpers.compare({"a": lambda: 10**400})
