"""recorded_gpu_results: recorded GPU results, shown on machines without a GPU."""

import json

import pytest

import helpers
from helpers.core import recorded


# ---------------------------------------------------------------- recorded GPU results
def test_no_recorded_results_means_none(tmp_path):
    assert helpers.recorded_gpu_results("memory", directory=tmp_path) is None


def test_recorded_results_load_with_a_label(tmp_path):
    data = {"kind": recorded.KIND, "script": "tests/gpu/test_memory_gpu.py",
            "date": "2026-12-01", "hardware": {"gpu": "NVIDIA H100 80GB HBM3",
                                               "driver": "550.54", "torch": "2.13.0"},
            "figures": {"peak": 1}}
    (tmp_path / "memory.json").write_text(json.dumps(data))
    rec = helpers.recorded_gpu_results("memory", directory=tmp_path)
    assert rec["figures"] == {"peak": 1} and rec.hardware["gpu"].startswith("NVIDIA")
    assert rec.label.startswith("Recorded GPU results: NVIDIA H100 80GB HBM3 (driver 550.54")
    assert "not measured on this machine" in repr(rec)


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"), ('{"kind": "other"}', "not a recorded"), ("[]", "not a")])
def test_recorded_results_refuse_other_files(tmp_path, content, match):
    (tmp_path / "memory.json").write_text(content)
    with pytest.raises(ValueError, match=match):
        helpers.recorded_gpu_results("memory", directory=tmp_path)


@pytest.mark.parametrize("name, error, match", [
    ("", ValueError, "name must not be empty"), ("../x", ValueError, "file stem"),
    ("Memory", ValueError, "file stem"), (3, TypeError, "name must be a string"),
    (None, TypeError, "name must be a string")])
def test_recorded_results_names(name, error, match):
    with pytest.raises(error, match=match):
        helpers.recorded_gpu_results(name)
