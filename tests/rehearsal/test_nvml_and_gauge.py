"""Rehearsals of the NVML and gauge branches (helpers/core/nvml.py, helpers/watch/gauge.py,
helpers/core/gpu_visibility.py) with helpers.FakeNvml and helpers.SimulatedCuda."""

from __future__ import annotations

import os

import pytest
import torch

import helpers
from helpers.core import nvml
from helpers.core.fake_nvml import FakeGpu, FakeNvml, simulated_uuid
from helpers.core.gpu_visibility import gpu_visibility
from helpers.memory.cuda_standin import SimulatedCuda
from helpers.watch import gauge

GiB = 1024**3


@pytest.fixture(autouse=True)
def _no_pollers():
    yield
    for kind in ("gauge", "watch"):
        gauge._stop_poller(kind)


def test_nvml_reports_the_fake_gpus_memory_utilisation_and_power():
    gpu = FakeGpu("NVIDIA L40S", total_bytes=48 * GiB, used_bytes=5 * GiB,
                  reserved_bytes=GiB // 2, gpu_util_pct=97, memory_util_pct=40,
                  temperature_c=61, power_mw=250_500, power_limit_mw=350_000)
    with FakeNvml([gpu, FakeGpu()]):
        assert nvml.gpu_count() == 2
        assert nvml.gpu_memory(0) == nvml.GpuMemory(0, 48 * GiB, 5 * GiB, 42 * GiB + GiB // 2,
                                                    GiB // 2)
        assert nvml.gpu_utilization(0) == (97, 40)
        st = nvml.gpu_status(0)
        assert (st.name, st.temperature_c, st.power_w, st.power_limit_w) == (
            "NVIDIA L40S", 61, 250.5, 350.0)
        with pytest.raises(ValueError, match="no GPU 2"):
            nvml.gpu_memory(2)


@pytest.mark.parametrize("failure", ["library_not_found", "driver_not_loaded"])
def test_nvml_degrades_when_it_cannot_start(failure):
    with FakeNvml(fail=failure) as nv:
        ok, why = nvml.nvml_status()
        assert not ok and "is an NVIDIA driver installed?" in why
        assert nvml.list_gpus() == [] and nvml.gpu_count() == 0
        assert nvml.gpu_memory(0) is None and nvml.gpu_status(0) is None
        assert nvml.gpu_utilization(0) is None and nvml.gpu_processes(0) is None
        assert len(nv.calls("nvmlInit")) == 1  # the failure is remembered, not retried
    assert str(nv.NVMLError_LibraryNotFound()) in why or "Driver Not Loaded" in why


def test_nvml_falls_back_to_v1_memory_and_tolerates_unsupported_queries():
    gpu = FakeGpu(total_bytes=16 * GiB, used_bytes=4 * GiB, reserved_bytes=GiB)
    with FakeNvml(gpu, fail={"memory_v2_unsupported", "not_supported", "uuid_unsupported"}):
        mem = nvml.gpu_memory(0)
        assert (mem.used_bytes, mem.free_bytes, mem.reserved_bytes) == (5 * GiB, 11 * GiB, 0)
        st = nvml.gpu_status(0)
        assert (st.gpu_util_pct, st.temperature_c, st.power_w, st.power_limit_w) == (
            None, None, None, None)
        assert nvml.list_gpus()[0].uuid == ""


def test_process_list_degrades_on_old_drivers_and_refusals():
    procs = [(os.getpid(), 2 * GiB), (999_999_999, GiB)]
    with FakeNvml(FakeGpu(processes=procs), fail="process_list_mismatch") as nv:
        got = nvml.gpu_processes(0)  # the unversioned query fails: _v2 answers
    assert [(p.pid, p.used_bytes) for p in got] == procs
    assert nv.calls("nvmlDeviceGetComputeRunningProcesses_v2")
    with FakeNvml(FakeGpu(processes=procs), fail="process_list_no_permission"):
        assert nvml.gpu_processes(0) is None


OTHER_JOB = "GPU-00000000-0000-4000-8000-0000000000ff"  # a GPU torch does not see


def test_nvml_reads_of_a_hidden_gpu_or_a_mig_gpu_say_why_instead_of_raising():
    """NVML refuses the handle of a GPU a SLURM job's cgroup hides (NO_PERMISSION) and has no
    utilisation for a GPU in MIG mode (NOT_SUPPORTED): None and the reason, never NVMLError;
    a GPU number NVML does not have stays a ValueError."""
    gpus = [FakeGpu(uuid=OTHER_JOB, cgroup_hidden=True, gpu_util_pct=99),
            FakeGpu(mig=True, used_bytes=GiB, gpu_util_pct=50)]
    with FakeNvml(gpus):
        assert nvml.gpu_utilization(0) is None and nvml.gpu_utilization(1) is None
        assert nvml.gpu_memory(0) is None and nvml.gpu_status(0) is None
        assert nvml.gpu_processes(0) is None
        reading, why = nvml.gpu_utilization_or_why(0)
        assert reading is None and why == (
            "NVML cannot open GPU 0 (NVMLError_NoPermission: Insufficient Permissions): "
            "a GPU another job holds, hidden by this job's cgroup")
        reading, why = nvml.gpu_utilization_or_why(1)
        assert reading is None and why == (
            "NVML cannot read the utilisation of GPU 1 (NVMLError_NotSupported: Not "
            "Supported): it is in MIG mode, where NVML has no GPU-Util")
        st = nvml.gpu_status(1)
        assert st.gpu_util_pct is None and st.memory.used_bytes == GiB
        assert [(g.index, g.uuid) for g in nvml.list_gpus()] == [(1, "GPU-" + simulated_uuid(1))]
        with pytest.raises(ValueError, match="no GPU 2"):
            nvml.gpu_utilization(2)
        with pytest.raises(ValueError, match="no GPU 2"):
            nvml.gpu_utilization_or_why(2)


def test_nvml_errors_while_counting_or_reading_a_gpu_never_escape():
    def lost(*args):
        raise nv.NVMLError(nv.NVML_ERROR_UNKNOWN)

    with FakeNvml() as nv:
        nv.nvmlDeviceGetName = lost  # a GPU that fell off the bus
        assert nvml.gpu_status(0) is None and nvml.list_gpus() == []
        nv.nvmlDeviceGetCount = lost
        assert nvml.gpu_count() == 0 and nvml.gpu_memory(0) is None
        assert nvml.gpu_utilization_or_why(0) == (
            None, "NVML cannot count the GPUs (NVMLError_Unknown: Unknown Error)")


def test_gpu_watch_skips_a_gpu_the_cgroup_hides(cuda):
    torch.cuda.set_device(0)  # this process uses CUDA: the watch reads torch's statistics
    gpus = [FakeGpu(uuid=OTHER_JOB, cgroup_hidden=True),
            FakeGpu(uuid="GPU-" + simulated_uuid(0), gpu_util_pct=40)]
    with FakeNvml(gpus):
        watch = helpers.watch_gpus(interval=None)
    assert watch.header == "NVIDIA driver 580.95.05 (NVML), 2 GPU(s)"
    assert [row.reading.label for row in watch.rows] == ["GPU1"]
    assert "GPU-Util 40%" in watch.text()


def test_gauge_reports_the_simulated_gpus_numbers(cuda):
    cuda.set_memory(0, allocated=GiB, reserved=3 * GiB // 2)
    torch.cuda.set_device(0)  # this process uses CUDA now
    with FakeNvml(FakeGpu(used_bytes=3 * GiB), this_process_bytes=2 * GiB):
        reading = helpers.read_memory("cuda")
    assert reading.label == "GPU0" and reading.total_bytes == helpers.KNOWN_GPUS["H200"]
    assert reading.source == "NVML v2 + torch.cuda"
    assert dict(reading.bands) == {"tensors": GiB, "cache": GiB // 2, "other": 3 * GiB // 2}
    assert "this process 2.0 GiB" in reading.detail


def test_gauge_never_starts_cuda(cuda):
    with FakeNvml(FakeGpu(used_bytes=GiB)):
        reading = helpers.read_memory("cuda")
        watch = helpers.watch_gpus(interval=None)
    assert not cuda.initialized and not cuda.calls("get_device_properties")
    assert reading.source == "NVML v2" and dict(reading.bands)["other"] == GiB
    assert "no framework statistics yet" in reading.detail
    assert watch.header == "NVIDIA driver 580.95.05 (NVML), 1 GPU(s)"
    assert "GPU-Util 0%" in watch.text() and "NVIDIA H200" in watch.text()


def test_gauge_without_nvml_asks_torch_for_the_gpus_memory(cuda):
    cuda.set_memory(0, allocated=2 * GiB, reserved=2 * GiB, other=GiB)
    torch.cuda.current_device()
    with FakeNvml(fail="library_not_found"):
        reading = helpers.read_memory("cuda")
    assert reading.source == "torch.cuda.mem_get_info + torch.cuda"
    assert dict(reading.bands) == {"tensors": 2 * GiB, "cache": 0, "other": GiB}


def test_gauge_matches_gpus_by_uuid_across_a_renumbering():
    with SimulatedCuda(device_count=2) as sim, FakeNvml([FakeGpu(), FakeGpu()]):
        sim.devices[0].uuid, sim.devices[1].uuid = sim.devices[1].uuid, sim.devices[0].uuid
        sim.set_memory(0, allocated=GiB)
        sim.set_memory(1, allocated=5 * GiB)
        torch.cuda.init()
        # NVML's GPU 0 is torch's device 1 (CUDA_VISIBLE_DEVICES=1,0)
        assert dict(helpers.read_memory("cuda:0").bands)["tensors"] == 5 * GiB


def test_gpu_visibility_usable_when_the_uuids_match(cuda):
    with FakeNvml() as nv:
        v = gpu_visibility(nvml=nv, environ={})
    assert v.verdict == "usable" and v.usable
    assert v.message == "torch sees 1 GPU(s): NVIDIA H200; driver 580.95.05, CUDA 13.0"


@pytest.mark.parametrize("env, gpus, words", [
    ({"CUDA_VISIBLE_DEVICES": ""}, [FakeGpu()], "hides all 1 GPU(s) on purpose"),
    ({"SLURM_JOB_ID": "42"}, [FakeGpu()], "SLURM job 42 has no GPUs"),
    ({}, [FakeGpu(mig=True)], "MIG mode"),
])
def test_gpu_visibility_hidden_on_purpose(cuda, env, gpus, words):
    v = gpu_visibility(nvml=FakeNvml(gpus), environ=env)
    assert v.verdict == "hidden" and words in v.message


@pytest.mark.parametrize("sim, nv, words", [
    (dict(available=False), dict(driver="550.54.15", cuda_driver=12040),
     "NVIDIA driver 550.54.15 is too old"),
    (dict(available=False), dict(), "cannot use it"),
    (dict(device_count=1), dict(gpus=[FakeGpu(), FakeGpu()]), "torch sees 1 of the 2 GPU(s)"),
    (dict(), dict(gpus=[FakeGpu(uuid="GPU-00000000-dead")]), "torch does not see GPU 0"),
    (dict(capability=(7, 0)), dict(gpus=[FakeGpu(compute_capability=(7, 0))]),
     "compute capability 7.0, below the 7.5"),
])
def test_gpu_visibility_broken_names_the_cause(sim, nv, words):
    with SimulatedCuda(**sim):
        v = gpu_visibility(nvml=FakeNvml(**nv), environ={})
    assert v.verdict == "broken" and words in v.message, v.message


def test_gpu_visibility_on_a_node_whose_cgroup_hides_gpu_0(cuda):
    """SLURM gave this job NVML's GPU 1 (torch's cuda:0); the cgroup hides GPU 0, whose
    handle NVML refuses with NO_PERMISSION although nvmlDeviceGetCount counts it."""
    gpus = [FakeGpu(uuid="GPU-00000000-0000-4000-8000-0000000000ff", cgroup_hidden=True),
            FakeGpu(uuid="GPU-" + simulated_uuid(0))]
    v = gpu_visibility(nvml=FakeNvml(gpus), environ={"SLURM_JOB_ID": "42",
                                                     "SLURM_JOB_GPUS": "1"})
    assert v.verdict == "usable", v.message
    assert [(g.index, g.uuid) for g in v.nvml_gpus] == [(1, "GPU-" + simulated_uuid(0))]
    assert "GPU 0: NVMLError_NoPermission: Insufficient Permissions" in v.details["unreadable"]


def test_gpu_visibility_without_a_driver(cuda):
    v = gpu_visibility(nvml=FakeNvml(fail="library_not_found"), environ={})
    assert v.verdict == "no-gpu" and "NVML could not start" in v.message
