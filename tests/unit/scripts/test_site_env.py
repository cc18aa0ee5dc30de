"""scripts/site_env.py (`make setup SITE=1`): version range, requirements, .pth and commands.

The real environment over a Python that is itself a venv is built in tests/test_site_mode.py.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import site_env  # noqa: E402

SCRIPT = ROOT / "scripts" / "site_env.py"


@pytest.mark.parametrize("version, expected", [
    ("2.13.0", (2, 13, 0)), ("2.13.0+cpu", (2, 13, 0)), ("2.11.0a0+ecf3bae40a", (2, 11, 0)),
    ("2.21.0rc1", (2, 21, 0)), ("v2.16", (2, 16)),
])
def test_release_reads_the_release_number(version, expected):
    assert site_env.release(version) == expected


def test_release_names_the_argument():
    with pytest.raises(ValueError, match="version"):
        site_env.release("nightly")
    with pytest.raises(TypeError, match="version"):
        site_env.release(2.13)


@pytest.mark.parametrize("torch, tf", [
    ("2.11.0+cu130", None), ("2.11.0a0+nv26.01", "2.16.1"), ("2.13.0+cpu", "2.21.0"),
    ("2.13.1", None),
])
def test_supported_frameworks_pass(torch, tf):
    assert site_env.check_frameworks(torch, tf) == []


@pytest.mark.parametrize("torch, tf, message", [
    ("2.10.0", None, r"torch 2\.10\.0 is not supported: the kit needs torch >= 2\.11 and < 2\.14"),
    ("2.14.0", None, r"torch 2\.14\.0 is not supported"),
    ("3.0.0", None, r"torch 3\.0\.0 is not supported"),
    (None, None, r"torch is not installed in the site's Python"),
    ("2.13.0", "2.15.1", r"TensorFlow 2\.15\.1 is not supported: .*>= 2\.16 and < 2\.22, or none"),
    ("2.13.0", "2.22.0", r"TensorFlow 2\.22\.0 is not supported"),
])
def test_unsupported_frameworks_are_refused_with_the_reason(torch, tf, message):
    problems = site_env.check_frameworks(torch, tf)
    assert len(problems) == 1 and re.search(message, problems[0]), problems


def test_check_command_refuses_an_out_of_range_torch():
    done = subprocess.run([sys.executable, str(SCRIPT), "check", "--torch", "2.10.0",
                           "--tensorflow", "none"], capture_output=True, text=True)
    assert done.returncode == 1
    assert "site_env: torch 2.10.0 is not supported: the kit needs torch >= 2.11" in done.stderr
    ok = subprocess.run([sys.executable, str(SCRIPT), "check", "--torch", "2.11.0",
                         "--tensorflow", "none"], capture_output=True, text=True)
    assert ok.returncode == 0 and "supported: torch 2.11.0, TensorFlow absent" in ok.stdout


def test_check_command_reads_the_installed_versions():
    done = subprocess.run([sys.executable, str(SCRIPT), "check", "--python", sys.executable],
                          capture_output=True, text=True)
    from importlib import metadata

    assert done.returncode == 0, done.stderr
    assert f"supported: torch {metadata.version('torch')}" in done.stdout


def _pins(path):
    return {name: line.split("==", 1)[1] for name, line in site_env.read_requirements(path)
            if "==" in line and ";" not in line}


def test_site_requirements_leave_out_the_frameworks_and_match_requirements_txt():
    site = site_env.read_requirements(site_env.REQUIREMENTS)
    names = {name for name, _ in site}
    assert not names & site_env.NEVER_INSTALL
    assert {"nbclient", "ipykernel", "jupyter-client", "pyzmq", "nvidia-ml-py", "psutil",
            "pytest"} <= names
    full = _pins(ROOT / "requirements.txt")
    assert all("==" in line for _, line in site), "every line is pinned (the wheelhouse too)"
    from importlib import metadata

    for name, version in _pins(site_env.REQUIREMENTS).items():
        # the same pin as requirements.txt; otherwise the version this pip-check-clean
        # test environment holds
        assert version == full.get(name, metadata.version(name)), name


def test_pth_lines_keep_site_packages_and_drop_the_standard_library():
    probe = {"stdlib": ["/opt/py/lib/python3.12", "/opt/py/lib/python3.12/"],
             "sys_path": ["/opt/py/lib/python312.zip", "/opt/py/lib/python3.12",
                          "/opt/py/lib/python3.12/lib-dynload", "/site/venv/lib/site-packages",
                          "/site/venv/lib/site-packages/", "/opt/py/lib/site-packages",
                          "relative"]}
    assert site_env.pth_lines(probe) == ["/site/venv/lib/site-packages",
                                         "/opt/py/lib/site-packages"]


def test_wheelhouse_command_targets_the_chosen_python_and_platform(tmp_path):
    cmd, text = site_env.wheelhouse_command(
        "py", tmp_path, site_env.REQUIREMENTS, "3.12", ["manylinux_2_17_x86_64"],
        {"numpy", "matplotlib"})
    joined = " ".join(cmd)
    assert "--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312" in joined
    assert "--platform manylinux_2_17_x86_64 --platform any" in joined
    assert "numpy" not in text and "matplotlib" not in text and "nbclient==0.11.0" in text
    with pytest.raises(ValueError, match="pyver"):
        site_env.wheelhouse_command("py", tmp_path, site_env.REQUIREMENTS, "312", [], set())


def test_setup_refuses_the_full_environment(tmp_path):
    (tmp_path / ".installed-gpu0").touch()
    with pytest.raises(site_env.SiteError, match="the kit's full environment"):
        site_env.setup(sys.executable, tmp_path, site_env.REQUIREMENTS, None)


def test_help():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "setup" in done.stdout and "wheelhouse" in done.stdout


# ---------------------------------------------------------------- one CUDA stack per process
MIXED = (r"torch 2\.13\.0\+cu130 is built for CUDA 13\.0 and TensorFlow 2\.21\.0 for CUDA "
         r"12\.5\.1")


@pytest.mark.parametrize("torch_cuda, tensorflow_cuda", [
    ("13.0", None),  # TensorFlow's CPU build (or none)
    (None, "12.5.1"),  # torch's CPU build
    ("12.8", "12.5.1"),  # one CUDA major: one cuDNN, one NCCL
    ("13.0", "13.0"),
])
def test_one_cuda_major_passes(torch_cuda, tensorflow_cuda):
    assert site_env.check_frameworks("2.13.0+cu130", "2.21.0", torch_cuda=torch_cuda,
                                     tensorflow_cuda=tensorflow_cuda) == []


def test_torch_and_tensorflow_on_different_cuda_majors_are_refused():
    """Their cuDNN and NCCL wheels collide in one process (README "GPU machines")."""
    problems = site_env.check_frameworks("2.13.0+cu130", "2.21.0", torch_cuda="13.0",
                                         tensorflow_cuda="12.5.1")
    assert len(problems) == 1 and re.search(MIXED, problems[0]), problems
    assert "a site Python without TensorFlow" in problems[0]
    assert "make kernel-tf GPU=1" in problems[0]  # TensorFlow on the GPU: the kit's .venv-tf
    with pytest.raises(TypeError, match="^torch_cuda must be"):
        site_env.check_frameworks("2.13.0", None, torch_cuda=13.0)
    with pytest.raises(ValueError, match="^tensorflow_cuda: "):
        site_env.check_frameworks("2.13.0", "2.21.0", tensorflow_cuda="unknown")


def _fake_site(root: Path, tensorflow_cuda: str | None) -> Path:
    """torch 2.13.0+cu130 (CUDA 13.0) and TensorFlow 2.21.0 (built for ``tensorflow_cuda``)
    whose packages raise when imported: the probe must read their build files instead."""
    for name, version in (("torch", "2.13.0+cu130"), ("tensorflow", "2.21.0")):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} imported')\n")
        meta = root / f"{name}-{version.split('+')[0]}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n"
                                       f"Version: {version}\n")
    (root / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.13.0+cu130'\n"
        "cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n")
    platform = root / "tensorflow" / "python" / "platform"
    platform.mkdir(parents=True)
    items = [("is_cuda_build", tensorflow_cuda is not None)]
    if tensorflow_cuda:
        items += [("cuda_version", tensorflow_cuda), ("cudnn_version", "9")]
    (platform / "build_info.py").write_text(
        f"import collections\n\nbuild_info = collections.OrderedDict({items!r})\n")
    return root


def test_probe_reads_the_cuda_builds_without_importing_the_frameworks(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(_fake_site(tmp_path / "site", "12.5.1")))
    probe = site_env.probe_python(sys.executable)
    assert (probe["torch"], probe["tensorflow"]) == ("2.13.0+cu130", "2.21.0")
    assert (probe["torch_cuda"], probe["tensorflow_cuda"]) == ("13.0", "12.5.1")


@pytest.mark.parametrize("tensorflow_cuda", ["12.5.1", None])
def test_check_command_refuses_a_site_python_with_two_cuda_majors(tmp_path, tensorflow_cuda):
    site = _fake_site(tmp_path / "site", tensorflow_cuda)
    done = subprocess.run([sys.executable, str(SCRIPT), "check", "--python", sys.executable],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(site)})
    if tensorflow_cuda is None:  # TensorFlow's CPU build beside a CUDA torch: fine
        assert done.returncode == 0, done.stderr
        assert "supported: torch 2.13.0+cu130, TensorFlow 2.21.0" in done.stdout
    else:
        assert done.returncode == 1, done.stdout
        assert re.search("site_env: " + MIXED, done.stderr), done.stderr
