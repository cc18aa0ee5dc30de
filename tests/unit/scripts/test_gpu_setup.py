"""scripts/gpu_setup.py: the GPU branch of `make setup GPU=1` replaces CPU builds.

An existing CPU .venv holds torch 2.13.0+cpu, which satisfies ``torch==2.13.0``; the branch
must remove it (and tensorflow-cpu when the GPU set installs another TensorFlow), exclude the
+cpu wheel with a constraint, and verify ``torch.version.cuda`` afterwards.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_setup  # noqa: E402

CUDA_REQUIRES = ["nvidia-cudnn-cu13==9.20.0.48; platform_system == 'Linux'",
                 "cuda-toolkit[cublas]==13.0.3; platform_system == 'Linux'", "filelock"]


@pytest.mark.parametrize("version, requires, cpu", [
    ("2.13.0+cpu", [], True),
    ("2.13.0", ["filelock", "sympy"], True),  # macOS / a CPU wheel without a local label
    ("2.13.0", CUDA_REQUIRES, False),  # PyPI's Linux wheel
    ("2.13.0+cu130", [], False),
    ("2.11.0a0+nv26.01", ["filelock"], True),  # nothing says CUDA: reinstall is the safe side
])
def test_is_cpu_build(version, requires, cpu):
    assert gpu_setup.is_cpu_build(version, requires) is cpu


def test_is_cpu_build_names_the_argument():
    with pytest.raises(TypeError, match="version"):
        gpu_setup.is_cpu_build(None, [])


def test_a_cpu_venv_loses_its_cpu_torch_and_tensorflow_cpu():
    installed = {"torch": ("2.13.0+cpu", []), "tensorflow-cpu": ("2.21.0", [])}
    wanted = ["torch==2.13.0", "tensorflow[and-cuda]==2.21.0"]
    assert gpu_setup.to_uninstall(installed, wanted) == ["torch", "tensorflow-cpu"]


def test_a_gpu_venv_keeps_everything():
    installed = {"torch": ("2.13.0", CUDA_REQUIRES), "tensorflow": ("2.21.0", [])}
    assert gpu_setup.to_uninstall(installed, ["torch==2.13.0",
                                              "tensorflow[and-cuda]==2.21.0"]) == []


def test_a_gpu_set_with_tensorflow_cpu_keeps_it():
    installed = {"torch": ("2.13.0+cpu", []), "tensorflow-cpu": ("2.21.0", [])}
    assert gpu_setup.to_uninstall(installed, ["torch==2.13.0",
                                              "tensorflow-cpu==2.21.0"]) == ["torch"]


def test_constraints_exclude_the_cpu_wheel_of_each_torch_pin():
    assert gpu_setup.constraints(["torch==2.13.0", "keras==3.15.1",
                                  "torch == 2.11.0 ; sys_platform == 'linux'"]) == [
        "torch!=2.13.0+cpu", "torch!=2.11.0+cpu; sys_platform == 'linux'"]


def test_prepare_dry_run_names_this_cpu_torch_and_writes_the_constraints(tmp_path):
    # --dry-run: without it, prepare would uninstall this test environment's CPU torch
    import torch

    out = tmp_path / "c.txt"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_setup.py"), "prepare",
                           "--dry-run", "--constraints", str(out),
                           str(ROOT / "requirements-gpu.txt")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if not torch.version.cuda:
        assert f"would remove torch {torch.__version__}: a CPU-only build" in done.stdout
    lines = gpu_setup.requirement_lines([ROOT / "requirements-gpu.txt"])
    pins = [line for line in lines if line.replace(" ", "").startswith("torch==")]
    assert pins, "requirements-gpu.txt pins torch"
    expected = "torch!=" + pins[0].split("==")[1].split(";")[0].strip() + "+cpu"
    assert gpu_setup.constraints(lines) == [expected]
    assert out.read_text().split() == [expected]


def test_verify_refuses_this_cpu_torch_with_the_reason():
    import torch

    if torch.version.cuda:
        pytest.skip("this torch is a CUDA build")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_setup.py"), "verify"],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert f"torch {torch.__version__} in {sys.prefix} is a CPU-only build" in done.stderr


def test_make_setup_gpu_removes_the_cpu_build_excludes_it_and_verifies(tmp_path):
    done = subprocess.run(["make", "-n", "--no-print-directory", "setup", "GPU=1",
                           f"VENV={tmp_path}/venv"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    steps = done.stdout
    prepare = steps.index("scripts/gpu_setup.py prepare requirements-gpu.txt")
    install = steps.index(f"-c {tmp_path}/venv/constraints-gpu.txt")
    verify = steps.index("scripts/gpu_setup.py verify")
    assert prepare < install < verify < steps.index(".installed-gpu1")
