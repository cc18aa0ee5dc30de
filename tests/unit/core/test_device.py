import pytest

from helpers.core import device, nvml
from helpers.core.device import NO_GPU_PLAN, device_report


def test_report_without_tensorflow_is_fast_and_complete():
    report = device_report(tensorflow=False)
    text = report.text()
    for key in ("Python", "PyTorch", "CPU cores", "RAM", "NVIDIA driver"):
        assert key in text
    assert "<table>" in report._repr_html_()


def test_no_gpu_says_what_the_lessons_do_instead(monkeypatch):
    import torch

    monkeypatch.setattr(nvml, "nvml_status", lambda: (False, "no driver here"))
    monkeypatch.setattr(nvml, "list_gpus", lambda: [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = device_report(tensorflow=False)
    assert not report.has_gpu
    assert NO_GPU_PLAN in report.notes
    assert "GPUs" in report.text() and "none (no driver here)" in report.text()


def test_nvml_gpus_are_listed_with_their_source(monkeypatch):
    monkeypatch.setattr(nvml, "nvml_status", lambda: (True, "driver 580.1"))
    monkeypatch.setattr(
        nvml, "list_gpus",
        lambda: [nvml.GpuInfo(0, "NVIDIA L40S", 46068 * 2**20), nvml.GpuInfo(1, "NVIDIA L40S",
                                                                             46068 * 2**20)],
    )
    report = device_report(tensorflow=False)
    assert report.has_gpu and report.driver == "580.1"
    assert "NVIDIA L40S, 45.0 GiB (NVML)" in report.text()
    assert "GPU 1" in report.text()
    assert NO_GPU_PLAN not in report.notes


def test_report_with_tensorflow_lists_physical_devices():
    pytest.importorskip("tensorflow", reason="TensorFlow is not installed")
    report = device_report(tensorflow=True)
    assert report.tensorflow
    assert any(d.endswith("CPU:0") for d in report.tf_devices)


def test_report_rejects_bad_arguments():
    with pytest.raises(TypeError, match="tensorflow"):
        device_report(tensorflow="no")


def test_nvml_without_driver_degrades(monkeypatch):
    monkeypatch.setattr(nvml, "_state", {"initialised": False, "error": "NVML could not start"})
    ok, why = nvml.nvml_status()
    assert not ok and "NVML" in why
    assert nvml.list_gpus() == []
    assert nvml.gpu_memory(0) is None
    assert nvml.gpu_utilization(0) is None
    with pytest.raises(ValueError, match=r"index \(a GPU number\) must be at least 0"):
        nvml.gpu_memory(-1)


def test_module_keeps_no_torch_import_at_top():
    assert "torch" not in device.__dict__
