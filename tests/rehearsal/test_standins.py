"""The stand-ins themselves: SimulatedCuda restores torch.cuda exactly, refuses nesting,
reads memory from a VirtualGPU; FakeNvml installs and removes itself and fails like pynvml."""

from __future__ import annotations

import sys
import time

import pytest
import torch

import helpers
from helpers.core import nvml
from helpers.core.fake_nvml import FAILURES, FakeGpu, FakeNvml
from helpers.memory.cuda_standin import SimulatedCuda, simulated_uuid


def _snapshot():
    names = SimulatedCuda.PATCHED
    return ({n: torch.cuda.__dict__.get(n, "<missing>") for n in names},
            torch.backends.cudnn.version, torch.version.cuda)


def test_patches_torch_cuda_and_restores_every_name_exactly():
    before, available = _snapshot(), torch.cuda.is_available()  # True on a GPU machine
    with SimulatedCuda("L40S", device_count=2) as sim:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 2
        assert torch.cuda.get_device_name(1) == "NVIDIA L40S"
        props = torch.cuda.get_device_properties("cuda:1")
        assert props.total_memory == helpers.KNOWN_GPUS["L40S"]
        assert (props.major, props.minor) == (9, 0) and props.uuid == simulated_uuid(1)
        assert torch.version.cuda == "13.0" and torch.backends.cudnn.version() == 92000
        assert sim.calls("get_device_name") == [("get_device_name", "cuda:1")]
    assert _snapshot() == before
    assert torch.cuda.is_available() == available


def test_restores_after_an_exception_and_refuses_nesting():
    before = _snapshot()
    with pytest.raises(ZeroDivisionError), SimulatedCuda():
        raise ZeroDivisionError("inside the block")
    assert _snapshot() == before
    with SimulatedCuda() as outer:
        with pytest.raises(RuntimeError, match="already active"), SimulatedCuda():
            pass
        with pytest.raises(RuntimeError, match="already active"), outer:
            pass
        assert torch.cuda.is_available()  # the refused inner one changed nothing
    assert _snapshot() == before


def test_memory_reads_follow_a_virtual_gpu():
    with helpers.VirtualGPU("1 GiB", rounding=True, context_bytes="100 MiB",
                            device="cpu") as gpu, \
            SimulatedCuda(gpu) as sim:
        start = torch.cuda.memory_allocated()
        x = torch.empty(1024, 1024)  # 4 MiB
        assert torch.cuda.memory_allocated() == gpu.allocated_bytes == start + 4 * 1024**2
        assert torch.cuda.max_memory_allocated() == gpu.peak_allocated_bytes
        assert torch.cuda.memory_reserved() == gpu.reserved_bytes
        free, total = torch.cuda.mem_get_info()
        assert total == 1024**3 and free == total - 100 * 1024**2 - gpu.reserved_bytes
        del x
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == gpu.allocated_bytes == start
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == gpu.reserved_bytes < 4 * 1024**2
        assert sim.devices[0].name == "NVIDIA simulated GPU"


def test_counters_without_a_virtual_gpu():
    with SimulatedCuda("80GB", device_count=2) as sim:
        sim.set_memory(1, allocated=3 * 10**9, reserved=5 * 10**9, other=10**9)
        assert torch.cuda.memory_allocated(1) == 3 * 10**9
        assert torch.cuda.mem_get_info(1) == (80 * 10**9 - 6 * 10**9, 80 * 10**9)
        sim.set_memory(1, allocated=10**9)
        assert torch.cuda.max_memory_allocated(1) == 3 * 10**9
        torch.cuda.reset_peak_memory_stats(torch.device("cuda", 1))
        assert torch.cuda.max_memory_allocated(1) == 10**9
        torch.cuda.set_device(1)
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved(1) == 10**9
        assert torch.cuda.memory_allocated(0) == 0


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="device_count"):
        SimulatedCuda(device_count=0)
    with pytest.raises(TypeError, match="gpu"):
        SimulatedCuda(gpu=[1])
    with pytest.raises(ValueError, match="capability"):
        SimulatedCuda(capability=(9,))
    with SimulatedCuda() as sim:
        with pytest.raises(ValueError, match="device.*ordinal 1"):
            torch.cuda.memory_allocated(1)
        with pytest.raises(ValueError, match="cuda device"):
            torch.cuda.synchronize("cpu")
        with pytest.raises(TypeError, match="device"):
            torch.cuda.set_device(1.5)
        with pytest.raises(TypeError, match="fraction"):
            torch.cuda.set_per_process_memory_fraction(1)
        with pytest.raises(ValueError, match="fraction"):
            torch.cuda.set_per_process_memory_fraction(1.5)
        with pytest.raises(TypeError, match="enable_timing"):
            torch.cuda.Event(enable_timing="yes")
        with pytest.raises(ValueError, match="other"):
            sim.set_memory(0, other=10**15)


def test_initialisation_is_tracked_like_torch():
    with SimulatedCuda() as sim:
        assert not torch.cuda.is_initialized()
        torch.cuda.memory_allocated()  # statistics do not start CUDA
        torch.cuda.device_count()
        assert not torch.cuda.is_initialized()
        torch.cuda.get_device_properties(0)
        assert torch.cuda.is_initialized() and sim.initialized


def test_events_time_between_records_and_the_clock_watch_logs_reads():
    with SimulatedCuda() as sim:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with sim.watch_clock():
            start.record()
            time.perf_counter()  # not after a sync
            end.record()
            torch.cuda.synchronize()
            time.monotonic()
        assert sim.clock_reads_after("synchronize") == [False, True]
        assert start.elapsed_time(end) >= 0.0
        untimed = torch.cuda.Event()
        untimed.record()
        with pytest.raises(RuntimeError, match="enable_timing"):
            untimed.elapsed_time(end)
        with pytest.raises(RuntimeError, match="recorded"):
            torch.cuda.Event(enable_timing=True).elapsed_time(end)
    assert time.perf_counter.__module__ == "time"  # the watch restored the real clock


def test_rng_and_fraction_state_per_device():
    with SimulatedCuda(device_count=2):
        torch.cuda.manual_seed_all(7)
        states = torch.cuda.get_rng_state_all()
        assert len(states) == 2 and all(int(s[0]) == 7 for s in states)
        torch.cuda.set_rng_state(torch.full((16,), 9, dtype=torch.uint8), 1)
        assert int(torch.cuda.get_rng_state(1)[0]) == 9
        torch.cuda.set_per_process_memory_fraction(0.5, 1)
        assert torch.cuda.get_per_process_memory_fraction(1) == 0.5
        assert torch.cuda.get_per_process_memory_fraction(0) == 1.0
        assert torch.cuda.is_bf16_supported(including_emulation=False)
    with SimulatedCuda(capability=(7, 5)):
        assert not torch.cuda.is_bf16_supported(including_emulation=False)


def test_fake_nvml_installs_and_removes_itself():
    real = sys.modules.get("pynvml")
    state = dict(nvml._state)
    with FakeNvml([FakeGpu("NVIDIA L40S", total_bytes=48 * 10**9)], driver="575.1") as nv:
        assert sys.modules["pynvml"] is nv
        assert nvml.nvml_status() == (True, "driver 575.1")
        assert nvml.list_gpus()[0].uuid == "GPU-" + simulated_uuid(0)
        assert nv.calls("nvmlInit") == [("nvmlInit",)]  # initialised once, then cached
        nvml.gpu_count()
        assert len(nv.calls("nvmlInit")) == 1
    assert sys.modules.get("pynvml") is real
    assert nvml._state == state


def test_fake_nvml_errors_behave_like_pynvml():
    nv = FakeNvml()
    err = nv.NVMLError(3)
    assert isinstance(err, nv.NVMLError_NotSupported) and str(err) == "Not Supported"
    assert isinstance(nv.NVMLError_LibraryNotFound(), nv.NVMLError)
    assert not issubclass(nv.NVMLLibraryMismatchError, nv.NVMLError)
    with pytest.raises(nv.NVMLError_Uninitialized):
        nv.nvmlDeviceGetCount()
    with pytest.raises(ValueError, match="fail"):
        FakeNvml(fail="on_fire")
    with pytest.raises(ValueError, match="used_bytes"):
        FakeGpu(total_bytes=10, used_bytes=11)
    with pytest.raises(TypeError, match="cgroup_hidden must be True or False"):
        FakeGpu(cgroup_hidden=1)
    with pytest.raises(TypeError, match="mig must be True or False"):
        FakeGpu(mig="yes")
    assert "process_list_mismatch" in FAILURES


def test_the_clock_watch_follows_its_own_thread_unless_asked():
    import threading

    with SimulatedCuda() as sim:
        for everyone, expected in ((False, 1), (True, 2)):
            sim.clear_log()
            with sim.watch_clock(all_threads=everyone):
                other = threading.Thread(target=time.perf_counter)
                other.start()
                other.join()
                torch.cuda.synchronize()
                time.perf_counter()
            assert len(sim.calls("clock")) == expected
            assert sim.clock_reads_after() == [True]  # only this thread's reads count
        with pytest.raises(TypeError, match="all_threads"):
            sim.watch_clock(all_threads=1)
