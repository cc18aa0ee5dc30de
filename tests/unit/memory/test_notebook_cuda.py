"""helpers.virtual_cuda: plain CUDA code in a notebook cell, on a virtual card."""

import pytest
import torch
from torch import nn

import helpers
from helpers.memory.planner import DEFAULT_CONTEXT

MiB = 2**20
LINEAR_BYTES = 4 * (1024 * 1024 + 1024)  # Linear(1024, 1024) in float32: 4,198,400 (512-aligned)


def test_plain_cuda_lines_count_on_the_virtual_card():
    vc = helpers.virtual_cuda("L40S")
    with vc as gpu:
        assert torch.cuda.is_available() and torch.cuda.get_device_name() == "NVIDIA L40S"
        free, total = torch.cuda.mem_get_info()
        assert total == gpu.capacity_bytes and total - free == DEFAULT_CONTEXT
        device = "cuda"
        model = nn.Linear(1024, 1024).to(device)
        assert torch.cuda.memory_allocated() == LINEAR_BYTES
        x = torch.randn(256, 1024, device=device)
        torch.cuda.reset_peak_memory_stats()
        model(x).sum().backward()
        peak = torch.cuda.max_memory_allocated()
        # the weights, their gradients and the input (256 x 1024 floats) at least
        assert peak >= 2 * LINEAR_BYTES + 256 * 1024 * 4
        assert torch.cuda.max_memory_reserved() >= peak
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.peak"] == peak and stats["num_ooms"] == 0
        assert "Allocated memory" in torch.cuda.memory_summary()
        assert torch.accelerator.current_accelerator() == torch.device("cuda")
        assert torch.accelerator.max_memory_allocated() == peak
        del x
    assert gpu.peak_allocated_bytes == peak
    assert not torch.cuda.is_available()  # this CPU build's own answer again


def test_too_big_raises_a_real_out_of_memory_error_and_frees_it():
    with helpers.virtual_cuda("T4"):
        before = torch.cuda.memory_allocated()
        with pytest.raises(torch.OutOfMemoryError, match=r"CUDA out of memory. Tried to "
                           r"allocate 40.00 GiB.*raised by torch.empty\(device='cuda'\)"):
            torch.empty(10 * 2**30, device="cuda")  # 40 GiB of float32 on a 15 GiB card
        assert torch.cuda.memory_allocated() == before
        assert torch.cuda.memory_stats()["num_ooms"] == 1


def test_a_read_value_gets_a_stand_in_and_its_line_is_listed():
    vc = helpers.virtual_cuda("A100-80GB")
    with vc:
        loss = torch.ones(3, device="cuda").sum()
        value = loss.item()
        torch.save({"w": loss}, "/nonexistent-folder/never-written.pt")
    assert value == 1.0
    (read,) = vc.stand_ins
    assert read.what == "item()" and read.where.line > 0
    assert "value = loss.item()" in read.where.code
    assert any("torch.save skipped" in note for note in vc.notes)


def test_everything_is_put_back_after_an_error_inside():
    seed_state = torch.get_rng_state()
    with pytest.raises(ZeroDivisionError), helpers.virtual_cuda("L40S"):
        torch.manual_seed(1)
        torch.zeros(4, device="cuda")
        raise ZeroDivisionError("the learner's cell fails")
    assert not torch.cuda.is_available()
    assert torch.equal(torch.get_rng_state(), seed_state)
    assert torch.ones(2).sum().item() == 2.0  # real tensors again


def test_bad_arguments_are_refused_with_their_names():
    with pytest.raises(ValueError, match="capacity|card"):
        helpers.virtual_cuda("no-such-card")
    with pytest.raises(ValueError, match="context_bytes"):
        helpers.virtual_cuda("T4", context_bytes="20 GiB")
    with pytest.raises((TypeError, ValueError), match="workspaces"):
        helpers.virtual_cuda("T4", workspaces="yes")
    vc = helpers.virtual_cuda("T4")
    with vc, pytest.raises(RuntimeError, match="already running"):
        vc.__enter__()
    with pytest.raises(RuntimeError, match="without __enter__"):
        vc.__exit__(None, None, None)


def test_workspaces_are_charged_when_asked():
    sizes = {}
    for workspaces in (False, True):
        with helpers.virtual_cuda("H100-80GB", workspaces=workspaces):
            a = torch.randn(512, 512, device="cuda")
            torch.cuda.reset_peak_memory_stats()
            a @ a
            sizes[workspaces] = torch.cuda.max_memory_allocated()
    assert sizes[True] - sizes[False] >= 32 * MiB  # Hopper's cuBLAS workspace
