"""Rehearsals of the TensorFlow-GPU branches (with a stand-in TensorFlow that has one GPU),
the gauge's and gpu_visibility's edge cases, the CUDA probe's memory fraction, lesson 08's
checker at its limits, and ddp_train.py's device choice."""

from __future__ import annotations

import importlib.util
import os
import types

import pytest
import torch
from script_loader import load_script

import helpers
from helpers import batch_size as bs
from helpers.core.fake_nvml import FakeGpu, FakeNvml
from helpers.core.gpu_visibility import gpu_visibility
from helpers.memory.cuda_standin import SimulatedCuda
from helpers.tf import runtime as tf_runtime
from helpers.watch import gauge

from .test_timing_and_memory_paths import _check_real

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB, GiB = 1024**2, 1024**3


@pytest.fixture(autouse=True)
def _no_pollers():
    yield
    for kind in ("gauge", "watch"):
        gauge._stop_poller(kind)


# ------------------------------------------------------------------------- TensorFlow on a GPU
@pytest.mark.parametrize("capability, policy", [((7, 5), "mixed_float16"),
                                                ((8, 0), "mixed_bfloat16")])
def test_keras_mixed_policy_asks_tensorflow_for_the_gpus_capability(fake_tf, capability,
                                                                    policy):
    seen = []

    def details(device):
        seen.append(device.name)
        return {"compute_capability": capability, "device_name": "NVIDIA test GPU"}

    fake_tf.config.experimental.get_device_details = details
    assert helpers.keras_mixed_policy() == policy
    assert seen == ["/physical_device:GPU:0"]


def test_keras_mixed_policy_edges_on_a_gpu_machine(fake_tf):
    """A CPU asked for by name stays bf16; a GPU TensorFlow does not have has no capability,
    and a GPU of unknown capability gets fp16 (every NVIDIA GPU computes it)."""
    from helpers.tf import policies

    assert helpers.keras_mixed_policy("CPU") == "mixed_bfloat16"
    assert policies.gpu_capability(fake_tf, index=1) is None
    fake_tf.config.experimental.get_device_details = lambda device: {}
    assert helpers.keras_mixed_policy("GPU:0") == "mixed_float16"


def test_tensorflow_gpu_choices(fake_tf):
    assert tf_runtime.memory_growth(fake_tf) == "grow on demand on 1 GPU(s)"
    assert fake_tf.growth == ["/physical_device:GPU:0"]

    def refuse(device, enable):
        raise RuntimeError("Physical devices cannot be modified after being initialized")

    fake_tf.config.experimental.set_memory_growth = refuse
    assert tf_runtime.memory_growth(fake_tf).startswith("already initialised")


def test_device_report_lists_tensorflows_gpu(fake_tf):
    report = helpers.device_report(tensorflow=True)
    assert report.tensorflow == "2.21.0" and report.tf_built_with_cuda
    assert report.tf_devices == ["/physical_device:CPU:0", "/physical_device:GPU:0"]


def test_batch_size_probe_for_tensorflow_on_a_gpu_reads_nvml(fake_tf):
    with FakeNvml(FakeGpu(total_bytes=24 * GiB, used_bytes=2 * GiB)):
        source, name, capacity, other, _ = bs._device_for("tensorflow", None, None)
    assert name == "TensorFlow GPU:0" and source.available
    # the card's total from NVML; what TF does not hold counts as other
    assert capacity == 24 * GiB and other == 2 * GiB - 256 * MiB


def test_gauge_adds_tensorflows_tensors(cuda, fake_tf):
    cuda.set_memory(0, allocated=GiB, reserved=GiB)
    torch.cuda.current_device()
    with FakeNvml(FakeGpu(used_bytes=3 * GiB)):
        reading = helpers.read_memory("cuda")
    assert reading.source == "NVML v2 + torch.cuda + TensorFlow"
    assert dict(reading.bands) == {"tensors": GiB + 256 * MiB, "cache": 0,
                                   "other": 2 * GiB - 256 * MiB}


# ------------------------------------------------------------------------- gauge edges
@pytest.mark.parametrize("gpu, fail, words", [
    (FakeGpu(processes=[(1, None)]), (), "1 process(es) on this GPU; the driver hides"),
    (FakeGpu(), "process_list_no_permission", "per-process memory: not reported"),
    (FakeGpu(processes=[(999_999_999, GiB)]), (), "PIDs not visible in this container"),
])
def test_gauge_process_detail(cuda, gpu, fail, words):
    torch.cuda.init()
    with FakeNvml(gpu, fail=fail):
        assert words in helpers.read_memory("cuda").detail


def test_gauge_for_a_gpu_nvml_does_not_have_falls_back_to_ram(cuda):
    torch.cuda.init()
    with FakeNvml():
        first = helpers.read_memory("cuda:0")
        again = helpers.read_memory("cuda:0")  # torch's index for GPU 0 is cached
        ram = helpers.read_memory("cuda:3")
    assert first.bands == again.bands
    assert ram.label == "RAM" and "NVML sees 1 GPU(s), so there is no GPU 3" in ram.detail


def test_gauge_survives_a_torch_cuda_that_raises(cuda, monkeypatch):
    def broken(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    torch.cuda.init()
    monkeypatch.setattr(torch.cuda, "device_count", broken)
    with FakeNvml():
        reading = helpers.read_memory("cuda")  # identity mapping, statistics still read
    assert reading.source == "NVML v2 + torch.cuda"
    monkeypatch.setattr(torch.cuda, "is_initialized", broken)
    gauge._torch_index.clear()
    with FakeNvml():
        assert helpers.read_memory("cuda").source == "NVML v2"


# ------------------------------------------------------------------------- gpu_visibility edges
@pytest.mark.parametrize("env, verdict, words", [
    ({"CUDA_VISIBLE_DEVICES": "0"}, "usable", "selects 1 of 2 GPU(s)"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-5e1a7ed0-0000-4000-8000-000000000001"}, "usable",
     "selects 1 of 2"),
    ({"CUDA_VISIBLE_DEVICES": "MIG-1234,0"}, "broken", "torch sees 1 of the 2"),
    ({"CUDA_VISIBLE_DEVICES": "nonsense,0"}, "hidden", "hides all 2 GPU(s)"),
])
def test_gpu_visibility_reads_cuda_visible_devices(env, verdict, words):
    with SimulatedCuda(device_count=1):
        v = gpu_visibility(nvml=FakeNvml([FakeGpu(), FakeGpu()]), environ=env)
    assert v.verdict == verdict and words in v.message, v.message


def test_gpu_visibility_edge_cases():
    with SimulatedCuda():
        partly_mig = gpu_visibility(nvml=FakeNvml([FakeGpu(), FakeGpu(mig=True)]), environ={})
        nvml_breaks = FakeNvml()
        nvml_breaks.nvmlSystemGetCudaDriverVersion = None  # an old binding: call missing
        nvml_breaks.nvmlDeviceGetMigMode = lambda handle: 1 / 0  # a call that raises
        still = gpu_visibility(nvml=nvml_breaks, environ={})
    assert partly_mig.verdict == "usable" and "1 GPU(s) in MIG mode are not counted" in \
        partly_mig.message
    assert still.verdict == "usable"
    with SimulatedCuda(cuda_version=None, available=False):
        cpu_build = gpu_visibility(nvml=FakeNvml(), environ={})
    assert cpu_build.verdict == "broken" and "CPU-only build" in cpu_build.message
    with SimulatedCuda(available=False) as sim:
        sim.ARCHS = ("sm_80", "sm_90")
        old_gpu = gpu_visibility(nvml=FakeNvml(FakeGpu(compute_capability=(7, 5))), environ={})
    assert "compute capability 7.5, below the 8.0" in old_gpu.message


def test_gpu_visibility_arch_list_failure_uses_the_default_floor(monkeypatch):
    with SimulatedCuda(capability=(7, 0)):
        monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: 1 / 0)
        v = gpu_visibility(nvml=FakeNvml(), environ={})
    assert v.verdict == "broken" and "below the 7.5" in v.message


# ------------------------------------------------------------------------- CUDA probe, checker
def test_cuda_probe_plans_against_the_capped_share():
    with SimulatedCuda("80GB") as sim:
        sim.set_memory(0, reserved=GiB, other=2 * GiB)
        torch.cuda.set_per_process_memory_fraction(0.5)
        _, name, capacity, other, _ = bs._device_for("torch", None, None)
    assert other == 2 * GiB and capacity == 2 * GiB + 40 * 10**9
    assert name == "cuda:0 (NVIDIA simulated GPU)"


def test_real_gpu_check_skips_when_other_processes_fill_the_card(monkeypatch):
    with SimulatedCuda("H200") as sim:
        sim.set_memory(0, other=100 * GiB)  # more than an L40S holds
        result, fake = _check_real(sim, monkeypatch, need=GiB)
    assert result is None and fake.attempts == []


def test_real_gpu_check_that_does_not_fit_even_uncapped(monkeypatch):
    with SimulatedCuda("H200") as sim:
        result, fake = _check_real(sim, monkeypatch, need=200 * GiB)
    assert fake.attempts[-1] == 1.0
    assert (result["fits"], result["needed_bytes"], result["updates"]) == (False, None, 0)


# ------------------------------------------------------------------------- ddp_train.py
def _ddp_train(monkeypatch):
    module = load_script("ddp_train", "ddp_train_rehearsal")
    calls = []
    monkeypatch.setattr(module, "dist", types.SimpleNamespace(
        init_process_group=lambda backend, **kw: calls.append((backend, kw)),
        get_rank=lambda: 0, get_world_size=lambda: 1))
    return module, calls


def test_ddp_train_joins_nccl_on_its_local_gpu(monkeypatch):
    module, calls = _ddp_train(monkeypatch)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with SimulatedCuda(device_count=2) as sim:
        rank, world, device = module.setup_distributed()
    assert device == torch.device("cuda", 1)
    assert calls == [("nccl", {"device_id": torch.device("cuda", 1)})]
    assert ("set_device", "cuda:1") in sim.log


def test_ddp_train_refuses_a_local_rank_without_a_gpu(monkeypatch):
    module, calls = _ddp_train(monkeypatch)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with SimulatedCuda(device_count=1), pytest.raises(SystemExit, match="sees 1 GPU"):
        module.setup_distributed()
    assert calls == []


# ------------------------------------------------------------------------- small branches
def test_amp_settings_for_cuda_on_a_machine_without_one():
    s = helpers.amp_settings("cuda")
    assert (s.dtype, s.use_scaler) == (torch.float16, True) and "no CUDA GPU here" in s.reason
    with SimulatedCuda(available=False):   # a CUDA build whose driver is too old
        tf32 = helpers.tf32_settings("cuda")
    assert tf32.capability is None and not tf32.applies
    assert tf32.baseline().startswith("fp32 baseline: IEEE fp32 on cuda without a GPU (TF32 needs")


def test_nvml_decodes_old_bindings_bytes_names_and_checks_indices():
    with FakeNvml(FakeGpu("Tesla T4"), bytes_names=True):
        assert helpers.core.nvml.list_gpus()[0].name == "Tesla T4"
        assert helpers.core.nvml.gpu_status(0).name == "Tesla T4"
        with pytest.raises(ValueError, match="index"):
            helpers.core.nvml.gpu_utilization(-1)


def test_gauge_leaves_tensorflow_alone_until_its_runtime_runs(cuda, fake_tf, monkeypatch):
    assert gauge._tf_current(0) == 256 * MiB
    assert gauge._tf_current(1) is None  # TF sees one GPU
    monkeypatch.setattr(fake_tf, "context_handle", None)
    assert gauge._tf_current(0) is None

    def broken(device):
        raise RuntimeError("GPU:0 is gone")

    monkeypatch.setattr(fake_tf, "context_handle", object())
    monkeypatch.setattr(fake_tf.config.experimental, "get_memory_info", broken)
    assert gauge._tf_current(0) is None


def test_real_gpu_check_lets_other_errors_of_the_uncapped_run_through(monkeypatch):
    with SimulatedCuda("H200") as sim:
        sim.set_memory(0, other=GiB)
        monkeypatch.setattr(sim, "allocate", _fail_uncapped(sim, sim.allocate))
        with pytest.raises(RuntimeError, match="illegal memory access"):
            _check_real(sim, monkeypatch, need=60 * GiB)


def _fail_uncapped(sim, allocate):
    def wrapped(n, device=None):
        if sim.devices[0].fraction == 1.0:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return allocate(n, device)
    return wrapped


def test_gpu_visibility_without_torch(monkeypatch):
    nv = FakeNvml()
    with monkeypatch.context() as m:
        m.setitem(__import__("sys").modules, "torch", None)
        v = gpu_visibility(nvml=nv, environ={})
    assert v.verdict == "broken" and "torch is not installed" in v.message


def test_cudnn_report_flags_a_sub_library_from_another_folder(cuda, monkeypatch, tmp_path):
    from helpers.core import cuda_libs

    torch_dir = tmp_path / "torch" / "nvidia" / "cudnn" / "lib"
    torch_dir.mkdir(parents=True)
    for stem in cuda_libs.CUDNN_SUBLIBRARIES:
        if stem != "libcudnn_engines_tensor_ir":
            (torch_dir / f"{stem}.so.9").touch()
    tf_dir = tmp_path / "tf" / "nvidia" / "cudnn" / "lib"
    maps = "\n".join(
        f"7f00-7f01 r-xp 0 08:01 1 {torch_dir / (stem + '.so.9')}"
        for stem in cuda_libs.CUDNN_SUBLIBRARIES if stem != "libcudnn_engines_tensor_ir"
    ) + f"\n7f02-7f03 r-xp 0 08:01 2 {tf_dir / 'libcudnn_engines_tensor_ir.so.9'}\n"
    ran = []
    real_randn, real_conv = torch.randn, torch.nn.functional.conv2d
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch, "randn", lambda *s, device=None, **k: (
        ran.append(str(device)), real_randn(*s, **k))[1])
    monkeypatch.setattr(torch.nn.functional, "conv2d", lambda *a, **k: (
        ran.append("conv2d"), real_conv(*a, **k))[1])
    real_loaded = cuda_libs.loaded_libraries
    monkeypatch.setattr(cuda_libs, "loaded_libraries",
                        lambda pattern: real_loaded(pattern, maps_text=maps))
    monkeypatch.setattr(cuda_libs, "torch_cudnn_dir", lambda: torch_dir)
    report = cuda_libs.cudnn_report()
    assert ran == ["cuda", "cuda", "conv2d"]  # one convolution on the GPU first
    assert report.checked
    assert any("libcudnn_engines_tensor_ir is missing" in p for p in report.problems)
    assert any("libcudnn_engines_tensor_ir loaded from" in p and "tf" in p
               for p in report.problems)


def test_cudnn_report_without_cudnn(cuda, monkeypatch):
    from helpers.core import cuda_libs

    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)
    report = cuda_libs.cudnn_report()
    assert not report.checked and "cudnn.is_available() is False" in report.reason


def test_gpu_setup_verify_checks_visibility_on_a_cuda_build(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location(
        "gpu_setup_rehearsal", os.path.join(ROOT, "scripts", "gpu_setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ran = []
    monkeypatch.setattr(module.subprocess, "run", lambda cmd, **kw: (
        ran.append(cmd[1:]), types.SimpleNamespace(returncode=1))[1])
    with SimulatedCuda(cuda_version="13.0"):
        assert module.verify() == 1  # gpu_visibility's verdict decides
    assert f"torch {torch.__version__}: CUDA 13.0" in capsys.readouterr().out
    assert ran == [["-m", "helpers.core.gpu_visibility"]]


def test_gauge_without_nvml_or_torch_statistics_has_no_gpu_reading(cuda, monkeypatch):
    assert gauge._cuda_reading(0, None) is None  # CUDA not started, no NVML memory

    def broken():
        raise RuntimeError("CUDA driver error")

    monkeypatch.setattr(torch.cuda, "is_initialized", broken)
    with FakeNvml(FakeGpu(processes=[(999_999_999, GiB)])):  # a PID that is not here
        assert "PIDs not visible in this container" in helpers.read_memory("cuda").detail
