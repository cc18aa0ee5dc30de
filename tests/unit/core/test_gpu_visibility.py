"""helpers.core.gpu_visibility: NVML's GPUs against torch.cuda's, with fake NVML and CUDA."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from helpers.core import gpu_visibility as gv

H200 = ("NVIDIA H200", "GPU-11111111-2222-3333-4444-555555555555", (9, 0))
H200_B = ("NVIDIA H200", "GPU-aaaaaaaa-2222-3333-4444-555555555555", (9, 0))
V100 = ("Tesla V100-SXM2-32GB", "GPU-99999999-2222-3333-4444-555555555555", (7, 0))


class FakeNVMLError(Exception):
    pass


def fake_nvml(gpus=(), driver="580.65.06", cuda=13000, init_error=None, mig=(), hidden=()):
    """A pynvml stand-in: ``gpus`` are (name, uuid, compute capability); the handles of the
    GPUs in ``hidden`` cannot be opened (a SLURM cgroup: NVML still counts them)."""
    def init():
        if init_error:
            raise FakeNVMLError(init_error)

    def handle(i):
        if i in hidden:
            raise FakeNVMLError("Insufficient Permissions")
        return i

    return SimpleNamespace(
        NVMLError=FakeNVMLError, nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: driver,
        nvmlSystemGetCudaDriverVersion=lambda: cuda,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=lambda h: gpus[h][0],
        nvmlDeviceGetUUID=lambda h: gpus[h][1],
        nvmlDeviceGetCudaComputeCapability=lambda h: gpus[h][2],
        nvmlDeviceGetMigMode=lambda h: (1, 1) if h in mig else (0, 0),
    )


def _untouchable(*args, **kwargs):
    raise AssertionError("torch.cuda was asked although no GPU should be visible")


@pytest.fixture
def no_cuda_calls(monkeypatch):
    for name in ("is_available", "device_count", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, _untouchable)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda answering from a list of (name, uuid, cc) devices, CUDA 13 build."""
    def install(devices, *, available=None, cuda="13.0"):
        available = bool(devices) if available is None else available
        monkeypatch.setattr(torch.version, "cuda", cuda)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(devices))
        monkeypatch.setattr(torch.cuda, "get_arch_list",
                            lambda: ["sm_75", "sm_80", "sm_90", "sm_100", "sm_120"])

        def props(i):
            name, uuid, (major, minor) = devices[i]
            return SimpleNamespace(name=name, uuid=uuid.removeprefix("GPU-"), major=major,
                                   minor=minor)

        monkeypatch.setattr(torch.cuda, "get_device_properties", props)

    return install


def test_no_nvml_library_is_no_gpu_not_an_error(no_cuda_calls):
    r = gv.gpu_visibility(nvml=fake_nvml(init_error="NVML Shared Library Not Found"),
                          environ={})
    assert r.verdict == gv.NO_GPU and not r.broken
    assert r.message.startswith("no NVIDIA driver") and "Not Found" in r.message


def test_nvml_binding_missing_is_no_gpu(monkeypatch, no_cuda_calls):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    r = gv.gpu_visibility(environ={})
    assert r.verdict == gv.NO_GPU and "nvidia-ml-py is not installed" in r.message


def test_driver_without_gpus_is_no_gpu(no_cuda_calls):
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=()), environ={})
    assert r.verdict == gv.NO_GPU and "lists no GPU" in r.message


@pytest.mark.parametrize(("env", "words"), [
    ({"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES='' hides all 1 GPU(s) on purpose"),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, "hides all"),
    ({"SLURM_JOB_ID": "77"}, "SLURM job 77 has no GPUs"),
    ({"SLURM_JOB_ID": "77", "SLURM_GPUS_ON_NODE": "0"}, "--gres=gpu"),
])
def test_gpus_hidden_on_purpose_skip_without_touching_cuda(no_cuda_calls, env, words):
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[H200]), environ=env)
    assert r.verdict == gv.HIDDEN and words in r.message, r.message
    assert str(r).startswith("GPU visibility: HIDDEN: ")


def test_mig_mode_without_a_mig_device_selected_is_hidden(no_cuda_calls):
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[H200], mig={0}), environ={})
    assert r.verdict == gv.HIDDEN and "MIG mode" in r.message and "MIG-<uuid>" in r.message


def test_usable_when_torch_sees_the_same_uuids(fake_cuda):
    fake_cuda([H200, H200_B])
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[H200, H200_B]), environ={})
    assert r.usable and r.message.startswith("torch sees 2 GPU(s): NVIDIA H200, NVIDIA H200")
    assert r.torch_uuids == ("11111111-2222-3333-4444-555555555555",
                             "aaaaaaaa-2222-3333-4444-555555555555")


def test_usable_with_a_subset_selected(fake_cuda):
    fake_cuda([H200_B])
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[H200, H200_B]),
                          environ={"CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_ID": "5",
                                   "SLURM_JOB_GPUS": "1"})
    assert r.usable and "selects 1 of 2" in r.message and r.expected == 1


def test_broken_cpu_only_torch_build(fake_cuda):
    fake_cuda([], cuda=None)
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[H200]), environ={})
    assert r.broken and "CPU-only build" in r.message and "make setup GPU=1" in r.message


def test_broken_driver_too_old_for_cuda_13(fake_cuda):
    fake_cuda([], available=False)
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[H200], driver="570.86.15", cuda=12080),
                          environ={})
    assert r.broken
    assert "NVIDIA driver 570.86.15 is too old" in r.message and ">= 580" in r.message
    assert r.message.startswith("torch.cuda.is_available() is False")


def test_broken_gpu_too_old_for_the_build(fake_cuda):
    fake_cuda([], available=False)
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[V100]), environ={})
    assert r.broken and "compute capability 7.0, below the 7.5" in r.message


def test_broken_when_torch_sees_fewer_gpus(fake_cuda):
    fake_cuda([H200])
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[H200, H200_B]), environ={})
    assert r.broken and "torch sees 1 of the 2 GPU(s)" in r.message


def test_broken_when_a_visible_gpu_has_no_kernels(fake_cuda):
    fake_cuda([V100])  # an older build that still loads, but this arch list starts at sm_75
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[V100]), environ={})
    assert r.broken and "7.0, below the 7.5" in r.message


def test_nvml_failing_midway_is_reported_not_raised(no_cuda_calls):
    nvml = fake_nvml(gpus=[H200])
    nvml.nvmlDeviceGetUUID = lambda h: (_ for _ in ()).throw(FakeNVMLError("GPU is lost"))
    r = gv.gpu_visibility(nvml=nvml, environ={})
    assert r.verdict == gv.NO_GPU and "GPU is lost" in r.message


def test_a_gpu_the_cgroup_hides_is_skipped_not_fatal(fake_cuda):
    """A SLURM job on a shared node: NVML counts all GPUs but refuses the handles of the
    others' (NO_PERMISSION); the job's own GPU is listed and usable."""
    fake_cuda([H200_B])
    r = gv.gpu_visibility(nvml=fake_nvml(gpus=[H200, H200_B], hidden={0}),
                          environ={"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "1"})
    assert r.verdict == gv.USABLE, r.message
    assert [g.index for g in r.nvml_gpus] == [1]
    assert r.details["unreadable"] == ["GPU 0: FakeNVMLError: Insufficient Permissions"]
    assert "1 GPU(s) NVML counts could not be read" in r.message


def test_environ_must_be_a_mapping():
    with pytest.raises(TypeError, match="environ"):
        gv.gpu_visibility(nvml=fake_nvml(), environ=["CUDA_VISIBLE_DEVICES"])


@pytest.mark.parametrize(("verdict", "args", "code"), [
    (gv.BROKEN, [], 1), (gv.BROKEN, ["--require"], 1), (gv.HIDDEN, [], 0),
    (gv.HIDDEN, ["--require"], 1), (gv.NO_GPU, ["--require"], 1), (gv.USABLE, ["--require"], 0),
])
def test_command_line_exit_codes(monkeypatch, capsys, verdict, args, code):
    monkeypatch.setattr(gv, "gpu_visibility", lambda: gv.GpuVisibility(verdict, "why"))
    assert gv.main(args) == code
    assert capsys.readouterr().out == f"GPU visibility: {verdict.upper()}: why\n"
