"""find_batch_size: the answer, the trials it takes, clean-up, restored state, bad input."""

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest
import torch
from torch import nn

import helpers
from helpers import batch_size as bs
from helpers.batch_size import BatchSizeError, is_oom_error
from helpers.memory.errors import warm_up_cuda

MiB = 2**20


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny steps: one thread is fastest, and immune to other processes on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def mlp_task(d_in=256, hidden=64, depth=3, n_classes=10, opt="adam", seed=0):
    torch.manual_seed(seed)
    model = helpers.MLP(d_in, hidden, depth, n_classes)
    optimizer = (torch.optim.Adam(model.parameters(), lr=1e-3) if opt == "adam"
                 else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    gen = torch.Generator().manual_seed(seed)

    def step(batch_size):
        x = torch.randn(batch_size, d_in, generator=gen)
        y = torch.randint(0, n_classes, (batch_size,), generator=gen)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return model, optimizer, step


def fresh_state(model, optimizer):
    optimizer.state.clear()
    for p in model.parameters():
        p.grad = None


def true_maximum(model, optimizer, step, capacity, steps=2):
    """The largest batch size whose steps fit, by bisection on the engine's exact peak."""
    def peak(b):
        fresh_state(model, optimizer)
        with helpers.VirtualGPU("1 TiB", device="cpu") as gpu:
            gpu.track(model, optimizer)
            for _ in range(steps):
                step(b)
            out = gpu.peak_allocated_bytes
        fresh_state(model, optimizer)
        return out

    lo, hi = 1, 2
    while peak(hi) <= capacity:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) <= capacity else (lo, mid)
    return lo


# ---------------------------------------------------------------- the answer
def test_finds_the_exact_maximum_in_few_trials():
    model, opt, step = mlp_task()
    cap = 2 * MiB
    truth = true_maximum(model, opt, step, cap)
    with helpers.VirtualGPU(cap, device="cpu"):
        r = helpers.find_batch_size(step, model=model, optimizer=opt, margin=0,
                                    multiple_of=1, tolerance=0)
    assert r.batch_size == truth
    assert r.trial(truth).fits and not r.trial(truth + 1).fits
    # doubling from 32 to past the maximum and bisecting down to 1 would take about 20
    assert r.n_trials <= 10, r.text()
    assert [t.why for t in r.trials][:2] == ["start", "doubling"]
    assert "prediction" in [t.why for t in r.trials]
    assert r.n_steps == sum(t.steps for t in r.trials) <= 2 * r.n_trials
    # memory grows linearly: the fitted line predicts the exact peaks of the trials
    fitting = [t for t in r.trials if t.fits and t.batch_size >= 512]
    for t in fitting:
        assert abs(r.predicted_bytes(t.batch_size) - t.peak_bytes) < 0.01 * t.peak_bytes


def test_default_answer_is_a_multiple_of_8_within_the_tolerance():
    model, opt, step = mlp_task()
    cap = 2 * MiB
    truth = true_maximum(model, opt, step, cap)
    with helpers.VirtualGPU(cap, device="cpu"):
        # each out-of-memory error costs 10 s: TensorFlow's allocator waits that long for
        # memory to be freed before it gives up; start above the limit, close coarsely
        r = helpers.find_batch_size(step, model=model, optimizer=opt, margin=0, start=4000,
                                    tolerance=0.25)
    assert r.batch_size % 8 == 0
    assert truth / 1.01 - 8 <= r.batch_size <= truth
    assert all(t.batch_size % 8 == 0 for t in r.trials)


def test_margin_leaves_memory_free():
    model, opt, step = mlp_task()
    cap = 3 * MiB
    with helpers.VirtualGPU(cap, device="cpu"):
        r = helpers.find_batch_size(step, model=model, optimizer=opt, margin=0.2)
    assert r.budget_bytes == int(0.8 * cap)
    chosen = r.trial(r.batch_size)
    assert chosen.fits and chosen.peak_bytes <= 0.8 * cap
    assert all(t.peak_bytes <= r.budget_bytes for t in r.trials if t.fits)
    over = [t for t in r.trials if not t.fits]
    assert over and all(t.oom or t.peak_bytes > r.budget_bytes for t in over)
    assert any(t.outcome == "over budget" for t in over)  # ran, but above 80 %


def test_maximum_caps_the_search():
    model, opt, step = mlp_task()
    with helpers.VirtualGPU(64 * MiB, device="cpu"):
        r = helpers.find_batch_size(step, model=model, optimizer=opt, maximum=100)
    assert r.batch_size == 100 and r.stopped == "the maximum fits"
    assert [t.batch_size for t in r.trials] == [32, 64, 100]


def test_caching_allocator_and_full_scale_fake_tensors():
    # a 4-layer MLP too big for this machine: fake tensors, a CUDA-like allocator
    with helpers.VirtualGPU("T4", fake=True, rounding=True, context_bytes="400 MiB",
                            device="cpu") as gpu:
        model = helpers.MLP(4096, 8192, 4, 1000)
        opt = torch.optim.Adam(model.parameters())

        def step(b):
            opt.zero_grad()
            x = torch.randn(b, 4096)
            nn.functional.cross_entropy(model(x), torch.randint(0, 1000, (b,))).backward()
            opt.step()

        before = gpu.allocated_bytes
        r = helpers.find_batch_size(step, model=model, optimizer=opt)
        assert gpu.allocated_bytes == before
    assert r.device == "VirtualGPU T4 (fake tensors)"
    assert all(t.samples_per_s is None for t in r.trials)
    assert r.trial(r.batch_size).peak_bytes <= r.budget_bytes
    # what nvidia-smi would show includes the allocator's cache
    assert all(t.reserved_bytes >= t.peak_bytes for t in r.trials if t.fits)
    # the search closed: a size that fits and one within 1 % above it that does not
    # (fragmentation makes the limit hard to predict here: a handful of bisection steps)
    assert r.smallest_too_big - r.batch_size <= 0.01 * r.batch_size
    assert r.n_trials <= 16, r.text()


def test_a_virtual_gpu_with_workspaces_reads_its_baseline_after_them():
    """VirtualGPU(workspaces=True) holds cuBLAS workspaces from the first matrix product on,
    as CUDA does: the finder creates them before it reads its baseline, so memory is back
    where it started afterwards, and the trials' peaks include them."""
    model, opt, step = mlp_task(opt="sgd")
    with helpers.VirtualGPU(4 * MiB, device="cpu", workspaces=True,
                            cublas_workspace="256 KiB") as gpu:
        r = helpers.find_batch_size(step, model=model, optimizer=opt)
        held = gpu.workspace_bytes
    assert held == 2 * 256 * 1024  # forward (this thread) and backward (autograd's thread)
    assert r.after_bytes == r.baseline_bytes >= held
    assert r.trial(r.batch_size).fits and r.n_trials > 2


# ---------------------------------------------------------------- clean-up and state
def test_every_trial_starts_from_the_baseline_and_memory_returns_to_it():
    model, opt, step = mlp_task()
    gpu = helpers.VirtualGPU(2 * MiB, rounding=True, device="cpu")
    at_start = []
    kept = []

    def watched(b):
        at_start.append(gpu.allocated_bytes)
        big = torch.ones(b, 256)  # alive in this frame when the step runs out of memory
        kept.append(weakref.ref(big.untyped_storage()))
        step(b)

    with gpu:
        gpu.track(model)
        gpu.empty_cache()
        allocated, reserved = gpu.allocated_bytes, gpu.reserved_bytes
        r = helpers.find_batch_size(watched, model=model, optimizer=opt, margin=0)
        assert any(t.oom for t in r.trials)
        # each trial (two steps each) started with only the model in memory
        firsts = at_start[::2]
        assert firsts.count(allocated) == r.n_trials
        assert all(ref() is None for ref in kept)  # tracebacks released their frames
        assert gpu.allocated_bytes == allocated and gpu.reserved_bytes == reserved
    assert r.baseline_bytes == r.after_bytes == allocated
    assert "allocated before the search" in r.text()


def test_model_and_optimizer_state_are_restored():
    torch.manual_seed(0)
    model = helpers.SmallCNN(3, 10, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()  # momentum buffers and gradients exist before the search
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    momenta = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]

    def step(b):
        opt.zero_grad()
        xb = torch.randn(b, 3, 32, 32)
        nn.functional.cross_entropy(model(xb), torch.randint(0, 10, (b,))).backward()
        opt.step()
        opt.param_groups[0]["lr"] *= 0.5  # a schedule that changes the learning rate

    with helpers.VirtualGPU(24 * MiB, device="cpu"):
        r = helpers.find_batch_size(step, model=model, optimizer=opt, start=8)
    assert r.n_trials >= 3
    for k, v in model.state_dict().items():  # parameters and BatchNorm statistics
        assert torch.equal(v, saved[k]), k
    for p, g, m in zip(model.parameters(), grads, momenta, strict=True):
        assert torch.equal(p.grad, g)
        assert torch.equal(opt.state[p]["momentum_buffer"], m)
    assert opt.param_groups[0]["lr"] == 0.1


def test_fresh_adam_stays_fresh():
    model, opt, step = mlp_task()
    with helpers.VirtualGPU(2 * MiB, device="cpu") as gpu:
        gpu.track(model)
        before = gpu.allocated_bytes
        helpers.find_batch_size(step, model=model, optimizer=opt)
        assert gpu.allocated_bytes == before
    assert len(opt.state) == 0 and all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------- what counts as OOM
def fake_oom_step(limit, error):
    calls = []

    def step(b):
        calls.append(b)
        if b > limit:
            raise error(b)

    return step, calls


def test_simulated_cuda_oom_without_memory_statistics_falls_back_to_doubling_and_bisection():
    step, calls = fake_oom_step(
        100, lambda b: RuntimeError(f"CUDA out of memory. Tried to allocate {b} MiB"))
    r = helpers.find_batch_size(step, start=4, maximum=4096, multiple_of=1, tolerance=0,
                                margin=0)
    assert r.batch_size == 100
    sizes = [t.batch_size for t in r.trials]
    assert sizes[:6] == [4, 8, 16, 32, 64, 128]  # doubling until it fails ...
    assert {t.why for t in r.trials[6:]} == {"bisection"}  # ... then binary search
    assert r.trials[-1].error.startswith("RuntimeError: CUDA out of memory")
    assert calls.count(101) == 1 and calls.count(100) == 2  # 2 steps when it fits


def test_tensorflow_resource_exhausted_counts_as_oom():
    ResourceExhaustedError = type("ResourceExhaustedError", (Exception,), {
        "__module__": "tensorflow.python.framework.errors_impl"})
    step, _ = fake_oom_step(48, lambda b: ResourceExhaustedError(f"OOM when allocating {b}"))
    r = helpers.find_batch_size(step, start=16, maximum=1024)
    # no capacity known: the 5 % margin comes off the largest size that ran
    assert r.trial(48).fits and not r.trial(56).fits and r.batch_size == 40
    assert "margin (5%) was taken off the largest size that ran (48)" in r.text()
    assert is_oom_error(ResourceExhaustedError("OOM"))


@pytest.mark.parametrize("exc, oom", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
                  "memory: you tried to allocate 1000 bytes."), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x5)"), False),
    (ValueError("out of memory"), False),
    (MemoryError(), False),
    (KeyboardInterrupt(), False),
])
def test_is_oom_error(exc, oom):
    assert is_oom_error(exc) is oom


# Messages as torch 2.13 formats them: C10_CUDA_CHECK (raises torch.AcceleratorError),
# TORCH_CUDABLAS_CHECK ("CUDA error: <cublas status> when calling `...`") and AT_CUDNN_CHECK
# ("cuDNN error: <cudnnGetErrorString>"; cuDNN 9 returns the status names).
_CUDA_HINT = ("\nCUDA kernel errors might be asynchronously reported at some other API call, "
              "so the stacktrace below might be incorrect.\nFor debugging consider passing "
              "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
              "assertions.\n")
_GEMM = ("`cublasSgemm( handle, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, "
         "ldc)`")


@pytest.mark.parametrize("message, oom", [
    # out of memory, though not torch.OutOfMemoryError
    ("CUDA error: out of memory" + _CUDA_HINT, True),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul( ltHandle, "
     "computeDesc.descriptor(), &alpha_val, mat1_ptr, Adesc.descriptor(), ...)`", True),
    ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),                          # cuDNN 8
    ("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED", True),  # cuDNN 9
    ("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", True),
    # broken installs, unsupported inputs, sticky errors: the search must stop on these
    ("cuDNN error: CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH", False),
    ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
     "non-contiguous input.", False),
    ("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR", False),
    ("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED", False),
    ("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling " + _GEMM, False),
    ("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`", False),
    ("CUDA error: an illegal memory access was encountered" + _CUDA_HINT, False),
    ("CUDA error: device-side assert triggered" + _CUDA_HINT, False),
    ("CUDA error: CUDA driver version is insufficient for CUDA runtime version"
     + _CUDA_HINT, False),
    ("CUDA error: no kernel image is available for execution on the device" + _CUDA_HINT,
     False),
])
@pytest.mark.parametrize("cls", [RuntimeError, torch.AcceleratorError])
def test_is_oom_error_knows_cuda_library_allocation_failures_and_only_those(message, oom,
                                                                            cls):
    assert is_oom_error(cls(message)) is oom


def test_an_error_other_than_oom_stops_the_search_and_is_reraised():
    model, opt, step = mlp_task()
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    def broken(b):
        step(b)
        if b > 64:
            raise ValueError(f"bad batch of {b}")

    with helpers.VirtualGPU(2 * MiB, device="cpu") as gpu, \
            pytest.raises(ValueError, match="bad batch") as info:
        gpu.track(model)
        before = gpu.allocated_bytes
        helpers.find_batch_size(broken, model=model, optimizer=opt)
    assert any("not out-of-memory" in n or "only out-of-memory" in n
               for n in info.value.__notes__)
    del info
    gc.collect()
    assert gpu.allocated_bytes == before
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k])


def test_a_step_that_does_not_fit_even_at_1_is_a_clear_error():
    model, opt, step = mlp_task(hidden=512)
    params = sum(p.numel() * 4 for p in model.parameters())
    with helpers.VirtualGPU(3 * params, device="cpu"):  # weights + grads fit, Adam does not
        with pytest.raises(BatchSizeError, match="even at batch size 1") as info:
            helpers.find_batch_size(step, model=model, optimizer=opt, start=16)
    assert "CUDA out of memory" in str(info.value)
    with helpers.VirtualGPU(params // 2, device="cpu"):
        with pytest.raises(BatchSizeError, match="model and optimizer alone do not fit"):
            helpers.find_batch_size(step, model=model, optimizer=opt)


def test_halves_from_a_start_that_does_not_fit():
    step, _ = fake_oom_step(5, lambda b: torch.OutOfMemoryError("CUDA out of memory."))
    r = helpers.find_batch_size(step, start=64, maximum=64, margin=0)
    assert [t.batch_size for t in r.trials][:5] == [64, 32, 16, 8, 4]
    assert r.batch_size == 5


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, error, match", [
    ({"start": 0}, ValueError, "start must be at least 1"),
    ({"start": -4}, ValueError, "start must be at least 1"),
    ({"start": 2.5}, TypeError, "start must be a whole number"),
    ({"start": True}, TypeError, "start must be a whole number"),
    ({"start": 64, "maximum": 32}, ValueError, r"maximum \(32\) must be at least start"),
    ({"margin": 0.5}, ValueError, "margin"),
    ({"margin": -0.1}, ValueError, "margin"),
    ({"margin": "5%"}, TypeError, "margin must be a number"),
    ({"margin": float("nan")}, ValueError, "margin must be a finite number"),
    ({"tolerance": True}, TypeError, "tolerance must be a number"),
    ({"steps_per_trial": 10**18}, ValueError, "steps_per_trial must be at most"),
    ({"max_trials": 10**6}, ValueError, "max_trials must be at most"),
    ({"steps_per_trial": 0}, ValueError, "steps_per_trial"),
    ({"multiple_of": 0}, ValueError, "multiple_of"),
    ({"tolerance": 0.5}, ValueError, "tolerance"),
    ({"max_trials": 1}, ValueError, "max_trials"),
    ({"model": "resnet"}, TypeError, "torch.nn.Module or a Keras model"),
    ({"model": nn.Linear(2, 2), "optimizer": "adam"}, TypeError, "torch.optim.Optimizer"),
    ({"capacity": "lots"}, ValueError, "lots"),
])
def test_bad_arguments_are_refused_with_a_clear_message(kwargs, error, match):
    kwargs.setdefault("maximum", 1024)
    with helpers.VirtualGPU("1 GiB", device="cpu"), pytest.raises(error, match=match):
        helpers.find_batch_size(lambda b: None, **kwargs)


@pytest.mark.parametrize("optimizer, got", [
    ("adam", "got str"), (5, "got int"), (object(), "got object"),
    ([torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1), "adam"], "got list of SGD, str"),
])
def test_an_optimizer_that_is_neither_torch_nor_keras_is_refused(optimizer, got):
    """Fuzz case 10: find_batch_size(step, optimizer="adam") took anything that is not a torch
    optimizer for a TensorFlow one (AttributeError: 'str' object has no attribute
    'variables'); now a TypeError names the argument and what it accepts."""
    with pytest.raises(TypeError, match=r"optimizer must be a torch.optim.Optimizer \(or a list "
                       rf"of them\) or a Keras optimizer, {got}"):
        helpers.find_batch_size(lambda b: None, optimizer=optimizer, maximum=64)


def test_frameworks_are_detected_without_importing_tensorflow():
    """A PyTorch search never imports TensorFlow or the finder's Keras part."""
    code = textwrap.dedent("""
        import sys, torch, helpers
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step(b):
            opt.zero_grad(); model(torch.ones(b, 4)).sum().backward(); opt.step()
        with helpers.VirtualGPU("1 MiB", device="cpu"):
            r = helpers.find_batch_size(step, model=model, optimizer=opt, maximum=64)
        print(r.batch_size, "tensorflow" in sys.modules, "helpers.tf.finder" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=120)
    assert out.stdout.split() == ["64", "False", "False"], out.stderr[-2000:]


def test_a_capacity_on_a_device_nothing_measures_is_not_called_a_fit():
    """Fuzz (find_batch_size step kinds, "silent"): with capacity= on a plain CPU nothing is
    measured, so the answer comes from out-of-memory errors alone: the result says so."""
    step, _ = fake_oom_step(100, lambda b: torch.OutOfMemoryError("CUDA out of memory."))
    r = helpers.find_batch_size(step, capacity="64 MiB", start=16, maximum=512)
    assert r.device == "cpu" and r.capacity_bytes == 64 * MiB
    assert all(t.peak_bytes is None for t in r.trials)
    assert "nothing measures memory on cpu: only out-of-memory errors decided" in r.text()


def test_step_must_be_a_function():
    with pytest.raises(TypeError, match="step must be a function"):
        helpers.find_batch_size(3, maximum=8)


def test_without_any_memory_limit_it_asks_for_one():
    with pytest.raises(BatchSizeError, match="nothing limits memory"):
        helpers.find_batch_size(lambda b: None)


# ---------------------------------------------------------------- result object
def test_result_text_dict_and_plot():
    import matplotlib.pyplot as plt

    model, opt, step = mlp_task()
    with helpers.VirtualGPU(2 * MiB, device="cpu"):
        r = helpers.find_batch_size(step, model=model, optimizer=opt)
    text = r.text()
    assert text == repr(r) and text.startswith(f"batch size {r.batch_size}: the largest")
    assert "chosen by" in text
    assert "<table>" in r._repr_html_()
    assert json.loads(json.dumps(r.to_dict()))["virtual"] is True
    before = plt.get_fignums()
    fig = r.plot()
    assert plt.get_fignums() == before
    ax = fig.axes[0]
    assert ax.get_xlabel() == "batch size" and "peak memory" in ax.get_ylabel()
    labels = ax.get_legend().get_texts()
    assert any("capacity" in t.get_text() for t in labels)
    with pytest.raises(ValueError, match="unit"):
        r.plot(unit="MB")
    with pytest.raises(KeyError, match="was not tried"):
        r.trial(3)


def test_no_samples_per_second_on_a_virtual_gpu():
    """A trial's time on a virtual GPU is mostly its bookkeeping, not a throughput: real
    tensors or fake, no trial reports samples/s, the table has no such column and a note
    says why; the plot has no throughput axis."""
    model, opt, step = mlp_task()
    with helpers.VirtualGPU(2 * MiB, device="cpu"):
        r = helpers.find_batch_size(step, model=model, optimizer=opt)
    assert r.virtual and r.n_trials > 2 and any(t.fits for t in r.trials)
    assert all(t.samples_per_s is None for t in r.trials)
    table = r.table()
    assert "samples/s (measured)" not in table.headers and len(table.headers) == 6
    text = r.text()
    assert "~" not in text  # nothing measured by a clock is shown
    assert "virtual GPU: no samples/s; a trial's time here is mostly the virtual GPU's " \
           "bookkeeping" in text
    fig = r.plot()
    assert len(fig.axes) == 1  # no samples/s axis
    assert not any("samples/s" in t.get_text() for t in fig.axes[0].get_legend().get_texts())


def test_samples_per_second_on_a_real_device(monkeypatch):
    """The same result on a CUDA device (torch.cuda's statistics, simulated) keeps samples/s:
    measured (with a tilde) in the table's last column, and on the plot's second axis."""
    import time

    cuda = FakeCuda()
    cuda.install(monkeypatch)

    def step(b):
        cuda.step(b)
        time.sleep(1e-4)  # a step takes time on a device

    r = helpers.find_batch_size(step, margin=0.1)
    assert not r.virtual and r.device == "cuda:0 (Pretend GPU)"
    fitted = [t for t in r.trials if t.fits]
    assert fitted and all(t.samples_per_s > 0 for t in fitted)
    table = r.table()
    assert table.headers[-1] == "samples/s (measured)"
    assert all(row[-1].startswith("~") for row, t in zip(table.rows, r.trials, strict=True)
               if t.fits)
    assert "virtual GPU: no samples/s" not in r.text()
    fig = r.plot()
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "samples/s (measured)"


# ---------------------------------------------------------------- CUDA, simulated
class FakeCuda:
    """torch.cuda's memory statistics for a pretend 16 GiB card capped at 25 %."""

    GiB = 2**30

    def __init__(self, per_sample=8 * MiB, fixed=256 * MiB, context=512 * MiB):
        self.per_sample, self.fixed, self.context = per_sample, fixed, context
        self.total, self.fraction = 16 * self.GiB, 0.25
        self.allocated = self.reserved = self.fixed
        self.peak_alloc = self.peak_reserved = self.fixed
        self.synced = self.emptied = 0

    def step(self, b):
        need = self.fixed + self.per_sample * b
        if need > self.total * self.fraction:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {need} bytes")
        self.peak_alloc = max(self.peak_alloc, need)
        self.peak_reserved = max(self.peak_reserved, need + 20 * MiB)
        self.reserved = max(self.reserved, need + 20 * MiB)  # cached after the step

    def install(self, monkeypatch):
        c = torch.cuda
        patches = {
            "is_available": lambda: True, "current_device": lambda: 0,
            "get_device_name": lambda i=0: "Pretend GPU",
            "synchronize": lambda i=None: setattr(self, "synced", self.synced + 1),
            "mem_get_info": lambda i=None: (self.total - self.context - self.reserved,
                                            self.total),
            "memory_reserved": lambda i=None: self.reserved,
            "memory_allocated": lambda i=None: self.allocated,
            "max_memory_allocated": lambda i=None: self.peak_alloc,
            "max_memory_reserved": lambda i=None: self.peak_reserved,
            "get_per_process_memory_fraction": lambda i=None: self.fraction,
            "reset_peak_memory_stats": self._reset, "empty_cache": self._empty,
        }
        for name, fn in patches.items():
            monkeypatch.setattr(c, name, fn)
        # the finder's cuBLAS warm-up runs its matmuls on the CPU here
        monkeypatch.setattr(bs, "warm_up_cuda", lambda device: warm_up_cuda("cpu"))

    def _reset(self, i=None):
        self.peak_alloc, self.peak_reserved = self.allocated, self.reserved

    def _empty(self):
        self.emptied += 1
        self.reserved = self.allocated


def test_cuda_path_reads_the_allocator_and_respects_the_memory_fraction(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    r = helpers.find_batch_size(cuda.step, margin=0.1)
    assert r.device == "cuda:0 (Pretend GPU)"
    # capped by set_per_process_memory_fraction: the CUDA context plus a quarter of the card
    assert r.capacity_bytes == cuda.context + 4 * FakeCuda.GiB
    assert r.budget_bytes == int(0.9 * r.capacity_bytes)
    chosen = r.trial(r.batch_size)
    assert chosen.peak_bytes == cuda.context + cuda.fixed + cuda.per_sample * r.batch_size
    assert chosen.reserved_bytes == chosen.peak_bytes + 20 * MiB  # nvidia-smi's view
    largest = (r.budget_bytes - cuda.context - cuda.fixed) // cuda.per_sample
    assert largest // 8 * 8 == r.batch_size  # exactly linear: the prediction is exact
    assert r.n_trials <= 5 and cuda.synced >= r.n_steps and cuda.emptied >= r.n_trials


class FakeCudaWithCublas(FakeCuda):
    """The same card, with cuBLAS: the first matrix multiplication on a thread (and the first
    backward, which runs on autograd's device thread) gets a workspace from the caching
    allocator, which memory_allocated() counts and empty_cache() never frees."""

    WORKSPACE = 8 * MiB
    MATMULS = ("mm", "addmm", "bmm", "baddbmm", "mv", "addmv")

    def __init__(self):
        super().__init__()
        self.workspaces = set()

    def matmul(self):
        key = (threading.get_ident(), torch._C._current_graph_task_id() != -1)
        if key not in self.workspaces:
            self.workspaces.add(key)
            self.allocated += self.WORKSPACE
            self.reserved += self.WORKSPACE
            self.peak_alloc = max(self.peak_alloc, self.allocated)
            self.peak_reserved = max(self.peak_reserved, self.reserved)

    def step(self, b):
        w = torch.ones(4, 4, requires_grad=True)  # the step's matmuls, forward and backward
        (w @ w).sum().backward()
        need = self.allocated + self.per_sample * b
        if need > self.total * self.fraction:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {need} bytes")
        self.peak_alloc = max(self.peak_alloc, need)
        self.peak_reserved = max(self.peak_reserved, need + 20 * MiB)
        self.reserved = max(self.reserved, need + 20 * MiB)

    def watching_matmuls(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        cuda = self

        class Cublas(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.overloadpacket.__name__ in cuda.MATMULS:
                    cuda.matmul()
                return func(*args, **(kwargs or {}))

        return Cublas()


def test_cuda_baseline_is_read_after_the_cublas_workspaces_exist(monkeypatch):
    """"Memory back where it started" (lesson 05) holds on a GPU where nothing ran before."""
    cuda = FakeCudaWithCublas()
    cuda.install(monkeypatch)
    with cuda.watching_matmuls():
        r = helpers.find_batch_size(cuda.step, margin=0.1)
    assert len(cuda.workspaces) == 2  # forward and backward
    assert r.after_bytes == r.baseline_bytes == cuda.fixed + 2 * cuda.WORKSPACE
    assert r.trial(r.batch_size).fits and r.n_trials > 2
