"""`make setup SITE=1` over this test environment's own Python, which is itself a venv.

The site environment must import torch from the parent venv (a plain
``--system-site-packages`` venv would not), helpers from this checkout, install only what the
parent lacks from a local wheelhouse with ``--no-index``, and run a notebook whose kernel has
no TensorFlow: the TensorFlow-optional code prints its reason instead of crashing.
"""

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from lean_env import hiding_sitecustomize

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "site_env.py"

# sitecustomize.py on the kernel's PYTHONPATH: `import tensorflow` (and keras, which needs it)
# then fails, and find_spec/importlib.metadata find nothing, as on a site without TensorFlow,
# although this test environment has it installed.
HIDE_TF = hiding_sitecustomize("tensorflow", "keras", "tf_keras", "tensorflow_cpu")

NOTEBOOK_CELLS = [
    "import sys\nimport torch\nimport helpers\nprint('kernel:', sys.executable)\n"
    "print('torch from:', torch.__file__)\nprint('helpers from:', helpers.__file__)",
    "print('setup, tensorflow:', helpers.setup(seed=0, tensorflow=True).settings['tensorflow'])",
    "report = helpers.device_report()\nprint([n for n in report.notes if 'TensorFlow' in n][0])",
    "try:\n    import tensorflow as tf\nexcept ImportError as error:\n    tf = None\n"
    "    print('TensorFlow cells skip:', error)",
    "from importlib import metadata, util\nprint('find_spec:', util.find_spec('tensorflow'), "
    "[d.name for d in metadata.distributions() if 'tensorflow' in d.name])",
    "x = torch.ones(3, device=helpers.pick_device())\nprint('torch works:', float(x.sum()))",
]


def fake_wheel(folder: Path, name: str = "gl_site_probe", version: str = "1.0") -> Path:
    """A tiny pure-Python wheel, so the offline install path runs without the network."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\n"
                            f"Version: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def run_setup(venv, requirements, wheelhouse):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "setup", "--python", sys.executable, "--venv", str(venv),
         "--requirements", str(requirements), "--wheelhouse", str(wheelhouse)],
        capture_output=True, text=True, timeout=300)


def build_site_env(tmp):
    """A site environment over this test run's own Python (a venv), from a tiny wheelhouse."""
    wheelhouse = tmp / "wheelhouse"
    wheelhouse.mkdir()
    fake_wheel(wheelhouse)
    requirements = tmp / "requirements-site.txt"
    requirements.write_text((ROOT / "requirements-site.txt").read_text()
                            + "gl-site-probe==1.0\n")
    venv = tmp / "venv-site"
    done = run_setup(venv, requirements, wheelhouse)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv, done.stdout, requirements, wheelhouse


def parent_file(module: str) -> str:
    """Where this test run's Python imports ``module`` from (without importing it)."""
    return importlib.util.find_spec(module).origin


def check_site_env(venv, out):
    """torch from the parent venv, helpers from the checkout, the missing package installed."""
    assert sys.prefix != sys.base_prefix, "the test needs to run from a virtual environment"
    assert "a virtual environment" in out
    assert "installing what the site lacks: gl-site-probe==1.0" in out
    assert "installed 1 packages into venv-site: gl-site-probe" in out
    code = ("import json, sys, torch, helpers, nbclient, gl_site_probe; print(json.dumps("
            "[sys.prefix, torch.__file__, helpers.__file__, nbclient.__file__, "
            "gl_site_probe.__file__]))")
    prefix, torch_file, helpers_file, nbclient_file, probe_file = json.loads(
        subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                       text=True, check=True).stdout)
    assert Path(prefix) == venv
    # the parent's own torch and nbclient: in its venv, or where that venv gets them from
    # (run from .venv-site, the GPU test mode on a cluster: the site's Python)
    assert torch_file == parent_file("torch"), "torch from the parent venv"
    assert nbclient_file == parent_file("nbclient")
    assert Path(helpers_file).parent == ROOT / "helpers"
    assert Path(probe_file).is_relative_to(venv), "the missing package went into the new env"
    torchrun = (venv / "bin" / "torchrun").read_text().splitlines()[0]
    assert torchrun == f"#!{venv}/bin/python", "torchrun must start workers in this env"


def run_notebook_without_tensorflow(venv, tmp):
    """Execute NOTEBOOK_CELLS in a kernel of ``venv`` that cannot import TensorFlow."""
    hide = tmp / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_TF)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS])
    path = tmp / "no_tf.ipynb"
    nbformat.write(nb, path)
    runner = ("import sys, nbformat\nfrom nbclient import NotebookClient\n"
              "nb = nbformat.read(sys.argv[1], as_version=4)\n"
              "NotebookClient(nb, timeout=120, kernel_name='python3').execute()\n"
              "nbformat.write(nb, sys.argv[1])")
    env = dict(os.environ, PYTHONPATH=str(hide), CUDA_VISIBLE_DEVICES="")
    subprocess.run([str(venv / "bin" / "python"), "-c", runner, str(path)], cwd=tmp,
                   env=env, check=True, timeout=300)
    return "".join(o.get("text", "") for cell in nbformat.read(path, as_version=4).cells
                   for o in cell.outputs)


@pytest.mark.slow
def test_site_env_over_this_venv_runs_a_notebook_without_tensorflow(tmp_path):
    # one test (not a module fixture): pytest-xdist would build the environment per worker
    venv, out, requirements, wheelhouse = build_site_env(tmp_path)
    check_site_env(venv, out)

    again = run_setup(venv, requirements, wheelhouse)
    assert again.returncode == 0 and "venv-site is up to date" in again.stdout, again.stdout

    text = run_notebook_without_tensorflow(venv, tmp_path)
    assert f"kernel: {venv}/bin/python" in text
    assert f"torch from: {parent_file('torch')}" in text
    assert f"helpers from: {ROOT}/helpers" in text
    assert "setup, tensorflow: not installed" in text
    assert "TensorFlow is not installed; lessons 02, 03 and 07 need it." in text
    assert "TensorFlow cells skip: No module named 'tensorflow'" in text
    assert "find_spec: None []" in text
    assert "torch works: 3.0" in text


def test_plain_system_site_packages_would_not_see_the_parent(tmp_path):
    """The reason for the .pth file: a venv made with --system-site-packages from a Python that
    is itself a venv sees the base interpreter's packages, not the parent venv's, so without
    the .pth torch is not found."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(tmp_path / "plain")], check=True)
    done = subprocess.run([str(tmp_path / "plain" / "bin" / "python"), "-c", "import torch"],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "No module named 'torch'" in done.stderr


def test_a_missing_package_without_a_wheel_is_named(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("gl-not-there==1.0\n")
    done = run_setup(tmp_path / "venv", requirements, tmp_path)
    assert done.returncode == 1
    assert "the site's Python lacks gl-not-there and" in done.stderr
    assert "make wheelhouse SITE=1" in done.stderr
