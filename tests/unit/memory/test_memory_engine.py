"""measure_step, VirtualGPU and full-scale mode: behaviour, exactness, errors, OOM."""

import gc
import json
import re
import subprocess
import sys
import threading
import weakref

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

import helpers
from helpers.memory.report import CATEGORIES

MiB = 2**20


def nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def mlp_setup(batch=256, d_in=32, hidden=256, depth=3, n_classes=4, opt="adam"):
    torch.manual_seed(0)
    model = helpers.MLP(d_in, hidden, depth, n_classes)
    optimizer = (torch.optim.Adam(model.parameters()) if opt == "adam"
                 else torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(batch, d_in)
    y = torch.randint(0, n_classes, (batch,))

    def step():
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return model, optimizer, x, y, step


# ---------------------------------------------------------------- import and API
def test_memory_names_are_lazy_and_cheap():
    code = (
        "import sys, helpers\n"
        "assert helpers.current_virtual_gpu() is None\n"
        "helpers.parse_capacity('48GB'); helpers.KNOWN_GPUS['L40S']\n"
        "helpers.recorded_gpu_results('memory')\n"
        "bad = [m for m in ('torch', 'tensorflow') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names():
    for name in ("VirtualGPU", "current_virtual_gpu", "full_scale", "measure_step",
                 "MemoryReport", "parse_capacity", "KNOWN_GPUS",
                 "recorded_gpu_results", "ResNet", "TransformerBlock"):
        assert getattr(helpers, name) is not None


# ---------------------------------------------------------------- measure_step
def test_categories_are_exact_for_an_mlp_with_adam():
    model, opt, x, y, step = mlp_setup()
    r = helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y), steps=2)
    params = list(model.parameters())
    p_bytes = nbytes(*params)
    assert r.parameter_bytes == p_bytes
    assert r.gradient_bytes == p_bytes
    # Adam: exp_avg and exp_avg_sq per parameter, plus a float32 step counter per tensor
    assert r.optimizer_state_bytes == 2 * p_bytes + 4 * len(params)
    assert r.input_bytes == nbytes(x, y)
    assert r.peak_bytes == max(r.timeline.columns["total"])
    assert set(r.phase_peaks) == {"forward", "backward", "optimizer"}
    assert r.first_step.step == 1 and r.steady_state.step == 2


def test_adam_state_appears_during_the_first_step():
    model, opt, x, y, step = mlp_setup()
    r = helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y), steps=3)
    first, steady = r.first_step, r.steady_state
    state = r.optimizer_state_bytes
    assert first.at_peak["optimizer_state"] in (0, state) or first.peak_phase == "optimizer"
    assert steady.phase_peaks["forward"] - first.phase_peaks["forward"] == state
    assert r.steps[1].peak_bytes == r.steps[2].peak_bytes  # steady from step 2 on
    assert "first step peak" in r.text() and "steady state" in r.text()


def test_timeline_is_consistent_and_exportable(tmp_path):
    model, opt, x, y, step = mlp_setup(batch=64)
    r = helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y))
    cols = r.timeline.columns
    n = len(r.timeline)
    assert n > 10 and all(len(v) == n for v in cols.values())
    for i in range(n):
        assert sum(cols[c][i] for c in CATEGORIES) == cols["total"][i]
        assert cols["allocated"][i] == cols["reserved"][i] == cols["total"][i]
    recs = r.timeline.records()
    assert recs[0]["op"] == "start" and recs[-1]["op"] == "end"
    assert {rec["phase"] for rec in recs} == {"forward", "backward", "optimizer", "other"}
    text = r.timeline.to_csv(tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text() == text
    assert text.splitlines()[0].startswith("point,step,phase,op,module,total,parameters")
    json.dumps(r.to_dict())  # serialisable
    assert r.peak_module.startswith("MLP")  # attributed to a submodule


def test_report_text_html_and_plot():
    import matplotlib.pyplot as plt

    model, opt, x, y, step = mlp_setup(batch=64)
    r = helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y))
    text = r.text()
    assert text == repr(r) == str(r)
    assert "parameters (and buffers)" in text and "optimizer state" in text
    assert re.search(r"peak \d+\.\d\d (KiB|MiB)", text)
    assert "<table>" in r._repr_html_()
    before = plt.get_fignums()
    fig = r.plot_timeline()
    assert plt.get_fignums() == before  # not left open for pyplot to show again
    ax = fig.axes[0]
    assert "peak" in " ".join(t.get_text() for t in ax.texts)
    assert ax.get_ylabel() == "live memory (MiB)"
    fig2, ax2 = plt.subplots()
    assert r.plot_timeline(ax=ax2, unit="GiB", legend=False) is fig2
    plt.close(fig2)
    with pytest.raises(ValueError, match="unit"):
        r.plot_timeline(unit="MB")


def test_no_grad_and_inference_mode_keep_no_activations():
    model, opt, x, y, step = mlp_setup(batch=512, hidden=256)
    layer = 512 * 256 * 4

    def no_grad():
        with torch.no_grad():
            model(x)

    def inference():
        with torch.inference_mode():
            model(x)

    def with_grad():
        model(x)

    for fn in (no_grad, inference):
        r = helpers.measure_step(fn, model=model, inputs=(x,))
        assert r.activation_bytes == 0
        assert r.peak_bytes - r.baseline_bytes == 2 * layer  # one layer's input and output
        assert set(r.phase_peaks) == {"forward"}
    r = helpers.measure_step(with_grad, model=model, inputs=(x,))
    assert r.activation_bytes >= 3 * layer  # every ReLU output is kept for backward


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_halves_activations_but_keeps_weight_copies(dtype):
    model, opt, x, y, _ = mlp_setup(batch=2048, d_in=64, hidden=128, depth=4, opt="sgd")
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)

    def step(low):
        def run():
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=low):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return run

    fp32 = helpers.measure_step(step(False), model=model, optimizer=opt, inputs=(x, y))
    low = helpers.measure_step(step(True), model=model, optimizer=opt, inputs=(x, y))
    assert low.activation_bytes < 0.6 * fp32.activation_bytes
    weights = sum(p.numel() for p in model.parameters() if p.dim() == 2) * 2
    # 16-bit copies of the weights are kept for backward too: savings are under 50%
    assert low.activation_bytes >= fp32.activation_bytes / 2 + weights * 0.9
    assert "optimizer" in low.phase_peaks  # SGD allocates nothing, the phase still shows
    assert low.gradient_bytes == fp32.gradient_bytes  # gradients stay float32


def test_checkpointing_keeps_segment_boundaries_and_recomputes():
    torch.manual_seed(0)
    model = helpers.MLP(64, 128, 8, 10)
    x, y = torch.randn(1024, 64), torch.randint(0, 10, (1024,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(segments):
        def run():
            opt.zero_grad()
            if segments:
                h = checkpoint_sequential(model.layers, segments, x, use_reentrant=False)
            else:
                h = model.layers(x)
            nn.functional.cross_entropy(model.head(h), y).backward()
            opt.step()
        return run

    plain = helpers.measure_step(step(0), model=model, optimizer=opt, inputs=(x, y))
    ckpt = helpers.measure_step(step(4), model=model, optimizer=opt, inputs=(x, y))
    unit = 1024 * 128 * 4
    assert plain.activation_bytes // unit == 8
    # forward keeps 3 segment boundaries + the last (unchecked) segment's 2 ReLU outputs
    fwd_end = [i for i, p in enumerate(ckpt.timeline.columns["phase"]) if p == "forward"][-1]
    assert ckpt.timeline.columns["activations"][fwd_end] // unit == 5
    assert ckpt.peak_bytes < plain.peak_bytes
    backward_ops = [o for o, p in zip(ckpt.timeline.columns["op"], ckpt.timeline.columns["phase"],
                                      strict=True) if p == "backward"]
    assert any(o.startswith("addmm (ReluBackward0)") for o in backward_ops)  # recomputation


def test_tensors_made_before_are_counted_from_first_use():
    model, opt, x, y, step = mlp_setup(batch=64)
    with_inputs = helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y))
    model, opt, x, y, step = mlp_setup(batch=64)
    without = helpers.measure_step(step, model=model, optimizer=opt)
    assert without.peak_bytes == with_inputs.peak_bytes
    assert without.baseline_bytes == with_inputs.baseline_bytes - nbytes(x, y)


def test_resized_storages_are_followed():
    def step():
        t = torch.empty(10)
        t.resize_(1000)
        return t

    r = helpers.measure_step(step, device="cpu")
    assert r.peak_bytes - r.baseline_bytes == 4000


@pytest.mark.parametrize("kwargs, error, match", [
    ({"step": 3}, TypeError, "function"),
    ({"step": nn.Linear(2, 2)}, TypeError, "not a model"),
    ({"step": lambda: None, "model": "net"}, TypeError, "nn.Module"),
    ({"step": lambda: None, "optimizer": "adam"}, TypeError, "Optimizer"),
    ({"step": lambda: None, "steps": 0}, ValueError, "steps must be at least 1"),
    ({"step": lambda: None, "steps": True}, TypeError, "steps must be a whole number"),
    ({"step": lambda: None, "steps": 10**400}, ValueError, "steps must be at most"),
    ({"step": lambda: None, "inputs": ["x"]}, TypeError, "tensor"),
    ({"step": lambda: None, "device": "gpu7"}, ValueError, "device"),
    ({"step": lambda: None, "title": 3}, TypeError, "title"),
])
def test_measure_step_rejects_bad_arguments(kwargs, error, match):
    step = kwargs.pop("step")
    with pytest.raises(error, match=match):
        helpers.measure_step(step, **kwargs)


def test_measure_step_cannot_be_nested():
    def outer():
        helpers.measure_step(lambda: None)

    with helpers.VirtualGPU("1 GiB", device="cpu"), pytest.raises(RuntimeError, match="nested"):
        helpers.measure_step(outer)


# ---------------------------------------------------------------- VirtualGPU
def test_virtual_gpu_names_and_attributes():
    gpu = helpers.VirtualGPU("L40S", device="cpu")
    assert gpu.name == "L40S" and gpu.capacity_bytes == 46068 * MiB
    assert helpers.VirtualGPU("48 GiB", device="cpu").name == "48.00 GiB"
    assert helpers.VirtualGPU(48 * 10**9, device="cpu").name == "44.70 GiB"
    assert gpu.allocated_bytes == gpu.reserved_bytes == gpu.peak_allocated_bytes == 0
    assert helpers.current_virtual_gpu() is None
    with gpu as g:
        assert g is gpu and helpers.current_virtual_gpu() is gpu
        t = torch.ones(1000)
        assert gpu.allocated_bytes == gpu.reserved_bytes == 4000
        assert gpu.mem_get_info() == (gpu.capacity_bytes - 4000, gpu.capacity_bytes)
        del t
        assert gpu.allocated_bytes == 0 and gpu.peak_allocated_bytes == 4000
        gpu.reset_peak()
        assert gpu.peak_allocated_bytes == 0
    assert helpers.current_virtual_gpu() is None
    assert "VirtualGPU L40S" in repr(gpu) and "<div>" in gpu._repr_html_()


def test_rounding_and_context_are_like_cuda():
    gpu = helpers.VirtualGPU("1 GiB", rounding=True, context_bytes="300 MiB", device="cpu")
    with gpu:
        t = torch.ones(10)  # 40 bytes -> a 512-byte block in a fresh 2 MiB segment
        assert gpu.allocated_bytes == 512 and gpu.reserved_bytes == 2 * MiB
        assert gpu.used_bytes == 302 * MiB and gpu.free_bytes == 722 * MiB
        del t
        assert gpu.allocated_bytes == 0 and gpu.reserved_bytes == 2 * MiB  # cached
        gpu.empty_cache()
        assert gpu.reserved_bytes == 0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"capacity": "A100"}, ValueError, "ambiguous"),
    ({"capacity": 0}, ValueError, "more than 0"),
    ({"capacity": "1 GiB", "rounding": "yes"}, TypeError, "rounding"),
    ({"capacity": "1 GiB", "fake": 1}, TypeError, "fake"),
    ({"capacity": "1 GiB", "context_bytes": "2 GiB"}, ValueError, "smaller than"),
    ({"capacity": "1 GiB", "context_bytes": -1}, ValueError, "0 or more"),
    ({"capacity": "1 GiB", "device": "gpu7"}, ValueError, "device"),
    ({"capacity": "1 GiB", "device": 3}, TypeError, "device"),
    ({"capacity": "1 GiB", "index": -1}, ValueError, "index"),
])
def test_virtual_gpu_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        helpers.VirtualGPU(**kwargs)


def test_virtual_gpus_cannot_be_nested_but_can_be_reentered():
    a = helpers.VirtualGPU("1 GiB", device="cpu")
    b = helpers.VirtualGPU("2 GiB", device="cpu")
    with a:
        keep = torch.ones(250)
        with pytest.raises(RuntimeError, match="nested"), b:
            pass
        assert helpers.current_virtual_gpu() is a
    assert helpers.current_virtual_gpu() is None
    with a:  # memory still held stays counted
        assert a.allocated_bytes == 1000
        more = torch.ones(250)
        assert a.allocated_bytes == 2000
    del keep, more
    assert a.allocated_bytes == 0


def test_attributes_can_be_read_from_another_thread():
    model, opt, x, y, step = mlp_setup(batch=512)
    seen = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            gpu = helpers.current_virtual_gpu()
            if gpu is not None:
                seen.append((gpu.name, gpu.allocated_bytes, gpu.reserved_bytes))

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        with helpers.VirtualGPU("1 GiB", device="cpu") as gpu:
            for _ in range(3):
                step()
    finally:
        stop.set()
        thread.join()
    assert seen and all(name == "1.00 GiB" for name, _, _ in seen)
    assert max(a for _, a, _ in seen) <= gpu.peak_allocated_bytes


# ---------------------------------------------------------------- out of memory
def is_cuda_out_of_memory(exc):  # PyTorch Lightning / toma
    return (isinstance(exc, RuntimeError) and len(exc.args) == 1 and "CUDA" in exc.args[0]
            and "out of memory" in exc.args[0])


def should_reduce_batch_size(exc):  # Hugging Face Accelerate
    return isinstance(exc, RuntimeError) and len(exc.args) == 1 and any(
        s in exc.args[0] for s in ("CUDA out of memory.", " out of memory."))


OOM_TEXT = re.compile(
    r"^CUDA out of memory\. Tried to allocate \d+\.\d\d [KMG]iB\. GPU 0 has a total capacity "
    r"of \d+\.\d\d [KMG]iB of which [\d.]+ (bytes|[KMG]iB) is free\. Including non-PyTorch "
    r"memory, this process has [\d.]+ [KMG]iB memory in use\. Of the allocated memory "
    r"[\d.]+ [KMG]iB is allocated by PyTorch, and [\d.]+ (bytes|[KMG]iB) is reserved by "
    r"PyTorch but unallocated\. If reserved")


def test_oom_message_names_the_current_allocator_variable():
    from helpers.memory.virtual import oom_message

    text = oom_message(tried=2 * 1024**2, capacity=1024**3, context=300 * 1024**2,
                       allocated=600 * 1024**2, reserved=700 * 1024**2)
    assert OOM_TEXT.match(text)
    # recent PyTorch (c10's caching device allocator) names PYTORCH_ALLOC_CONF in its hint
    assert "try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid" in text
    assert "PYTORCH_CUDA_ALLOC_CONF" not in text
    assert "100.00 MiB is reserved by PyTorch but unallocated" in text


@pytest.mark.parametrize("where", ["forward", "backward", "optimizer"])
def test_oom_is_a_real_torch_error_in_every_phase(where):
    model, opt, x, y, step = mlp_setup(batch=512, d_in=64, hidden=512, depth=2)
    params = nbytes(*model.parameters())
    cap = {
        "forward": params + nbytes(x, y) + 100_000,  # the first activation does not fit
        "backward": None,
        "optimizer": None,
    }[where]
    if cap is None:
        r = helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y))
        opt.state.clear()
        for p in model.parameters():
            p.grad = None
        phase = r.first_step.phase_peaks
        cap = phase["forward"] + 1 if where == "backward" else phase["backward"] + 1
        assert phase[where] > cap  # where the step first needs more than the capacity
    gpu = helpers.VirtualGPU(cap, device="cpu")
    with gpu:
        gpu.track(model, x, y)
        before = gpu.allocated_bytes
        with pytest.raises(torch.OutOfMemoryError) as info:
            step()
        exc = info.value
    assert isinstance(exc, torch.cuda.OutOfMemoryError) and isinstance(exc, RuntimeError)
    msg = str(exc)
    assert OOM_TEXT.match(msg), msg
    assert is_cuda_out_of_memory(exc) and should_reduce_batch_size(exc)
    phase_words = {"forward": "forward pass", "backward": "backward pass",
                   "optimizer": "optimizer step"}[where]
    assert f"raised in the {phase_words}" in msg and "simulated" in msg
    del exc, info
    gc.collect()
    opt.state.clear()
    for p in model.parameters():
        p.grad = None
    assert gpu.allocated_bytes == before - (0 if where == "forward" else 0)
    assert gpu.n_oom == 1


def test_nothing_stays_referenced_after_an_oom():
    refs = []

    def step():
        a = torch.ones(1000)
        refs.append(weakref.ref(a.untyped_storage()))
        b = torch.ones(1_000_000)  # does not fit
        return a, b

    gpu = helpers.VirtualGPU("100 KB", device="cpu")
    with gpu:
        try:
            step()
        except torch.OutOfMemoryError as e:
            assert "Tried to allocate 3.81 MiB" in str(e)
            assert gpu.allocated_bytes == 4000  # `a` is alive while the traceback is
    assert refs[0]() is None  # freed by reference counting alone: no cycles, no gc
    assert gpu.allocated_bytes == 0


def test_oom_inside_measure_step_carries_the_partial_report():
    model, opt, x, y, step = mlp_setup(batch=512, hidden=512)
    with helpers.VirtualGPU(nbytes(*model.parameters(), x, y) + 600_000, device="cpu"):
        with pytest.raises(torch.OutOfMemoryError) as info:
            helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y))
    report = info.value.memory_report
    assert report.virtual_gpu and "ran out of memory" in report.text()
    assert "in MLP" in str(info.value)


def _adam_steps(model, x, y, steps=2):
    """measure_step of ``steps`` Adam training steps of ``model`` on the batch ``(x, y)``."""
    opt = torch.optim.Adam(model.parameters())

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return helpers.measure_step(step, model=model, optimizer=opt, inputs=(x, y), steps=steps)


# ---------------------------------------------------------------- full scale (fake tensors)
def test_fake_tensors_give_the_same_bytes_as_real_ones():
    def run():
        torch.manual_seed(0)
        model = helpers.SmallCNN(3, 10, 8)
        return _adam_steps(model, torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))

    real = run()
    with helpers.full_scale("cpu"):
        fake = run()
    assert fake.fake and not real.fake
    assert fake.peak_bytes == real.peak_bytes
    assert fake.category_max == real.category_max
    assert fake.timeline.columns["total"] == real.timeline.columns["total"]


def test_full_scale_virtual_gpu_runs_out_in_seconds():
    with helpers.VirtualGPU("T4", fake=True, device="cpu") as gpu:
        model = helpers.ResNet(50)
        x = torch.randn(256, 3, 224, 224)
        y = torch.randint(0, 1000, (256,))
        assert gpu.allocated_bytes == nbytes(*model.parameters(), *model.buffers(), x, y)
        with pytest.raises(torch.OutOfMemoryError, match="raised in the forward pass"):
            nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="nest"), helpers.full_scale(), helpers.full_scale():
        pass


# ---------------------------------------------------------------- the fast paths (issue 17)
def _fake_training(steps=2):
    """Two Adam steps of a small ResNet on a virtual GPU with fake tensors: the peaks, the
    reserved peak, and measure_step's bytes per category."""
    gpu = helpers.VirtualGPU("2 GiB", fake=True, rounding=True, context_bytes="100 MiB",
                             device="cpu")
    with gpu:
        torch.manual_seed(0)
        net = helpers.LargeResNet(width=8, n_classes=10)
        report = _adam_steps(net, torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,)),
                             steps)
        peaks = (gpu.peak_allocated_bytes, gpu.peak_reserved_bytes)
    return peaks, report.to_dict(), report.text()


def test_fast_paths_count_exactly_what_full_fake_dispatch_counts(monkeypatch):
    """The engine skips fake-tensor dispatch for elementwise in-place operations and device
    queries: the bytes must be the same as with every operation dispatched."""
    from helpers.memory import engine

    fast = _fake_training()
    calls = []
    real = engine._in_place_on_fake

    def counting(args, kwargs):
        calls.append(real(args, kwargs))
        return False  # never take the fast path

    monkeypatch.setattr(engine, "_in_place_on_fake", counting)
    monkeypatch.setattr(engine, "_DEVICE_QUERY", object())
    slow = _fake_training()
    assert fast == slow
    assert sum(calls) > 100  # Adam's lerp_, mul_, addcmul_, addcdiv_ took it


def test_in_place_errors_still_raise_on_fake_tensors():
    with helpers.VirtualGPU("1 GiB", fake=True, device="cpu"):
        a, b = torch.empty(3, 4), torch.empty(5, 4)
        with pytest.raises(RuntimeError):
            a.add_(b)  # does not broadcast to a's shape
        with pytest.raises(RuntimeError):  # a float cannot be written into integers
            torch.zeros(3, dtype=torch.int64).add_(1.5)
        step = torch.tensor(0.0)  # a constant (Adam's step counter): its value must follow
        step += 1
        step += 1
        assert step.item() == 2.0
