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


# ---------------------------------------------------------------------- memory snapshots
def _small_step():
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to("cuda")
    x = torch.randn(4096, 1024, device="cuda")  # 16 MiB: a large segment of its own
    return model, x


def test_memory_history_records_the_allocators_events_in_pytorchs_format(tmp_path):
    import pickle

    from torch.cuda import _memory_viz

    with helpers.virtual_cuda("L40S"):
        model, x = _small_step()
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
        model(x).sum().backward()  # the line the activations come from
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._dump_snapshot(str(tmp_path / "snapshot.pickle"))
        allocated = torch.cuda.memory_allocated()
        reserved = torch.cuda.memory_reserved()
        torch.cuda.memory._record_memory_history(enabled=None)
        assert torch.cuda.memory._snapshot()["device_traces"] == [[]]  # stopping clears it
    trace = snapshot["device_traces"][0]
    actions = {e["action"] for e in trace}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc"} <= actions
    for e in trace:
        assert e["stream"] == 0 and e["size"] > 0 and isinstance(e["addr"], int)
    # the activations (4096 x 1024 float32 = 16 MiB) were made on this test's line
    relu = [e for e in trace if e["action"] == "alloc" and e["size"] == 16 * MiB]
    assert relu and all(any(f["filename"] == __file__ for f in e["frames"]) for e in relu)
    assert not any("helpers" + "/memory" in f["filename"] for e in trace for f in e["frames"])
    # segments agree with the counters, block by block
    segs = snapshot["segments"]
    assert sum(s["total_size"] for s in segs) == reserved
    assert sum(s["allocated_size"] for s in segs) == allocated
    for s in segs:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
        assert s["blocks"][0]["address"] == s["address"]
    # torch's own tools read it; the pickle is the same dict
    with open(tmp_path / "snapshot.pickle", "rb") as f:
        dumped = pickle.load(f)
    assert dumped["segments"] == segs
    assert "segments: " in _memory_viz.segsum(dumped)
    assert "cudaMalloc" in _memory_viz.trace(dumped)
    assert "<html" in _memory_viz.trace_plot(dumped).lower()
    assert "<html" in _memory_viz.segment_plot(dumped).lower()
    lines = _memory_viz.memory(dumped, format_flamegraph=lambda lines: lines)
    assert "active_allocated" in lines


def test_memory_history_replays_to_the_peak():
    with helpers.virtual_cuda("L40S"):
        model, x = _small_step()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
        model(x).sum().backward()
        peak = torch.cuda.max_memory_allocated()
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
    live, highest = start, start
    for e in trace:
        live += {"alloc": e["size"], "free_completed": -e["size"]}.get(e["action"], 0)
        highest = max(highest, live)
    assert highest == peak


def test_memory_history_keeps_the_last_max_entries_and_records_an_oom():
    with helpers.virtual_cuda("T4"):
        torch.cuda.memory._record_memory_history(max_entries=3)
        for _ in range(5):
            torch.ones(1024, device="cuda")
        assert len(torch.cuda.memory._snapshot()["device_traces"][0]) == 3
        torch.cuda.memory._record_memory_history(enabled="all", clear_history=True)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(10 * 2**30, device="cuda")
        oom = [e for e in torch.cuda.memory._snapshot()["device_traces"][0]
               if e["action"] == "oom"]
        torch.cuda.memory._record_memory_history(enabled=None)
    assert oom and oom[0]["size"] >= 40 * 2**30 and oom[0]["device_free"] > 0


def test_state_only_history_keeps_frames_of_live_blocks_but_no_trace():
    with helpers.virtual_cuda("L40S"):
        torch.cuda.memory._record_memory_history(enabled="state")
        kept = torch.ones(1024, device="cuda")  # noqa: F841 - alive at the snapshot
        snapshot = torch.cuda.memory._snapshot()
        assert torch.cuda.memory_snapshot() == snapshot["segments"]
        torch.cuda.memory._record_memory_history(enabled=None)
    assert snapshot["device_traces"] == [[]]
    blocks = [b for s in snapshot["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated"]
    assert any(f["filename"] == __file__ for b in blocks for f in b["frames"])


@pytest.mark.parametrize("kwargs, match", [
    ({"enabled": "yes"}, "enabled must be one of"),
    ({"context": "some"}, "context must be one of"),
    ({"stacks": "cpp"}, "stacks must be one of"),
    ({"max_entries": 0}, "max_entries must be a whole number"),
    ({"max_entries": 2.5}, "max_entries must be a whole number"),
    ({"device": 1}, "the virtual card is cuda:0"),
    ({"device": "cpu"}, "the virtual card is cuda:0"),
    ({"skip_actions": ["alloc"]}, "skip_actions is not simulated"),
])
def test_memory_history_rejects_bad_arguments(kwargs, match):
    with helpers.virtual_cuda("L40S"), pytest.raises(ValueError, match=match):
        torch.cuda.memory._record_memory_history(**kwargs)


def test_memory_history_functions_are_put_back_after_the_block(tmp_path):
    originals = (torch.cuda.memory._record_memory_history, torch.cuda.memory._snapshot,
                 torch.cuda.memory._dump_snapshot, torch.cuda.memory_snapshot)
    with helpers.virtual_cuda("L40S"):
        with pytest.raises(TypeError, match="filename must be a path"):
            torch.cuda.memory._dump_snapshot(3)
        with pytest.raises(ValueError, match="cuda:0"):
            torch.cuda.memory._snapshot(device="cuda:1")
    assert (torch.cuda.memory._record_memory_history, torch.cuda.memory._snapshot,
            torch.cuda.memory._dump_snapshot, torch.cuda.memory_snapshot) == originals
