"""Rehearsals of the CUDA paths of timing.py, throughput.py, batch_size.py and oom.py:
clocks read after a sync, the batch-size baseline after a warm-up, the real-GPU checker
of lesson 08 capped with set_per_process_memory_fraction."""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers import batch_size as bs
from helpers import oom
from helpers.core.fake_nvml import FakeGpu, FakeNvml
from helpers.memory.cuda_standin import SimulatedCuda

MiB, GiB = 1024**2, 1024**3


# ------------------------------------------------------------------------- timing
def test_compare_times_reads_the_clock_only_after_a_sync(cuda):
    x = torch.randn(64, 64)
    with cuda.watch_clock():
        times = helpers.compare_times({"a": lambda: x @ x, "b": lambda: x + x}, rounds=3,
                                      sync="cuda:0")
    reads = cuda.clock_reads_after("synchronize")
    assert len(reads) >= 2 * 3 * 2 and all(reads)
    assert {e[1] for e in cuda.calls("synchronize")} == {"cuda:0"}
    assert set(times.best_seconds) == {"a", "b"}


@pytest.mark.parametrize("sync, words", [
    ("cuda:3", "this machine has 1 CUDA GPU"), ("cuda:x", "not a device name")])
def test_sync_on_a_gpu_that_is_not_there_is_refused(cuda, sync, words):
    with pytest.raises(ValueError, match=words):
        helpers.compare_times({"a": lambda: None}, sync=sync)


def test_sync_without_a_usable_gpu_says_so():
    with SimulatedCuda(available=False), pytest.raises(ValueError, match="no usable CUDA GPU"):
        helpers.compare_times({"a": lambda: None}, sync="cuda")


def test_throughput_compare_times_each_rung_between_syncs(cuda):
    with cuda.watch_clock():
        result = helpers.compare({"plain": lambda: 64, "fast": lambda: 64}, rounds=2,
                                 sync=torch.device("cuda", 0))
    reads = cuda.clock_reads_after("synchronize")
    assert len(reads) == 2 * 2 * 2 and all(reads)
    assert [r.name for r in result.rows] == ["plain", "fast"]


def test_step_timer_syncs_before_each_step_and_samples_gpu_util(cuda):
    with FakeNvml(FakeGpu(gpu_util_pct=97)):
        timer = helpers.StepTimer(sync="cuda", gpu_util=0, show=False)
        with cuda.watch_clock():
            for _ in range(3):
                timer.step(samples=8)
        assert timer.util and timer.util[0] == (0, 97)
        assert timer._pick_gpu(1) == (None, "no GPU-Util: NVML sees 1 GPU(s), so there is "
                                            "no GPU 1")
    names = [e[0] for e in cuda.log]
    first_step_clock = names.index("clock")
    assert "synchronize" in names[:first_step_clock]


# ------------------------------------------------------------------------- batch size
def test_find_batch_size_on_cuda_reads_its_baseline_after_a_warm_up(monkeypatch):
    with SimulatedCuda("1 GiB") as sim:
        monkeypatch.setattr(bs, "warm_up_cuda", lambda device: (
            sim._note("warm_up_cuda", str(device)), sim.allocate(8 * MiB)))

        def step(batch):  # 1 MiB per sample, freed at the end of the step
            sim.allocate(batch * MiB)
            sim.free(batch * MiB)

        result = helpers.find_batch_size(step, start=32, margin=0.05, multiple_of=8)
    names = [e[0] for e in sim.log]
    assert ("warm_up_cuda", "cuda:0") in sim.log
    # the workspace the warm-up leaves is part of the baseline, so memory is "back" after
    assert names.index("warm_up_cuda") < names.index("memory_allocated")
    assert result.baseline_bytes == result.after_bytes == 8 * MiB
    # 95 % of 1 GiB = 972.8 MiB, of which the warm-up holds 8 MiB
    assert result.batch_size == 960
    assert any(t.batch_size > 960 and not t.fits for t in result.trials)
    assert "cuda:0 (NVIDIA simulated GPU)" in result.text()


def test_warm_up_cuda_runs_forward_and_backward_then_syncs(cuda, monkeypatch):
    made = []
    for name in ("ones", "zeros"):
        real = getattr(torch, name)

        def on_cpu(*shape, device=None, _real=real, **kw):
            t = _real(*shape, **kw)
            made.append((str(device), t))
            return t

        monkeypatch.setattr(torch, name, on_cpu)
    bs.warm_up_cuda()
    assert [d for d, _ in made] == ["cuda:0", "cuda:0"]
    assert all(t.grad is not None for _, t in made)  # a backward ran (autograd's workspace)
    assert cuda.log[-1] == ("synchronize", "cuda:0")


# ------------------------------------------------------------------------- lesson 08 checker
class _FakeRun:
    """What oom._run_steps returns, for a step that needs ``need`` bytes on the GPU."""

    def __init__(self, sim, need, error=None):
        self.sim, self.need, self.error, self.attempts = sim, need, error, []

    def __call__(self, make_step, net, opt, *, device, **kw):
        self.attempts.append(self.sim.devices[0].fraction)
        if self.error is not None and self.sim.devices[0].fraction < 1.0:
            raise RuntimeError(self.error)
        half = self.need // 2
        self.sim.allocate(half)
        try:
            self.sim.allocate(self.need - half)
            self.sim.free(self.need - half)
        finally:
            self.sim.free(half)  # the failed run's tensors die; their blocks stay cached
        return oom._Run(calls=2, updates=2, micro_batch=kw["batch_size"],
                        samples=2 * kw["batch_size"], losses=[2.3, 2.2])


def _check_real(sim, monkeypatch, need, card="L40S", error=None):
    fake = _FakeRun(sim, need, error)
    monkeypatch.setattr(oom, "_run_steps", fake)
    monkeypatch.setattr(oom, "_build", lambda *a, **k: (None, None))
    capacity = helpers.parse_capacity(card)
    result = oom._full_scale_cuda(None, device=torch.device("cuda", 0), batch_size=32,
                                  model_factory=None, opt_factory=None, capacity=capacity,
                                  card=card)
    return result, fake


def test_real_gpu_check_fits_under_the_cards_cap(monkeypatch):
    with SimulatedCuda("H200") as sim:
        sim.set_memory(0, other=500 * MiB)
        result, fake = _check_real(sim, monkeypatch, need=20 * GiB)
        fractions = [e[2] for e in sim.calls("set_per_process_memory_fraction")]
    budget = (helpers.parse_capacity("L40S") - 500 * MiB) / helpers.KNOWN_GPUS["H200"]
    assert fake.attempts == [pytest.approx(budget)] and fractions == [fake.attempts[0], 1.0]
    assert result["fits"] and result["peak_bytes"] == 500 * MiB + 20 * GiB
    assert result["source"] == "NVIDIA H200, real allocator capped to the L40S's 44.99 GiB"


def test_real_gpu_check_that_does_not_fit_reports_what_it_needs(monkeypatch):
    with SimulatedCuda("H200") as sim:
        sim.set_memory(0, other=500 * MiB)
        result, fake = _check_real(sim, monkeypatch, need=60 * GiB)
    assert not result["fits"] and "CUDA out of memory" in result["oom"]
    assert fake.attempts[1] == 1.0  # then uncapped
    # the capped run's cache was emptied first: "needs" is the step's own peak
    assert result["needed_bytes"] == 500 * MiB + 60 * GiB
    names = [e[0] for e in sim.log]
    second_reset = [i for i, n in enumerate(names) if n == "reset_peak_memory_stats"][1]
    assert "empty_cache" in names[names.index("set_per_process_memory_fraction"):second_reset]


@pytest.mark.parametrize("error, fits", [
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", False),
    ("cuDNN error: CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH", None),
])
def test_real_gpu_check_knows_library_allocation_failures_only(monkeypatch, error, fits):
    with SimulatedCuda("H200") as sim:
        if fits is None:  # a broken install is not "does not fit"
            with pytest.raises(RuntimeError, match="SUBLIBRARY"):
                _check_real(sim, monkeypatch, need=GiB, error=error)
            return
        result, _ = _check_real(sim, monkeypatch, need=GiB, error=error)
    assert result["fits"] is fits and "CUBLAS_STATUS_ALLOC_FAILED" in result["oom"]


@pytest.mark.parametrize("gpu, real", [("H200", True), ("T4", False)])
def test_check_training_runs_for_real_only_on_a_gpu_with_the_cards_memory(monkeypatch, gpu,
                                                                         real):
    chosen = []
    row = dict(source="stub", fits=True, oom=None, needed_bytes=None, peak_bytes=1,
               micro_batch=8, effective_batch=8, updates=2)
    monkeypatch.setattr(oom, "_full_scale_cuda", lambda *a, **k: chosen.append("real") or row)
    monkeypatch.setattr(oom, "_full_scale_virtual",
                        lambda *a, **k: chosen.append("virtual") or row)
    monkeypatch.setattr(oom, "_small_scale", lambda *a, **k: oom._Run(1, 1, 8, 8, [1.0]))
    with SimulatedCuda(gpu):
        check = helpers.check_training(oom.original_step, gpu="L40S", device="cuda")
    assert chosen == ["real" if real else "virtual"] and check.fits
    assert "on cuda" in check.small_scale


def test_find_batch_size_agrees_on_the_cuda_and_the_virtual_path(monkeypatch):
    """Same step, same virtual card: the finder reading torch.cuda (as on a real GPU) and the
    finder reading the VirtualGPU directly find the same batch size."""
    from helpers.memory import state

    def step(batch):  # 1 MiB of activations per sample, plus a 64 MiB "model"
        x = torch.empty(batch, 256, 1024)
        w = torch.empty(16, 1024, 1024)
        del x, w

    with helpers.VirtualGPU("1 GiB", device="cpu") as gpu:
        virtual = helpers.find_batch_size(step, start=32, multiple_of=8)
        with SimulatedCuda(gpu) as sim:
            monkeypatch.setattr(bs, "warm_up_cuda", lambda device: None)
            monkeypatch.setattr(state, "current_virtual_gpu", lambda: None)
            real = helpers.find_batch_size(step, start=32, multiple_of=8)
    assert real.batch_size == virtual.batch_size > 0
    assert sim.calls("max_memory_reserved") and sim.calls("reset_peak_memory_stats")
    assert "cuda:0" in real.text() and "VirtualGPU" in virtual.text()
