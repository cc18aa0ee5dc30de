"""requirements.txt and environment.yml must install the same versions."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def requirement_lines(text):
    return sorted(
        line.split("#")[0].strip()
        for line in text.splitlines()
        if line.split("#")[0].strip() and not line.startswith("-")
    )


def test_environment_yml_pins_match_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(p.strip() for p in pip_section) == requirement_lines(
        (ROOT / "requirements.txt").read_text()
    )
    assert "python=3.11" in env["dependencies"]


GPU_FILES = ("requirements-gpu.txt", "requirements-gpu-tf.txt")


def test_every_requirement_is_pinned_exactly():
    for name in ("requirements.txt", *GPU_FILES):
        for line in requirement_lines((ROOT / name).read_text()):
            assert "==" in line and "*" not in line, f"{name}: unpinned requirement: {line}"


def framework_pins(name):
    """{project (extras dropped): version} of a GPU requirements file."""
    lines = requirement_lines((ROOT / name).read_text())
    return {line.split("==")[0].split("[")[0]: line.split("==")[1] for line in lines}


def test_gpu_requirements_replace_only_the_frameworks():
    """Each GPU file holds torch and one TensorFlow, at the versions of requirements.txt."""
    cpu = {line.split("==")[0]: line.split("==")[1].split(";")[0].strip() for line in
           requirement_lines((ROOT / "requirements.txt").read_text())}
    main, tf = framework_pins("requirements-gpu.txt"), framework_pins("requirements-gpu-tf.txt")
    # main GPU environment: PyPI's torch (the CUDA 13 build), TensorFlow's CPU build
    assert main == {"torch": cpu["torch"], "tensorflow-cpu": cpu["tensorflow-cpu"]}
    # TensorFlow GPU environment: TF with its CUDA 12 wheels, torch's CPU build (+cpu)
    assert tf == {"torch": cpu["torch"] + "+cpu", "tensorflow": cpu["tensorflow-cpu"]}
    assert "tensorflow[and-cuda]==" + tf["tensorflow"] in requirement_lines(
        (ROOT / "requirements-gpu-tf.txt").read_text())


def test_cpu_torch_comes_from_torchs_cpu_index():
    """torch==X+cpu exists only on torch's CPU index; PyPI stays the main index."""
    options = [line.split() for line in (ROOT / "requirements-gpu-tf.txt").read_text()
               .splitlines() if line.startswith("-")]
    assert options == [["--extra-index-url", "https://download.pytorch.org/whl/cpu"]]
    for name in ("requirements.txt", "requirements-gpu.txt"):
        assert not any(line.startswith("-") for line in (ROOT / name).read_text().splitlines())


def test_learner_bundle_ships_every_requirements_file():
    """The README's GPU commands name requirements-gpu-tf.txt: the bundle must hold it."""
    from helpers.authoring import build

    for name in ("requirements.txt", *GPU_FILES):
        assert name in build.LEARNER_BUNDLE, name
