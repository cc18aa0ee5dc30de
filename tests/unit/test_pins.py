"""requirements.txt and environment.yml must install the same versions."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


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


def test_every_requirement_is_pinned_exactly():
    for line in requirement_lines((ROOT / "requirements.txt").read_text()):
        assert "==" in line, f"unpinned requirement: {line}"
    for line in requirement_lines((ROOT / "requirements-gpu.txt").read_text()):
        assert "==" in line, f"unpinned requirement: {line}"


def test_gpu_requirements_replace_only_the_frameworks():
    gpu = {line.split("==")[0].split("[")[0] for line in
           requirement_lines((ROOT / "requirements-gpu.txt").read_text())}
    assert gpu == {"torch", "tensorflow"}
    cpu = {line.split("==")[0]: line.split("==")[1].split(";")[0] for line in
           requirement_lines((ROOT / "requirements.txt").read_text())}
    for line in requirement_lines((ROOT / "requirements-gpu.txt").read_text()):
        name, version = line.split("==")
        assert version == cpu[name.split("[")[0]] or version == cpu.get("tensorflow-cpu")
