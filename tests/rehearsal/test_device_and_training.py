"""Rehearsals of CUDA branches in device.py, environment.py, launch.py, amp.py, checkpoint.py,
memory/measure.py and memory/report.py, with helpers.SimulatedCuda and helpers.FakeNvml."""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers.core.fake_nvml import FakeGpu, FakeNvml
from helpers.memory.cuda_standin import SimulatedCuda

MiB = 1024**2


def test_device_report_lists_the_gpu_with_driver_name_and_cudnn(cuda, fake_nvml):
    report = helpers.device_report(tensorflow=False)
    assert report.driver == "580.95.05"
    assert [(g.index, g.name, g.source) for g in report.gpus] == [(0, "NVIDIA H200", "NVML")]
    assert report.torch_cuda_available and report.cudnn_version == "92000"
    text = report.text() if hasattr(report, "text") else str(report)
    assert "NVIDIA driver       580.95.05" in text
    assert "yes (built for CUDA 13.0)" in text and "cuDNN" in text
    assert report.has_gpu and helpers.core.device.NO_GPU_PLAN not in report.notes


def test_device_report_asks_torch_when_nvml_cannot_start(cuda):
    with FakeNvml(fail="driver_not_loaded"):
        report = helpers.device_report(tensorflow=False)
    assert report.driver == "" or report.driver is None
    assert "Driver Not Loaded" in report.nvml_note
    assert [(g.name, g.total_bytes, g.source) for g in report.gpus] == [
        ("NVIDIA H200", helpers.KNOWN_GPUS["H200"], "torch")]


def test_pick_device_and_ddp_plan_choose_cuda_and_nccl():
    with SimulatedCuda(device_count=4):
        assert helpers.pick_device() == torch.device("cuda")
        assert helpers.pick_device("cpu") == torch.device("cpu")
        plan = helpers.ddp_plan()
    assert (plan.nproc_per_node, plan.device, plan.backend) == (4, "cuda", "nccl")
    assert plan.text() == "4 process(es), one per GPU, on cuda over nccl"
    assert helpers.ddp_plan().backend == "gloo"  # the stand-in is gone: CPU again


@pytest.mark.parametrize("capability, dtype, scaler", [
    ((9, 0), torch.bfloat16, False),   # Hopper: bf16 natively
    ((7, 5), torch.float16, True),     # Turing: fp16 with a GradScaler
])
def test_amp_settings_ask_the_gpu_about_bf16(capability, dtype, scaler):
    with SimulatedCuda(capability=capability) as sim:
        s = helpers.amp_settings("cuda")
    assert (s.device_type, s.dtype, s.use_scaler) == ("cuda", dtype, scaler)
    assert sim.calls("is_bf16_supported") == [("is_bf16_supported", False)]


@pytest.mark.parametrize("capability, applies", [((8, 0), True), ((7, 0), False)])
def test_amp_settings_say_what_fp32_runs_in_on_the_gpu(capability, applies):
    """TF32 acts from compute capability 8.0 on (Ampere); torch 2.13's defaults: matmuls in
    IEEE fp32, cuDNN convolutions in TF32."""
    with SimulatedCuda(capability=capability) as sim:
        tf32 = helpers.amp_settings("cuda").tf32
    assert ("get_device_capability", "cuda:0") in sim.log
    assert tf32.capability == capability and tf32.applies is applies
    assert not tf32.matmul_tf32 and tf32.conv_tf32 is applies
    major, minor = capability
    if applies:
        assert tf32.baseline() == (
            f"fp32 baseline on this GPU (compute capability {major}.{minor}): matmuls IEEE fp32, "
            "convolutions TF32: state it with every fp32 time; "
            "torch.backends.cuda.matmul.fp32_precision = 'tf32' speeds fp32 matmuls up")
    else:
        assert tf32.baseline().startswith(
            f"fp32 baseline: IEEE fp32 on this GPU (compute capability {major}.{minor}) (TF32 "
            "needs an NVIDIA GPU of compute capability 8.0 or newer")
    runs_in = [row[-1] for row in tf32.table().rows]
    assert runs_in == (["IEEE fp32", "TF32", "TF32"] if applies else ["IEEE fp32"] * 3)


def test_amp_settings_tf32_after_switching_matmuls_on():
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        with SimulatedCuda(capability=(9, 0)):
            tf32 = helpers.tf32_settings("cuda")
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
    assert tf32.matmul_tf32 and tf32.baseline().endswith(
        "matmuls TF32, convolutions TF32: state it with every fp32 time")


def test_checkpoint_saves_and_restores_every_gpus_rng_state(tmp_path):
    with SimulatedCuda(device_count=2):
        torch.cuda.set_rng_state(torch.full((16,), 3, dtype=torch.uint8), 0)
        torch.cuda.set_rng_state(torch.full((16,), 5, dtype=torch.uint8), 1)
        state = helpers.rng_state()
        assert [int(s[0]) for s in state["cuda"]] == [3, 5]
        torch.cuda.manual_seed_all(0)  # training moves the generators on
        assert helpers.set_rng_state(state) == ["python", "numpy", "torch", "cuda"]
        assert [int(torch.cuda.get_rng_state(i)[0]) for i in range(2)] == [3, 5]
    with SimulatedCuda(device_count=1) as one:  # resumed on a machine with fewer GPUs
        assert helpers.set_rng_state(state)[-1] == "cuda"
        assert one.calls("set_rng_state") == [("set_rng_state", "cuda:0")]
    assert helpers.set_rng_state(state) == ["python", "numpy", "torch"]  # no GPU: skipped


def test_measure_step_reads_the_cuda_allocator_after_syncs():
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with SimulatedCuda("L40S") as sim:
        sim.set_memory(0, allocated=10 * MiB, reserved=20 * MiB)

        def step():
            sim.set_memory(0, allocated=50 * MiB, reserved=64 * MiB)  # the step's peak
            model(x).sum().backward()
            sim.set_memory(0, allocated=12 * MiB)

        report = helpers.measure_step(step, model=model, inputs=x, device="cuda")
    c = report.cuda
    assert (c.device_name, c.total_bytes) == ("NVIDIA L40S", helpers.KNOWN_GPUS["L40S"])
    assert (c.allocated_before_bytes, c.peak_allocated_bytes, c.allocated_after_bytes) == (
        10 * MiB, 50 * MiB, 12 * MiB)
    assert c.peak_reserved_bytes == 64 * MiB
    names = [e[0] for e in sim.log]
    # the peak is reset after a sync, before the step; the peaks are read after a sync
    assert names.index("synchronize") < names.index("reset_peak_memory_stats")
    last_sync = len(names) - 1 - names[::-1].index("synchronize")
    assert last_sync < names.index("max_memory_allocated")
    assert "CUDA allocator (NVIDIA L40S): peak 50.00 MiB allocated, 64.00 MiB reserved" in \
        str(report)


def test_virtual_gpus_follow_pick_device_and_a_cpu_one_leaves_torch_cuda_alone():
    model = torch.nn.Linear(8, 8)
    with SimulatedCuda() as sim:
        assert helpers.VirtualGPU("1 GiB").device_type == "cuda"  # pick_device() on a GPU
        with helpers.VirtualGPU("1 GiB", device="cpu") as gpu:
            report = helpers.measure_step(lambda: model(torch.randn(4, 8)).sum().backward(),
                                          model=model)
    assert report.cuda is None and report.peak_bytes == gpu.peak_allocated_bytes > 0
    assert not sim.calls("synchronize") and not sim.calls("reset_peak_memory_stats")


def test_fake_nvml_gpus_match_the_simulated_cuda_uuids(cuda):
    with FakeNvml([FakeGpu(), FakeGpu()]):
        uuids = [g.uuid for g in helpers.core.nvml.list_gpus()]
    assert uuids == ["GPU-" + torch.cuda.get_device_properties(0).uuid,
                     "GPU-" + helpers.memory.cuda_standin.simulated_uuid(1)]
