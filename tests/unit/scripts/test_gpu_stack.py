"""One CUDA stack per GPU environment, checked offline on the committed descriptions.

tests/data/gpu_stack.json (the current requirements-gpu*.txt) and gpu_stack_legacy.json
(the pre-split requirements-gpu.txt: torch 2.13.0 + tensorflow[and-cuda] 2.21.0 in one
environment) were written by scripts/gpu_stack.py from PyPI metadata and the wheels' RECORD
files. Regenerate after changing a GPU requirements file (see the script's docstring).
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
ENVIRONMENT_FILES = {"main": "requirements-gpu.txt", "tf": "requirements-gpu-tf.txt"}


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_stack", ROOT / "scripts" / "gpu_stack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_stack = load_script()


def environments(name):
    return json.loads((DATA / name).read_text())["environments"]


def normalized(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def by_name(environment):
    return {normalized(dist["name"]): dist for dist in environment["distributions"]}


def test_legacy_requirements_install_two_cudnn_and_two_nccl_builds():
    """The check fails on the old requirements-gpu.txt: cuDNN and NCCL written twice."""
    (env,) = environments("gpu_stack_legacy.json").values()
    assert env["requirements"] == ["tensorflow[and-cuda]==2.21.0", "torch==2.13.0"]
    collisions = gpu_stack.library_collisions(env["distributions"])
    assert sorted(collisions) == ["nvidia/cudnn/lib", "nvidia/nccl/lib"]
    assert collisions["nvidia/nccl/lib"] == {"libnccl": ["nvidia-nccl-cu12", "nvidia-nccl-cu13"]}
    assert collisions["nvidia/cudnn/lib"]["libcudnn_cnn"] == [
        "nvidia-cudnn-cu12", "nvidia-cudnn-cu13"]


@pytest.mark.parametrize("name", sorted(ENVIRONMENT_FILES))
def test_each_gpu_environment_has_one_cuda_stack(name):
    env = environments("gpu_stack.json")[name]
    assert gpu_stack.library_collisions(env["distributions"]) == {}
    dists = by_name(env)
    cudnn = sorted(n for n in dists if n.startswith("nvidia-cudnn"))
    nccl = sorted(n for n in dists if n.startswith("nvidia-nccl"))
    majors = {n.rsplit("-", 1)[-1] for n in dists if n.startswith("nvidia-") and "-cu1" in n}
    if name == "main":  # PyPI's torch: CUDA 13; TensorFlow: the CPU build
        assert (cudnn, nccl, majors) == (["nvidia-cudnn-cu13"], ["nvidia-nccl-cu13"], {"cu13"})
        assert dists["torch"]["version"] == "2.13.0"  # the CUDA build, not 2.13.0+cpu
        assert "tensorflow" not in dists and "tensorflow-cpu" in dists
        # several CUDA 13 component wheels share nvidia/cu13/lib, each with its own files
        assert gpu_stack.shared_library_dirs(env["distributions"]).keys() == {"nvidia/cu13/lib"}
    else:  # TensorFlow's CUDA 12 wheels; torch the CPU build
        assert (cudnn, nccl, majors) == (["nvidia-cudnn-cu12"], ["nvidia-nccl-cu12"], {"cu12"})
        assert dists["torch"]["version"] == "2.13.0+cpu"
        assert gpu_stack.shared_library_dirs(env["distributions"]) == {}
    (cudnn_dist,) = (dists[n] for n in cudnn)
    assert cudnn_dist["library_dirs"] == ["nvidia/cudnn/lib"]


def test_description_matches_the_requirements_files():
    """Changing a GPU requirements file without regenerating the description fails here."""
    described = environments("gpu_stack.json")
    assert set(described) == set(ENVIRONMENT_FILES)
    for name, filename in ENVIRONMENT_FILES.items():
        pins = gpu_stack.requirement_lines(ROOT / filename)
        assert described[name]["requirements"] == pins, f"regenerate for {filename}"
        dists = by_name(described[name])
        for pin in pins:
            project, version = pin.split("==")
            assert dists[normalized(project.split("[")[0])]["version"] == version, pin


def test_collision_check_flags_same_library_not_shared_toolkit_folder():
    def dist(name, *libraries):
        libs, dirs = gpu_stack.library_layout(list(libraries) + [f"{name}.dist-info/RECORD"])
        return {"name": name, "libraries": libs, "library_dirs": dirs}

    toolkit = [dist("cublas", "nvidia/cu13/lib/libcublas.so.13"),
               dist("cufft", "nvidia/cu13/lib/libcufft.so.12")]
    assert gpu_stack.library_collisions(toolkit) == {}
    assert gpu_stack.shared_library_dirs(toolkit) == {"nvidia/cu13/lib": ["cublas", "cufft"]}
    two_builds = [dist("a", "x/lib/libfoo.so.2"), dist("b", "x/lib/libfoo.so.2.30.1")]
    assert gpu_stack.library_collisions(two_builds) == {"x/lib": {"libfoo": ["a", "b"]}}


def test_record_is_read_through_ranges_only(tmp_path):
    """The zip reader finds RECORD from the central directory, also for zip64 entries."""
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("demo/lib/libdemo.so.1", os.urandom(400_000),
                         compress_type=zipfile.ZIP_STORED)
        with archive.open("demo-1.0.dist-info/RECORD", "w", force_zip64=True) as handle:
            handle.write(b"demo/lib/libdemo.so.1,sha256=x,70000\n"
                         b"demo-1.0.data/platlib/demo/_ext.so,,\n"
                         b"demo-1.0.dist-info/RECORD,,\n")
    reads = []
    read, size = gpu_stack.http_range_reader(wheel.as_uri())

    def counting(start, length):
        reads.append(length)
        return read(start, length)

    entries = gpu_stack.central_directory(counting, size)
    record = gpu_stack.read_member(counting, entries["demo-1.0.dist-info/RECORD"])
    assert record.startswith(b"demo/lib/libdemo.so.1,")
    assert gpu_stack.wheel_record(wheel.as_uri()) == [
        "demo/lib/libdemo.so.1", "demo/_ext.so", "demo-1.0.dist-info/RECORD"]
    # the tail (at most 64 KiB + 22 bytes), one local header and RECORD: not the wheel
    assert len(reads) == 3 and sum(reads) < wheel.stat().st_size // 4


def test_unreachable_index_fails_with_a_clear_message(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_stack.py"), "--index-url",
         "http://127.0.0.1:9/simple", "--output", str(tmp_path / "out.json")],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "cannot reach the package index http://127.0.0.1:9/simple" in done.stderr
    assert not (tmp_path / "out.json").exists()
