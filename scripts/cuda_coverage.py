"""How much of the kit's CUDA-only code the CPU rehearsal executes (CONTRIBUTING "Rehearsing
CUDA code on a CPU").

::

    python scripts/cuda_coverage.py                 # run tests/rehearsal under coverage, report
    python scripts/cuda_coverage.py --min 0.8       # ... and exit 1 below 80 %
    python scripts/cuda_coverage.py --list          # only list the CUDA-only lines (no tests)

**Which lines are CUDA-only.** The script reads every ``.py`` file in ``helpers/`` and
``scripts/`` with :mod:`ast` (and the code cells of ``solutions/*.ipynb``, reported
separately). A *CUDA condition* is an expression that mentions, anywhere inside it:

* ``torch.cuda`` (any attribute chain through ``.cuda``), or an identifier containing
  ``cuda`` or ``nvml`` (``use_cuda``, ``nvml_status``, ``pynvml.NVMLError``);
* the string ``"cuda"`` / ``"cuda:N"`` (``device.type == "cuda"``) or ``"GPU"`` /
  ``"GPU:N"`` (TensorFlow's ``list_physical_devices("GPU")``, ``"GPU:0"``);
* a call to ``is_available()`` (not ``mps.is_available()``);
* a local name assigned, in the same function, from such an expression (``ok, why =
  nvml.nvml_status()`` makes ``ok`` one), or from a call listed in ``EXTRA_SOURCES`` (in
  ``helpers/core/nvml.py``: ``_init()``, which returns the pynvml module only when NVML runs).

Its CUDA-only lines are then the statements that run only when it holds:

1. the body of ``if C:`` / ``elif C:`` / ``while C:`` and of ``with C:``; for a *negated*
   condition (``not C``, ``C is None``, ``C != "cuda"``) the ``else`` body instead (``C and
   X`` counts as C, ``C or X`` only when X is one too; ``isinstance(...)`` type checks and
   ``x in (...)`` tests against a literal tuple/list such as ``kind in ("cpu", "cuda")`` are
   not CUDA conditions),
   and, when
   the ``if`` body ends in ``return``/``raise``/``continue``/``break`` and has no ``else``,
   the statements after that ``if`` in the same block (``if nv is None: return None``);
2. the body of an ``except`` clause whose exception names NVML (``except nv.NVMLError``);
3. the whole body of a module-private function or class (name starting with ``_``) whose
   every call in its file lies on CUDA-only lines (repeated until nothing changes);
4. a conditional expression ``A if C else B`` counts ``A`` only when ``A`` starts on a line
   of its own: on one line, line coverage cannot tell which side ran, so those are listed as
   "one-line conditional expressions" and left out of the share.

Only executable statements count (coverage.py's statements). The share is executed
CUDA-only lines / CUDA-only lines, from ``coverage run -m pytest tests/rehearsal``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("helpers", "scripts")
EXTRA_SOURCES = {"helpers/core/nvml.py": {"_init"}}
# the rehearsal's own tools: stand-ins for CUDA, not CUDA code
EXCLUDE = {"helpers/memory/cuda_standin.py", "helpers/core/fake_nvml.py",
           "scripts/cuda_coverage.py"}
_WORDS = ("cuda", "nvml")
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        parts.append(_dotted(node.func) + "()")
    return ".".join(reversed(parts))


class _Finder:
    def __init__(self, tree: ast.AST, extra_sources: set[str]):
        self.tree = tree
        self.extra = extra_sources
        self.lines: set[int] = set()
        self.why: dict[int, str] = {}
        self.one_line: list[int] = []
        self.one_line_spans: set[int] = set()
        self._tainted_stack: list[set[str]] = [set()]

    # ------------------------------------------------------------ conditions
    def _word(self, text: str) -> bool:
        low = text.lower()
        return any(w in low for w in _WORDS)

    def is_cuda(self, node) -> bool:
        tainted = self._tainted_stack[-1]
        skip: set[int] = set()
        for sub in ast.walk(node):
            if id(sub) in skip:
                continue
            if isinstance(sub, (ast.Tuple, ast.List, ast.Set)) or (
                    isinstance(sub, ast.Call) and _dotted(sub.func) == "isinstance") or (
                    isinstance(sub, ast.Compare)
                    and all(isinstance(op, (ast.In, ast.NotIn)) for op in sub.ops)
                    and all(isinstance(c, (ast.Tuple, ast.List, ast.Set))
                            for c in sub.comparators)):
                # a type check, or a device kind among several: not a CUDA condition
                skip.update(id(s) for s in ast.walk(sub) if s is not sub)
                continue
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                v = sub.value
                if v in ("cuda", "GPU") or v.startswith(("cuda:", "GPU:")):
                    return True
            elif isinstance(sub, ast.Name):
                if self._word(sub.id) or sub.id in tainted:
                    return True
            elif isinstance(sub, ast.Attribute):
                if self._word(sub.attr) or _dotted(sub) in tainted:
                    return True
            elif isinstance(sub, ast.Call):
                name = _dotted(sub.func)
                if name.split(".")[-1] == "is_available" and "mps" not in name:
                    return True
                if name in self.extra:
                    return True
        return False

    def polarity(self, test) -> int:
        """+1: the body runs under CUDA; -1: the else runs under CUDA; 0: not a condition."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return -self.polarity(test.operand)
        if isinstance(test, ast.BoolOp):
            signs = [self.polarity(v) for v in test.values]
            if isinstance(test.op, ast.And):  # the body needs every operand true
                pos, neg = any(p > 0 for p in signs), all(p < 0 for p in signs)
            else:  # Or: the body needs one; the else needs every operand false
                pos, neg = all(p > 0 for p in signs), any(p < 0 for p in signs)
            return 1 if pos else -1 if neg else 0
        if (isinstance(test, ast.Compare) and len(test.ops) == 1
                and isinstance(test.ops[0], (ast.Is, ast.NotEq))
                and self.is_cuda(test)):
            right = test.comparators[0]
            if isinstance(test.ops[0], ast.Is) and isinstance(right, ast.Constant) \
                    and right.value is None:
                return -1
            if isinstance(test.ops[0], ast.NotEq):
                return -1
        return 1 if self.is_cuda(test) else 0

    # ------------------------------------------------------------ marking
    def mark(self, stmts, why: str) -> None:
        for stmt in stmts:
            for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1):
                self.lines.add(line)
                self.why.setdefault(line, why)

    def taint(self, stmt) -> None:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and \
                stmt.value is not None and self.is_cuda(stmt.value):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:  # the names assigned (report.x, not report)
                for sub in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                    if isinstance(sub, ast.Starred):
                        sub = sub.value
                    if isinstance(sub, (ast.Name, ast.Attribute)):
                        self._tainted_stack[-1].add(_dotted(sub))

    def block(self, stmts) -> None:
        for k, stmt in enumerate(stmts):
            self.taint(stmt)
            self.visit(stmt)
            if isinstance(stmt, ast.If) and not stmt.orelse and stmt.body and \
                    isinstance(stmt.body[-1], _EXITS) and self.polarity(stmt.test) < 0:
                self.mark(stmts[k + 1:], "after an early exit on a negated CUDA condition")

    def visit(self, node) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._tainted_stack.append(set())
            self.block(node.body)
            self._tainted_stack.pop()
            return
        if isinstance(node, ast.ClassDef):
            self.block(node.body)
            return
        if isinstance(node, (ast.If, ast.While)):
            self.expressions(node.test)
            sign = self.polarity(node.test)
            if sign > 0:
                self.mark(node.body, "body of a CUDA condition")
            elif sign < 0:
                self.mark(node.orelse, "else of a negated CUDA condition")
            self.block(node.body)
            self.block(node.orelse)
            return
        if isinstance(node, (ast.With, ast.AsyncWith)):
            if any(self.is_cuda(item.context_expr) for item in node.items):
                self.mark(node.body, "body of a CUDA with-block")
            for item in node.items:
                self.expressions(item.context_expr)
            self.block(node.body)
            return
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            self.block(node.body)
            for handler in node.handlers:
                if handler.type is not None and any(
                        isinstance(s, (ast.Name, ast.Attribute)) and "nvml" in _dotted(s).lower()
                        for s in ast.walk(handler.type)):
                    self.mark(handler.body, "NVML exception handler")
                self.block(handler.body)
            self.block(node.orelse)
            self.block(node.finalbody)
            return
        if isinstance(node, (ast.For, ast.AsyncFor)):
            self.expressions(node.iter)
            self.block(node.body)
            self.block(node.orelse)
            return
        if isinstance(node, ast.Match):
            for case in node.cases:
                self.block(case.body)
            return
        if isinstance(node, ast.stmt):
            self.expressions(node)

    def expressions(self, node) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.IfExp):
                sign = self.polarity(sub.test)
                side = sub.body if sign > 0 else sub.orelse if sign < 0 else None
                if side is None:
                    continue
                if side.lineno != sub.test.lineno and side.lineno != sub.lineno or \
                        side.lineno > sub.test.end_lineno:
                    for line in range(side.lineno, side.end_lineno + 1):
                        self.lines.add(line)
                        self.why.setdefault(line, "side of a CUDA conditional expression")
                else:
                    self.one_line.append(sub.lineno)
                    self.one_line_spans.update(range(side.lineno, side.end_lineno + 1))

    # ------------------------------------------------------------ private functions/classes
    def private_definitions(self) -> None:
        defs = {}
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                    node.name.startswith("_") and not node.name.startswith("__"):
                defs.setdefault(node.name, []).append(node)
        uses = defaultdict(list)
        for node in ast.walk(self.tree):
            name = None
            if isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.Attribute):
                name = node.attr
            if name in defs:
                uses[name].append(node.lineno)
        done: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, nodes in defs.items():
                if name in done or not uses[name]:
                    continue
                body_lines = {line for node in nodes
                              for line in range(node.lineno, node.end_lineno + 1)}
                outside = [u for u in uses[name] if u not in body_lines]
                cuda_uses = self.lines | self.one_line_spans
                if outside and all(u in cuda_uses for u in outside):
                    for node in nodes:
                        self.mark(_without_docstring(node.body),
                                  f"{name} is only used on CUDA-only lines")
                    done.add(name)
                    changed = True


def _without_docstring(body):
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def cuda_lines(source: str, rel: str = "") -> tuple[set[int], list[int], dict[int, str]]:
    """(CUDA-only lines, one-line conditional expressions, reason per line) of ``source``."""
    tree = ast.parse(source)
    finder = _Finder(tree, EXTRA_SOURCES.get(rel, set()))
    finder.block(tree.body)
    finder.private_definitions()
    return finder.lines, sorted(set(finder.one_line)), finder.why


def statements(path: Path) -> set[int]:
    """coverage.py's executable statement lines of ``path``."""
    from coverage.python import PythonParser

    parser = PythonParser(filename=str(path))
    parser.parse_source()
    return set(parser.statements)


def source_files() -> list[Path]:
    return sorted(p for d in SOURCES for p in (ROOT / d).rglob("*.py")
                  if "__pycache__" not in p.parts
                  and p.relative_to(ROOT).as_posix() not in EXCLUDE)


def notebook_branches() -> dict[str, list[str]]:
    """CUDA-only lines of solutions/*.ipynb code cells: {notebook: ["cell N line L: code"]}."""
    out = {}
    for nb in sorted((ROOT / "solutions").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        found = []
        for n, cell in enumerate(cells):
            if cell.get("cell_type") != "code":
                continue
            src = "".join(cell.get("source", []))
            code = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln
                             for ln in src.splitlines())
            try:
                lines, one_line, _ = cuda_lines(code)
            except SyntaxError:
                continue
            text = code.splitlines()
            for line in sorted(lines) + one_line:
                if text[line - 1].strip():
                    found.append(f"cell {n} line {line}: {text[line - 1].strip()[:70]}")
        if found:
            out[nb.name] = found
    return out


def run_rehearsal(data_file: Path, tests: list[str]) -> float:
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "coverage", "run", f"--data-file={data_file}",
           "--source=" + ",".join(SOURCES), "-m", "pytest", *tests, "-q", "-p", "no:xdist",
           "-p", "no:cacheprovider", "-p", "no:randomly"]
    env = dict(os.environ, COVERAGE_RCFILE=os.devnull)
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if proc.returncode != 0:
        sys.exit(f"cuda_coverage: the rehearsal tests failed (exit {proc.returncode})")
    return time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min", type=float, default=None,
                    help="exit 1 when the executed share is below this (e.g. 0.8)")
    ap.add_argument("--list", action="store_true",
                    help="only list the CUDA-only lines (runs no tests)")
    ap.add_argument("--tests", nargs="+", default=["tests/rehearsal"],
                    help="test paths to run under coverage (default: tests/rehearsal)")
    ap.add_argument("--data-file", default=None, help="reuse this .coverage data file")
    ap.add_argument("--notebooks", action="store_true",
                    help="also list the CUDA-only lines of solutions/*.ipynb code cells")
    args = ap.parse_args(argv)
    if args.min is not None and not 0 <= args.min <= 1:
        ap.error(f"--min must be between 0 and 1, got {args.min}")

    per_file = {}
    one_liners = []
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        lines, one_line, why = cuda_lines(path.read_text(), rel)
        stmts = statements(path)
        executable = sorted(lines & stmts)
        if executable:
            per_file[rel] = (executable, why)
        one_liners += [f"{rel}:{n}" for n in one_line]

    executed: dict[str, set[int]] = {}
    seconds = None
    if not args.list:
        import coverage

        if args.data_file:
            data_file = Path(args.data_file)
        else:
            data_file = Path(tempfile.mkdtemp(prefix="cuda-coverage-")) / ".coverage"
            seconds = run_rehearsal(data_file, args.tests)
        data = coverage.CoverageData(basename=str(data_file))
        data.read()
        for name in data.measured_files():
            rel = Path(name).resolve().relative_to(ROOT).as_posix() \
                if Path(name).resolve().is_relative_to(ROOT) else name
            executed[rel] = set(data.lines(name) or ())

    total = hit = 0
    missing = []
    print("CUDA-only lines in helpers/ and scripts/ (rule: scripts/cuda_coverage.py docstring)")
    width = max((len(r) for r in per_file), default=10)
    for rel, (lines, why) in per_file.items():
        ran = [n for n in lines if n in executed.get(rel, ())]
        total += len(lines)
        hit += len(ran)
        if args.list:
            print(f"  {rel:<{width}}  {len(lines):4d} lines")
            for n in lines:
                print(f"    {rel}:{n}  ({why.get(n, '')})")
            continue
        print(f"  {rel:<{width}}  {len(ran):4d} / {len(lines):4d}  {len(ran) / len(lines):6.1%}")
        missing += [f"{rel}:{n}" for n in lines if n not in executed.get(rel, ())]
    if one_liners:
        print(f"one-line conditional expressions (not measurable by lines, left out): "
              f"{', '.join(one_liners)}")
    if args.notebooks:
        for nb, found in notebook_branches().items():
            print(f"notebook {nb}: {len(found)} CUDA-only line(s)")
            for item in found:
                print(f"    {item}")
    if args.list:
        print(f"total: {total} CUDA-only lines")
        return 0
    share = hit / total if total else 1.0
    if missing:
        print(f"not executed ({len(missing)}): {' '.join(missing)}")
    timing = f" (rehearsal under coverage: {seconds:.0f} s)" if seconds is not None else ""
    print(f"CUDA rehearsal coverage: {hit} of {total} CUDA-only lines executed = {share:.1%}"
          f"{timing}")
    if args.min is not None and share < args.min:
        print(f"below the floor --min {args.min:.0%}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
