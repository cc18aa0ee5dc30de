"""Lessons without TensorFlow: cells tagged ``tensorflow`` are skipped with a printed reason."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from lean_env import fake_kernelspec

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS = sorted((ROOT / "solutions").glob("[0-9]*.ipynb")) + sorted(
    (ROOT / "lessons").glob("[0-9]*.ipynb"))


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


tf_cells = _load(ROOT / "scripts" / "tf_cells.py", "tf_cells_under_test")


def _notebook() -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# tagged markdown", metadata={"tags": ["tensorflow"]}),
        nbformat.v4.new_code_cell("import torch", metadata={"tags": ["nbval-skip"]}),
        nbformat.v4.new_code_cell("import tensorflow as tf\nprint(tf.__version__)",
                                  metadata={"tags": ["solution", "tensorflow"],
                                            "exercise": {"id": "00-x"}},
                                  execution_count=3,
                                  outputs=[nbformat.v4.new_output("stream", text="2.21\n")]),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("model = tf.keras.Sequential()",
                                  metadata={"tags": ["tensorflow"]}),
    ])


# ---------------------------------------------------------------- skip_tensorflow_cells
def test_skip_replaces_exactly_the_tagged_code_cells_and_keeps_id_and_metadata():
    nb = _notebook()
    before = [(c.id, dict(c.metadata)) for c in nb.cells]
    untouched = [nb.cells[i].source for i in (0, 1, 3)]
    assert tf_cells.skip_tensorflow_cells(nb, reason="TensorFlow is hidden") == [2, 4]
    assert [(c.id, dict(c.metadata)) for c in nb.cells] == before
    assert [nb.cells[i].source for i in (0, 1, 3)] == untouched
    for i in (2, 4):
        cell = nb.cells[i]
        assert cell.source.count("\n") == 0
        assert cell.outputs == [] and cell.execution_count is None
    nbformat.validate(nb)


def test_a_skipped_cell_prints_the_reason(capsys):
    nb = _notebook()
    tf_cells.skip_tensorflow_cells(nb, reason='no "TF" on this node')
    exec(compile(nb.cells[2].source, "cell", "exec"), {})
    assert capsys.readouterr().out == (
        'skipped: no "TF" on this node (this cell needs TensorFlow)\n')


def test_default_reason_and_a_notebook_without_tagged_cells():
    nb = _notebook()
    for cell in nb.cells:
        cell.metadata.pop("tags", None)
    assert tf_cells.skip_tensorflow_cells(nb) == []
    nb = _notebook()
    tf_cells.skip_tensorflow_cells(nb)
    assert "skipped: TensorFlow is not installed (this cell needs" in nb.cells[4].source


@pytest.mark.parametrize("bad", [None, "notebook.ipynb", ["cell"], {"cells": "x"}])
def test_not_a_notebook_is_a_type_error_naming_the_argument(bad):
    with pytest.raises(TypeError, match="^nb must be a notebook"):
        tf_cells.skip_tensorflow_cells(bad)
    with pytest.raises(TypeError, match="^nb must be a notebook"):
        tf_cells.tensorflow_cells(bad)


@pytest.mark.parametrize("bad", ["", "  ", "two\nlines", 3])
def test_a_bad_reason_is_a_value_error_naming_the_argument(bad):
    nb = _notebook()
    with pytest.raises(ValueError, match="^reason must be"):
        tf_cells.skip_tensorflow_cells(nb, reason=bad)
    assert "import tensorflow" in nb.cells[2].source  # nothing replaced


def test_a_plain_json_notebook_dict_works():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import keras", metadata={"tags": ["tensorflow"]})])
    as_dict = nbformat.reads(nbformat.writes(nb), as_version=4)
    assert tf_cells.skip_tensorflow_cells(dict(as_dict)) == [0]


# ---------------------------------------------------------------- tensorflow_available
def test_tensorflow_available_follows_find_spec(monkeypatch):
    import importlib.util as util

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec",
                        lambda name, *a: None if name == "tensorflow" else real(name, *a))
    assert tf_cells.tensorflow_available() == (False, "TensorFlow is not installed (or hidden)")
    monkeypatch.setattr(util, "find_spec", lambda name, *a: object())
    assert tf_cells.tensorflow_available() == (True, "TensorFlow is installed")


def _hidden_env(tmp_path: Path) -> dict:
    """A kernel environment with TensorFlow hidden, the way gpu_check --hide-tensorflow does."""
    gpu_check = _load(ROOT / "scripts" / "gpu_check.py", "gpu_check_for_tf_cells")
    from helpers.authoring.build import KERNEL_ENV

    (tmp_path / "sitecustomize.py").write_text(gpu_check.HIDE_TF)
    return {**os.environ, **KERNEL_ENV,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}


def test_tensorflow_available_in_a_child_environment(tmp_path):
    hidden = _hidden_env(tmp_path)
    assert tf_cells.tensorflow_available(hidden)[0] is False
    shown = {**hidden, "PYTHONPATH": str(ROOT)}
    assert tf_cells.tensorflow_available(shown) == (
        importlib.util.find_spec("tensorflow") is not None,
        "TensorFlow is installed" if importlib.util.find_spec("tensorflow")
        else "TensorFlow is not installed (or hidden)")
    with pytest.raises(TypeError, match="^env must be a dict"):
        tf_cells.tensorflow_available(["PATH=/bin"])


def _kernel_python(tmp_path: Path, name: str, hide: bool) -> Path:
    """An interpreter for a kernel: this Python behind a shell script that hides TensorFlow
    (``hide``) or drops whatever PYTHONPATH hid it (the kit's checkout only)."""
    folder = tmp_path / name
    folder.mkdir()
    if hide:
        (folder / "sitecustomize.py").write_text(
            _load(ROOT / "scripts" / "gpu_check.py", "gpu_check_for_tf_cells").HIDE_TF)
        path = f'{folder}{os.pathsep}{ROOT}${{PYTHONPATH:+{os.pathsep}$PYTHONPATH}}'
    else:
        path = str(ROOT)
    script = folder / "python"
    script.write_text(f'#!/bin/sh\nexport PYTHONPATH="{path}"\nexec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return script


def test_tensorflow_available_asks_the_interpreter_it_is_given(tmp_path):
    """The kernel's interpreter decides, not the runner's (notebooks-tf: the TensorFlow GPU
    kernel runs .venv-tf's Python while gpu_check runs in .venv or .venv-site)."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("needs TensorFlow in this environment (requirements.txt has it)")
    (tmp_path / "runner").mkdir()
    hidden = _hidden_env(tmp_path / "runner")  # the runner's view: no TensorFlow
    shown = {**os.environ, "PYTHONPATH": str(ROOT)}
    with_tf = _kernel_python(tmp_path, "with-tf", hide=False)
    without_tf = _kernel_python(tmp_path, "without-tf", hide=True)
    assert tf_cells.tensorflow_available(hidden, python=str(with_tf)) == (
        True, "TensorFlow is installed")
    assert tf_cells.tensorflow_available(shown, python=without_tf)[0] is False
    assert tf_cells.tensorflow_available(python=str(without_tf))[0] is False  # os.environ
    missing = tf_cells.tensorflow_available(shown, python=str(tmp_path / "no-such-python"))
    assert missing[0] is False and "no-such-python" in missing[1]
    with pytest.raises(TypeError, match="^python must be"):
        tf_cells.tensorflow_available(shown, python=3)
    with pytest.raises(ValueError, match="^python must be"):
        tf_cells.tensorflow_available(shown, python="")


def test_kernel_python_is_the_interpreter_jupyter_starts(tmp_path, monkeypatch):
    python = _kernel_python(tmp_path, "with-tf", hide=False)
    fake_kernelspec(tmp_path / "jupyter", "fake-tf", python)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    assert tf_cells.kernel_python("fake-tf") == str(python)
    # the default kernel's argv[0] is "python": jupyter_client starts sys.executable then
    assert tf_cells.kernel_python("python3") == sys.executable
    with pytest.raises(TypeError, match="^name must be"):
        tf_cells.kernel_python(None)
    with pytest.raises(ValueError, match="^name must be"):
        tf_cells.kernel_python("")


# ---------------------------------------------------------------- the convention, statically
TF_MODULES = ("tensorflow", "keras", "tf_keras")
MAGIC = re.compile(r"^\s*[%!]")


def _tf_imports(source: str) -> list[str]:
    if source.startswith("%%"):  # a cell magic (%%writefile job.py): the kernel imports nothing
        return []
    text = "\n".join("" if MAGIC.match(line) else line for line in source.splitlines())
    try:
        tree = ast.parse(text)
    except SyntaxError:  # an exercise stub may not parse: fall back to a line regex
        return re.findall(r"^\s*(?:from|import)\s+((?:tensorflow|keras|tf_keras)\b\S*)",
                          text, flags=re.M)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return [n for n in names if n.split(".")[0] in TF_MODULES]


def test_the_import_finder_sees_every_form():
    assert _tf_imports("import tensorflow as tf") == ["tensorflow"]
    assert _tf_imports("x = 1\nif x:\n    from keras import mixed_precision") == ["keras"]
    assert _tf_imports("%time import tensorflow\nimport torch") == []  # magic lines dropped
    assert _tf_imports("def f(:\nimport keras.layers") == ["keras.layers"]
    assert _tf_imports("import torch, numpy\nfrom helpers import keras_tools") == []
    assert _tf_imports("%%writefile job.py\nimport tensorflow as tf") == []  # a file, not run


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_tensorflow_import_sits_in_a_cell_tagged_tensorflow(path):
    nb = nbformat.read(path, as_version=4)
    tagged = set(tf_cells.tensorflow_cells(nb))
    untagged = [(i, _tf_imports(c.source)) for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and i not in tagged and _tf_imports(c.source)]
    assert untagged == [], (
        f"{path.name}: cells importing TensorFlow/Keras without the cell tag 'tensorflow' "
        f"(CONTRIBUTING.md, 'A lesson notebook'): {untagged}")


def test_the_lessons_that_use_tensorflow_have_tagged_cells():
    """Guards the test above against a tag that was renamed or dropped everywhere."""
    counts = {p.name: len(tf_cells.tensorflow_cells(nbformat.read(p, as_version=4)))
              for p in NOTEBOOKS if p.parent.name == "solutions"}
    assert counts["00_setup.ipynb"] >= 1 and counts["02_tensorflow_gpu.ipynb"] >= 10
    assert counts["01_pytorch_gpu.ipynb"] == 0


# ---------------------------------------------------------------- end to end
def test_lesson_00_runs_with_tensorflow_hidden_and_its_cells_skipped(tmp_path):
    """A GPU node without TensorFlow, rehearsed with a real lesson."""
    from nbclient import NotebookClient

    from helpers.authoring.build import KERNEL_ARGS

    path = ROOT / "solutions" / "00_setup.ipynb"
    nb = nbformat.read(path, as_version=4)
    env = _hidden_env(tmp_path)
    available, reason = tf_cells.tensorflow_available(env)
    assert not available
    skipped = tf_cells.skip_tensorflow_cells(nb, reason=reason)
    assert skipped  # lesson 00 mixes torch and TensorFlow
    nb.cells.append(nbformat.v4.new_code_cell(
        "import sys, importlib.util\n"
        "print('tensorflow imported:', 'tensorflow' in sys.modules,"
        " '| found:', importlib.util.find_spec('tensorflow') is not None,"
        " '| torch imported:', 'torch' in sys.modules)"))
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}},
                            extra_arguments=KERNEL_ARGS, record_timing=False,
                            store_widget_state=False)
    client.execute(env=env)  # raises CellExecutionError if any untagged cell needs TensorFlow

    def text(cell):
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")

    for i in skipped:
        assert text(nb.cells[i]) == (
            f"skipped: {reason} (this cell needs TensorFlow)\n"), i
    assert text(nb.cells[-1]) == (
        "tensorflow imported: False | found: False | torch imported: True\n")
    ran = [c for i, c in enumerate(nb.cells) if c.cell_type == "code" and i not in skipped]
    assert len(ran) >= 5 and all(c.execution_count for c in ran)
