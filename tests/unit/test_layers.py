"""The layer rules of helpers/ (CONTRIBUTING "Layers"), read from the source with ``ast``.

Nothing here imports helpers: every import statement of helpers/**/*.py, module-level or
inside a function, is resolved (relative imports too) and checked against the table of
allowed edges between folders:

    core      -> nothing in helpers
    memory    -> core
    tf        -> core, memory
    watch     -> core, memory.sources (only that module of memory)
    authoring -> core
    topics    -> anything (the flat modules helpers/<topic>.py)
    facade    -> anything (helpers/__init__.py)

and: no module imports the facade package ``helpers`` itself (only ``__version__``); no
torch-private names outside helpers/memory/; no TensorFlow/Keras import outside helpers/tf/;
the notebooks reach helpers only through the facade's public names; helpers.authoring runs
without torch. A failure lists every violation as ``file:line  edge``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "helpers"

LAYERS = ("core", "memory", "tf", "watch", "authoring")
TOPICS = ("amp", "batch_size", "checkpoint", "fit", "launch", "models", "oom", "throughput")
EVERYTHING = frozenset((*LAYERS, "topics"))
# importer layer -> the layers it may import (its own always included)
ALLOWED = {
    "core": frozenset({"core"}),
    "memory": frozenset({"core", "memory"}),
    "tf": frozenset({"core", "memory", "tf"}),
    "watch": frozenset({"core", "watch", "memory.sources"}),
    "authoring": frozenset({"core", "authoring"}),
    "topics": EVERYTHING,
    "facade": EVERYTHING,
}
# what may be imported from the facade itself (``from .. import __version__``)
FACADE_IMPORTABLE = {"__version__"}

TENSORFLOW = ("tensorflow", "keras", "tf_keras")
# torch-private names that need not be spelled torch.<...>._x: imported names, or attributes
# of torch objects a function is handed (an operator's func._overloadpacket)
TORCH_PRIVATE_NAMES = {"_disable_current_modes", "_subclasses", "_guards", "_python_dispatch",
                       "_dynamo", "_inductor", "_C", "_overloadpacket", "_schema",
                       "_current_graph_task_id", "_current_autograd_node",
                       "_BaseDataLoaderIter"}


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}  {self.text}"


def report(violations: list[Violation], rule: str) -> str:
    lines = sorted({str(v) for v in violations})
    return f"{len(lines)} violation(s) of: {rule}\n  " + "\n  ".join(lines)


# ---------------------------------------------------------------- reading helpers/

def helper_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    """``helpers.x.y`` names a module or package file of the repository."""
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def layer_of_file(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    if parts == ("__init__.py",):
        return "facade"
    if len(parts) == 1:
        return "topics" if path.stem in TOPICS else f"unknown topic {path.stem!r}"
    return parts[0] if parts[0] in LAYERS else f"unknown folder {parts[0]!r}"


def layer_of_module(name: str) -> str:
    """The layer of an imported module ``helpers.<...>`` ('facade' for ``helpers`` itself)."""
    parts = name.split(".")
    if len(parts) == 1:
        return "facade"
    if parts[1] in LAYERS:
        if parts[1] == "memory" and parts[2:3] == ["sources"]:
            return "memory.sources"
        return parts[1]
    return "topics"


def layer_allows(importer: str, target: str) -> bool:
    allowed = ALLOWED.get(importer, frozenset())
    if target == "memory.sources":
        return bool(allowed & {"memory", "memory.sources"})
    return target in allowed


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # absolute module name, e.g. helpers.core.fmt or torch.utils._pytree
    name: str | None  # the name taken from it (``from module import name``), else None
    text: str  # the statement as written


def resolve(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path) -> list[Import]:
    found = []
    for node in ast.walk(parsed(path)):
        text = ast.get_source_segment(source_of(path), node) if isinstance(
            node, ast.Import | ast.ImportFrom) else None
        if isinstance(node, ast.Import):
            found += [Import(node.lineno, a.name, None, text) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = resolve(path, node)
            found += [Import(node.lineno, module, a.name, text) for a in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) in ("__import__", "import_module"))
              and not node.args[0].value.startswith(".")):
            found.append(Import(node.lineno, node.args[0].value, None,
                                f"import_module({node.args[0].value!r})"))
    return found


_SOURCES: dict[Path, str] = {}
_TREES: dict[Path, ast.AST] = {}


def source_of(path: Path) -> str:
    if path not in _SOURCES:
        _SOURCES[path] = path.read_text(encoding="utf-8")
    return _SOURCES[path]


def parsed(path: Path) -> ast.AST:
    if path not in _TREES:
        _TREES[path] = ast.parse(source_of(path), str(path))
    return _TREES[path]


def helpers_edges():
    """(file, Import, target module) for every import of a helpers module inside helpers/."""
    for path in helper_files():
        for imp in imports(path):
            if imp.module != "helpers" and not imp.module.startswith("helpers."):
                continue
            target = imp.module
            if imp.name and imp.name != "*" and is_module(f"{imp.module}.{imp.name}"):
                target = f"{imp.module}.{imp.name}"
            yield path, imp, target


# ---------------------------------------------------------------- the rules

def test_every_file_belongs_to_a_layer():
    unknown = [Violation(p, 1, layer_of_file(p)) for p in helper_files()
               if layer_of_file(p) not in ALLOWED]
    assert not unknown, report(unknown, "each file is in a layer folder, a known topic module "
                               "or the facade (add new ones to LAYERS/TOPICS and CONTRIBUTING)")


def test_imports_between_layers_follow_the_table():
    bad = []
    for path, imp, target in helpers_edges():
        importer, to = layer_of_file(path), layer_of_module(target)
        if to == "facade":
            continue  # test_no_module_imports_the_facade
        if not layer_allows(importer, to):
            bad.append(Violation(path, imp.line, f"{importer} -> {to} ({target}): {imp.text}"))
    assert not bad, report(bad, "allowed edges " + "; ".join(
        f"{k} -> {', '.join(sorted(v - {k})) or 'nothing'}" for k, v in ALLOWED.items()))


def test_no_module_imports_the_facade():
    bad = []
    for path, imp, target in helpers_edges():
        if target != "helpers" or layer_of_file(path) == "facade":
            continue
        if imp.name not in FACADE_IMPORTABLE:
            what = f"helpers.{imp.name}" if imp.name else "helpers"
            bad.append(Violation(path, imp.line, f"{layer_of_file(path)} -> facade "
                                                 f"({what}): {imp.text}"))
    assert not bad, report(bad, "modules import the module that defines a name, never the "
                                "facade helpers/__init__.py (only __version__)")


def test_no_private_names_across_layers():
    bad = []
    for path, imp, target in helpers_edges():
        importer, to = layer_of_file(path), layer_of_module(target).split(".")[0]
        if imp.name and _private(imp.name) and to != importer:
            bad.append(Violation(path, imp.line, f"{importer} -> private {target}.{imp.name}: "
                                                 f"{imp.text}"))
    assert not bad, report(bad, "a layer imports only public names of another layer (make "
                                "the name public in its module, or move the code)")


def _torch_aliases(tree: ast.AST) -> set[str]:
    """Names bound to torch or one of its modules/objects in this file."""
    names = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.asname and a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                node.module.split(".")[0] == "torch"):
            names |= {a.asname or a.name for a in node.names}
    return names


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def torch_private_uses(path: Path) -> list[Violation]:
    tree = parsed(path)
    found = []
    for imp in imports(path):
        parts = imp.module.split(".")
        if parts[0] == "torch" and (any(map(_private, parts))
                                    or (imp.name and _private(imp.name))):
            found.append(Violation(path, imp.line, f"torch-private import: {imp.text}"))
    aliases = _torch_aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            rooted = isinstance(value, ast.Name) and value.id in aliases
            # report the first private part only (torch._C, not also torch._C._x)
            if rooted and not any(map(_private, chain[1:])):
                dotted = ".".join([value.id, *reversed(chain)])
                found.append(Violation(path, node.lineno, f"torch-private name: {dotted}"))
            elif not rooted and node.attr in TORCH_PRIVATE_NAMES and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(Violation(path, node.lineno,
                                       f"torch-private name: {ast.unparse(node)}"))
        elif isinstance(node, ast.Name | ast.alias):
            name = node.id if isinstance(node, ast.Name) else (node.asname or node.name)
            if name in TORCH_PRIVATE_NAMES:
                found.append(Violation(path, getattr(node, "lineno", 1),
                                       f"torch-private name: {name}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(
                r"torch(\.\w+)*\._\w+(\.\w+)*", node.value):
            found.append(Violation(path, node.lineno, f"torch-private module: {node.value!r}"))
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                "getattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            found.append(Violation(path, node.lineno, f"torch-private name: {node.args[0].id}."
                                                      f"{node.args[1].value} (getattr)"))
    return found


def test_no_torch_private_names_outside_memory():
    bad = [v for p in helper_files() if layer_of_file(p) != "memory"
           for v in torch_private_uses(p)]
    assert not bad, report(bad, "torch-private names (torch._*, torch.<...>._*, "
                                "_disable_current_modes, ...) only in helpers/memory/")


def test_no_tensorflow_outside_tf():
    bad = []
    for path in helper_files():
        if layer_of_file(path) == "tf":
            continue
        for imp in imports(path):
            if imp.module.split(".")[0] in TENSORFLOW:
                bad.append(Violation(path, imp.line, f"{layer_of_file(path)} -> TensorFlow: "
                                                     f"{imp.text}"))
    assert not bad, report(bad, "only helpers/tf/ imports TensorFlow or Keras (elsewhere, look "
                                "at sys.modules.get('tensorflow') objects handed in)")


# ---------------------------------------------------------------- the notebooks

def facade_exports() -> set[str]:
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "_EXPORTS":
            return set(ast.literal_eval(node.value))
    raise AssertionError("helpers/__init__.py defines no _EXPORTS dict")


SHELL_ASSIGN = re.compile(r"^\s*[\w, ]+=\s*[!%]")  # IPython's `out = !command` and `t = %time f()`


def notebook_code(path: Path):
    """(cell number, source without IPython magics) of each code cell."""
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if source.lstrip().startswith("%%"):
            continue  # a cell magic: not Python
        # an IPython line becomes `pass` at its indentation, so a block around it stays valid
        lines = [(ln[:len(ln) - len(ln.lstrip())] + "pass  # " + ln.lstrip())
                 if ln.lstrip().startswith(("%", "!")) or SHELL_ASSIGN.match(ln)
                 else ln for ln in source.splitlines()]
        yield i, "\n".join(lines)
        for stub in [cell["metadata"].get("exercise", {}).get("stub")]:
            if isinstance(stub, str):
                yield i, stub


def notebook_names(path: Path):
    """(cell, line, name, text) for every helpers.<name> and ``from helpers import name``."""
    for i, source in notebook_code(path):
        tree = ast.parse(source, f"{path.name} cell {i}")
        aliases = {"helpers"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "helpers":
                        if a.name != "helpers":
                            yield i, node.lineno, a.name, f"import {a.name}"
                        aliases.add(a.asname or "helpers")
            elif isinstance(node, ast.ImportFrom) and node.module and (
                    node.module.split(".")[0] == "helpers"):
                if node.module != "helpers":
                    yield i, node.lineno, node.module, f"from {node.module} import ..."
                else:
                    for a in node.names:
                        yield i, node.lineno, a.name, f"from helpers import {a.name}"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases):
                yield i, node.lineno, node.attr, f"{node.value.id}.{node.attr}"


NOTEBOOKS = sorted((ROOT / "solutions").glob("*.ipynb")) + sorted(
    (ROOT / "lessons").glob("*.ipynb"))


def test_notebooks_use_only_facade_names():
    exports = facade_exports()
    assert NOTEBOOKS, "no notebooks found"
    bad = []
    for path in NOTEBOOKS:
        for cell, line, name, text in notebook_names(path):
            dunder = name.startswith("__") and name.endswith("__")
            if name not in exports and not dunder:
                bad.append(f"{path.relative_to(ROOT)}:cell {cell} line {line}  notebook -> "
                           f"helpers.{name} (not in helpers._EXPORTS): {text}")
    assert not bad, f"{len(bad)} violation(s) of: notebooks use only the public names of " \
                    "helpers/__init__.py's _EXPORTS\n  " + "\n  ".join(sorted(set(bad)))


# ---------------------------------------------------------------- authoring needs no torch

def test_authoring_imports_no_framework():
    bad = []
    for path in helper_files():
        if layer_of_file(path) != "authoring":
            continue
        for imp in imports(path):
            top = imp.module.split(".")[0]
            if top in ("torch", "numpy", *TENSORFLOW):
                bad.append(Violation(path, imp.line, f"authoring -> {top}: {imp.text}"))
    assert not bad, report(bad, "helpers/authoring needs nbformat only (no torch, numpy, "
                                "TensorFlow)")


@pytest.mark.parametrize("code", [
    "import helpers.authoring.build, helpers.authoring.instructor",
    "from helpers.authoring import build; raise SystemExit(build.main(['exercises']))",
])
def test_authoring_runs_with_torch_hidden(code):
    hide = "import sys; [sys.modules.__setitem__(m, None) for m in ('torch', 'tensorflow', " \
           "'numpy')]; "
    result = subprocess.run([sys.executable, "-c", hide + code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr[-3000:]


# ---------------------------------------------------------------- the checker itself

def test_relative_imports_resolve():
    here = PACKAGE / "watch" / "gauge.py"
    node = ast.parse("from ..memory import sources").body[0]
    assert resolve(here, node) == "helpers.memory"
    node = ast.parse("from . import nvml").body[0]
    assert resolve(PACKAGE / "core" / "device.py", node) == "helpers.core"
    assert resolve(PACKAGE / "core" / "__init__.py", node) == "helpers.core"
    node = ast.parse("from .core.fmt import Table").body[0]
    assert resolve(PACKAGE / "amp.py", node) == "helpers.core.fmt"
    assert layer_of_module("helpers.memory.sources") == "memory.sources"
    assert layer_allows("watch", "memory.sources") and not layer_allows("watch", "memory")
    assert layer_allows("tf", "memory.sources") and not layer_allows("core", "memory.sources")


def test_checker_finds_private_torch_and_lazy_imports(monkeypatch):
    source = ("import torch\n"
              "def f():\n"
              "    from torch.utils._python_dispatch import _disable_current_modes\n"
              "    return torch._C._get_tracing_state, torch.cuda.memory_allocated\n"
              "def g(func):\n"
              "    return func._overloadpacket.__name__, func.name()\n")
    path = PACKAGE / "watch" / "_layer_probe.py"  # never written: the caches hold it
    monkeypatch.setitem(_SOURCES, path, source)
    monkeypatch.setitem(_TREES, path, ast.parse(source))
    found = [v.text for v in torch_private_uses(path)]
    assert any("torch.utils._python_dispatch" in t for t in found)
    assert any(t.endswith("torch._C") for t in found)
    assert any(t.endswith("func._overloadpacket") for t in found)
    assert not any("memory_allocated" in t or "name()" in t for t in found)
    assert len(found) == 4, found  # import, _disable_current_modes, torch._C, _overloadpacket


def test_contributing_describes_every_layer():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("### Layers", 1)[-1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")]
    missing = [f"`{layer}/`" for layer in LAYERS if not any(f"`{layer}/`" in r for r in rows)]
    missing += [f"`{t}.py`" for t in TOPICS if not any(f"`{t}.py`" in r for r in rows)]
    assert not missing, f"CONTRIBUTING 'Layers' has no row for {missing}"
