"""`make wheelhouse` and the offline installs that read it, checked with `make -n` (dry run):
nothing is downloaded or installed, the recipes are read as make would run them."""

import shlex
import subprocess
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def make_commands(*args: str) -> list[list[str]]:
    """The commands `make -n ARGS` would run, each split into words (continuations joined)."""
    done = subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout.replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in text.splitlines()]
    return [c for c in commands if c]  # comment lines (@#) split into nothing


def pip(commands: list[list[str]], verb: str, requirement: str) -> list[list[str]]:
    """The `pip VERB` commands that read the requirements file ``requirement`` (-r)."""
    return [c for c in commands if "pip" in c and verb in c
            and any(a == "-r" and b == requirement for a, b in pairwise(c))]


def option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_wheelhouse_gpu_downloads_the_tensorflow_environment_into_its_own_folder(tmp_path):
    """`make kernel-tf` installs requirements-gpu-tf.txt (TensorFlow with its CUDA 12 wheels,
    torch's +cpu build from torch's index): an offline node needs those wheels too, apart from
    the main environment's (torch's CUDA 13 build, tensorflow-cpu)."""
    venv = tmp_path / "venv"
    commands = make_commands("wheelhouse", "GPU=1", f"VENV={venv}")
    (main,) = pip(commands, "download", "requirements-gpu.txt")
    assert option(main, "-d") == "wheelhouse"
    assert "requirements-gpu-tf.txt" not in main
    tf = pip(commands, "download", "requirements-gpu-tf.txt")
    assert len(tf) == 1, ("make wheelhouse GPU=1 never downloads requirements-gpu-tf.txt:\n"
                          + "\n".join(shlex.join(c) for c in commands if "pip" in c))
    (tf,) = tf
    assert option(tf, "-d") == "wheelhouse-tf"
    # the file itself names torch's CPU index (--extra-index-url): pip reads it from there,
    # so nothing on the command line may replace it
    assert "--index-url" not in tf and "--no-index" not in tf
    # everything else of requirements.txt, and the build backend of `pip install -e .`
    assert pip([tf], "download", f"{venv}/requirements-nofw.txt")
    assert "setuptools" in tf and "wheel" in tf
    assert any("wheelhouse-tf/" in " ".join(c) for c in commands if c[0] == "echo")
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "wheelhouse-tf/" in ignored


def _installs(commands: list[list[str]]) -> list[list[str]]:
    return [c for c in commands if "pip" in c and "install" in c]


def test_kernel_tf_installs_offline_from_the_tensorflow_wheelhouse(tmp_path):
    venv_tf = tmp_path / "venv-tf"
    commands = make_commands("kernel-tf", "WHEELHOUSE=wheelhouse", f"VENV_TF={venv_tf}")
    installs = _installs(commands)
    assert pip(installs, "install", "requirements-gpu-tf.txt")
    assert any("-e" in c for c in installs)
    for command in installs:
        assert "--upgrade" not in command, command  # no pip upgrade from the internet
        assert "--no-index" in command and option(command, "--find-links") == (
            "wheelhouse-tf"), shlex.join(command)
    # WHEELHOUSE_TF names the folder itself, with or without WHEELHOUSE
    other = tmp_path / "tf-wheels"
    for args in ([f"WHEELHOUSE_TF={other}"],
                 ["WHEELHOUSE=wheelhouse", f"WHEELHOUSE_TF={other}"]):
        installs = _installs(make_commands("kernel-tf", *args, f"VENV_TF={venv_tf}"))
        assert installs and all(option(c, "--find-links") == str(other) for c in installs)
    # online: torch's CPU index from the file, PyPI for the rest
    installs = _installs(make_commands("kernel-tf", f"VENV_TF={venv_tf}"))
    assert installs and not any("--no-index" in c for c in installs)
