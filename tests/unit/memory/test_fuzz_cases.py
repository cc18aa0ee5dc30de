"""Inputs that once hung, leaked or escaped with an unclear error, one test each (the case
numbers are those of the fuzzing pass over the public API)."""

from __future__ import annotations

import gc

import pytest
import torch

import helpers
from helpers.memory.capacity import parse_capacity
from helpers.memory.measure import measure_step
from helpers.memory.virtual import VirtualGPU, full_scale
from helpers.models import MLP


def _oom_step_in_measure_step(fake: bool):
    """Baseline and allocated bytes right after an OOM caught around measure_step."""
    def run(capacity):
        with VirtualGPU(capacity, fake=fake, rounding=fake, device="cpu") as gpu:
            torch.manual_seed(0)
            model = MLP(in_features=64, hidden=256, depth=3)
            opt = torch.optim.Adam(model.parameters())
            x, y = torch.randn(4000, 64), torch.randint(0, 4, (4000,))
            baseline = gpu.allocated_bytes

            def step():
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()

            try:
                report = measure_step(step, model=model, optimizer=opt, inputs=x)
            except torch.OutOfMemoryError as exc:
                assert exc.memory_report.notes[-1].startswith("ran out of memory")
                report = None
            return baseline, gpu.allocated_bytes, report

    baseline, _, report = run("10 GiB")
    # a capacity between the baseline and the step's peak: the OOM lands mid-step
    return run(baseline + report.peak_bytes // 2)


@pytest.mark.parametrize("fake", [False, True])
def test_case_2_oom_in_measure_step_releases_the_step_without_gc(fake):
    """Fuzz case 2: an OOM inside measure_step kept the failed step's tensors alive through
    the stored error's traceback (freed only by gc.collect()). Now they are gone when the
    except block ends."""
    gc.collect()
    gc.disable()
    try:
        baseline, after, report = _oom_step_in_measure_step(fake)
    finally:
        gc.enable()
    assert report is None  # it did run out of memory
    assert after <= baseline + 4096, (baseline, after)


def test_case_4_self_referencing_containers_do_not_hang():
    """Fuzz case 4: VirtualGPU.track(l) and measure_step(inputs=l) on a list that contains
    itself hung, memory growing; each container is now visited once."""
    loop = [torch.ones(3)]
    loop.append(loop)
    nested = {"a": loop, "b": (loop, {"c": loop})}
    with VirtualGPU("1 GiB", device="cpu") as gpu:
        assert gpu.track(loop) == 12
        assert gpu.track(nested) == 0  # already counted
    report = measure_step(lambda: None, inputs=nested, device="cpu")
    assert report.baseline_bytes == 12


def test_case_7_stray_exit_leaves_full_scale_working():
    """Fuzz case 7: one stray full_scale().__exit__() broke every later full_scale block
    (the Module._apply patch count went negative). Now it is a RuntimeError and nothing
    changes."""
    apply = torch.nn.Module._apply
    with pytest.raises(RuntimeError, match="not active"):
        full_scale().__exit__(None, None, None)
    with pytest.raises(RuntimeError, match="not active"):
        VirtualGPU("1 GiB").__exit__(None, None, None)
    assert torch.nn.Module._apply is apply
    with full_scale(device="cpu"):
        model = torch.nn.Linear(4, 4).to("cpu")
        model(torch.ones(2, 4)).sum().backward()
    assert torch.nn.Module._apply is apply


@pytest.mark.parametrize("value", [10**400, -10**5000, "9" * 5000 + " GiB", 2**63],
                         ids=["10**400", "-10**5000", "5000 nines GiB", "2**63"])
def test_case_11_huge_capacities_are_a_clear_value_error(value):
    """Fuzz case 11: VirtualGPU(10**400) raised OverflowError, parse_capacity(-10**5000) a
    ValueError about Python's int-string limit."""
    for make in (parse_capacity, VirtualGPU):
        with pytest.raises(ValueError, match="capacity") as info:
            make(value)
        assert "limit" not in str(info.value) and len(str(info.value)) < 300


def test_case_11_measure_step_rejects_absurd_step_counts_at_once():
    """Fuzz case 11: measure_step(lambda: None, steps=10**400) hung."""
    for steps in (10**400, 10**6):
        with pytest.raises(ValueError, match="steps must be at most"):
            measure_step(lambda: None, steps=steps)


def test_paused_runs_outside_the_virtual_gpu():
    """VirtualGPU.paused(): tensors made inside are real and uncounted (the finder's host
    copies), also with fake=True; outside the GPU's block it does nothing."""
    from helpers.memory.virtual import is_fake

    for fake in (False, True):
        gpu = VirtualGPU("1 GiB", fake=fake, device="cpu")
        with gpu.paused():
            pass
        with gpu:
            x = torch.ones(256)
            with gpu.paused():
                y = torch.ones(1024)
            z = torch.ones(256)
            assert gpu.allocated_bytes == 2 * 1024
        assert is_fake(x) is fake and is_fake(z) is fake and not is_fake(y)
        assert float(y.sum()) == 1024


def test_release_after_error_frees_a_failed_steps_tensors_without_gc():
    """memory.errors.release_after_error: the one release path after an out-of-memory error
    (the finder, check_training). Frames of the error and of the error it was raised from
    are cleared, so their tensors go; then empty_cache is called."""
    import weakref

    from helpers.memory.errors import release_after_error

    def failing_step():
        activations = torch.ones(1000)
        holder.append(weakref.ref(activations))
        try:
            raise RuntimeError("inner")
        except RuntimeError as inner:
            raise torch.OutOfMemoryError("CUDA out of memory.") from inner

    holder, emptied = [], []
    try:
        failing_step()
    except torch.OutOfMemoryError as exc:
        failed = exc
    gc.disable()
    try:
        assert holder[0]() is not None  # the traceback holds the step's frame
        release_after_error(failed, lambda: emptied.append(True))
        assert holder[0]() is None and emptied == [True]
        assert failed.__traceback__ is None and failed.__cause__.__traceback__ is None
    finally:
        gc.enable()
    release_after_error(None)  # nothing to clear: collects only


@pytest.mark.parametrize("device, error", [(None, ValueError), (0, ValueError), (-1, ValueError),
                                           ("x", ValueError), (1.5, TypeError)])
def test_warm_up_cuda_without_cuda_is_a_clear_error(device, error):
    """Fuzz run after the redesign: warm_up_cuda() on a machine without CUDA raised torch's
    AssertionError ('Torch not compiled with CUDA enabled') or a raw RuntimeError."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(error, match="device"):
        helpers.warm_up_cuda(device)
