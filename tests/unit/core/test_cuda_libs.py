"""helpers.core.cuda_libs: loaded shared libraries from /proc/self/maps, and the cuDNN check."""

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

import pytest

from helpers.core import cuda_libs
from helpers.core.cuda_libs import CUDNN_SUBLIBRARIES, cudnn_findings, loaded_libraries

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux")
# the file set of nvidia-cudnn-cu13 9.20.0.48 (torch 2.13.0's), from its RECORD
CUDNN_9_20 = [s + ".so.9" for s in CUDNN_SUBLIBRARIES if s != "libcudnn_engines_tensor_ir"]


def maps_line(path, perms="r-xp"):
    return f"7f0000000000-7f0000001000 {perms} 00000000 08:01 1234        {path}"


@linux_only
def test_finds_torch_cpu_library_mapped_by_import_torch():
    import torch

    found = loaded_libraries(r"^libtorch_cpu\.so")
    expected = Path(torch.__file__).resolve().parent / "lib" / "libtorch_cpu.so"
    assert [os.path.realpath(p) for p in found.paths()] == [str(expected)]
    assert found.reason == "" and "libtorch_cpu.so" in str(found)


@linux_only
def test_finds_a_library_loaded_with_ctypes():
    name = ctypes.util.find_library("z")
    if name is None:
        pytest.skip("no libz on this machine")
    ctypes.CDLL(name)
    found = loaded_libraries(r"^libz\.so")
    assert len(found) >= 1 and all(Path(p).is_file() for p in found.paths())
    assert not loaded_libraries(r"^libcudnn").libraries  # a CPU build loads no cuDNN


def test_parses_a_maps_file():
    text = "\n".join([
        maps_line("/opt/sp/nvidia/cudnn/lib/libcudnn.so.9"),
        maps_line("/opt/sp/nvidia/cudnn/lib/libcudnn.so.9", perms="r--p"),  # same file twice
        maps_line("/opt/my libs/libcudnn_ops.so.9.20.0 (deleted)"),  # a space, deleted
        maps_line("/opt/sp/nvidia/cudnn/lib/libcudnn_cnn.so.9.py"),  # not a library
        maps_line("[heap]"),
        "7f0000000000-7f0000001000 rw-p 00000000 00:00 0",  # anonymous
        maps_line("/usr/lib/libc.so.6"),
    ])
    found = loaded_libraries("cudnn", maps_text=text)
    assert [(lib.name, lib.directory) for lib in found] == [
        ("libcudnn.so.9", "/opt/sp/nvidia/cudnn/lib"),
        ("libcudnn_ops.so.9.20.0", "/opt/my libs"),
    ]
    assert found.libraries[1].stem == "libcudnn_ops"


def test_elsewhere_than_linux_the_answer_is_empty_with_a_reason(monkeypatch):
    monkeypatch.setattr(cuda_libs.sys, "platform", "darwin")
    found = loaded_libraries()
    assert found.libraries == () and "Linux only" in found.reason
    report = cudnn_findings(found, None)
    assert not report.checked and not report.ok and "Linux only" in str(report)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"pattern": 3}, TypeError, "pattern"),
        ({"pattern": ""}, ValueError, "pattern"),
        ({"pattern": "lib("}, ValueError, "pattern"),
        ({"maps_text": b"x"}, TypeError, "maps_text"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=name):
        loaded_libraries(**kwargs)


def test_bad_findings_arguments_name_the_argument():
    with pytest.raises(TypeError, match="loaded"):
        cudnn_findings(["/x/libcudnn.so.9"], None)
    with pytest.raises(TypeError, match="torch_cudnn_dir"):
        cudnn_findings(loaded_libraries(maps_text=""), 3)


def cudnn_folder(tmp_path, names):
    folder = tmp_path / "site-packages" / "nvidia" / "cudnn" / "lib"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_a_complete_cudnn_loaded_from_torchs_folder_has_no_problem(tmp_path):
    folder = cudnn_folder(tmp_path, [s + ".so.9" for s in CUDNN_SUBLIBRARIES])
    text = "\n".join(maps_line(folder / n) for n in ("libcudnn.so.9", "libcudnn_cnn.so.9"))
    report = cudnn_findings(loaded_libraries("^libcudnn", maps_text=text), folder)
    assert report.ok and report.problems == ()
    assert dict((s, (p, loaded)) for s, p, loaded in report.rows)["libcudnn_cnn"] == (
        True, (str(folder / "libcudnn_cnn.so.9"),))
    assert "no problems" in str(report)


def test_the_missing_sub_library_and_the_foreign_copy_are_flagged(tmp_path):
    """9.20.0.48 lacks tensor_ir; the loader then maps TF's CUDA 12 copy from elsewhere."""
    folder = cudnn_folder(tmp_path, CUDNN_9_20)
    foreign = tmp_path / "other" / "nvidia" / "cudnn" / "lib"
    text = "\n".join([
        maps_line(folder / "libcudnn.so.9"),
        maps_line(foreign / "libcudnn_engines_tensor_ir.so.9"),
        maps_line(foreign / "libcudnn_ops.so.9"),
        maps_line(folder / "libcudnn_ops.so.9"),
    ])
    report = cudnn_findings(loaded_libraries("^libcudnn", maps_text=text), folder)
    assert not report.ok
    assert report.problems == (
        f"libcudnn_engines_tensor_ir is missing from {folder}; loaded from "
        f"{foreign / 'libcudnn_engines_tensor_ir.so.9'}",
        f"libcudnn_engines_tensor_ir loaded from {foreign}, not from torch's {folder}",
        f"libcudnn_ops loaded from {foreign}, not from torch's {folder}",
        f"libcudnn_ops loaded twice: {foreign / 'libcudnn_ops.so.9'}, "
        f"{folder / 'libcudnn_ops.so.9'}",
    )
    assert "PROBLEM: libcudnn_engines_tensor_ir is missing" in str(report)


def test_a_symlinked_folder_is_torchs_own(tmp_path):
    folder = cudnn_folder(tmp_path, [s + ".so.9" for s in CUDNN_SUBLIBRARIES])
    link = tmp_path / "link"
    link.symlink_to(folder)
    report = cudnn_findings(loaded_libraries(maps_text=maps_line(link / "libcudnn.so.9")),
                            folder)
    assert report.ok


def test_without_torchs_cudnn_folder_only_double_loads_count(tmp_path):
    text = maps_line("/usr/lib/x86_64-linux-gnu/libcudnn.so.9")
    report = cudnn_findings(loaded_libraries(maps_text=text), tmp_path / "absent")
    assert report.ok and report.torch_cudnn_dir == ""


def test_cudnn_report_without_cuda_loads_nothing():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test covers the CPU path")
    report = cuda_libs.cudnn_report()
    assert not report.checked and "torch.cuda.is_available() is False" in str(report)
    assert not loaded_libraries("^libcudnn").libraries
