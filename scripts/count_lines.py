"""Size of helpers/: lines, and code lines counted with ast (no docstrings, comments, blanks).

    python scripts/count_lines.py [PATH]        # default: helpers/

Code lines are the source lines covered by statements, minus docstrings (a string expression
that is the first statement of a module, class or function), comment-only and blank lines.
The issue that set the size target wants it to come from simpler code, not fewer comments, so
both numbers are printed per folder.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from collections import Counter
from pathlib import Path


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    tree = ast.parse(source)
    doc: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc.update(range(body[0].lineno, body[0].end_lineno + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                        tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - doc)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="helpers")
    args = parser.parse_args(argv)
    root = Path(args.path)
    lines, code, files = Counter(), Counter(), Counter()
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        group = rel.parts[0] if len(rel.parts) > 1 else "(topics and facade)"
        text = f.read_text()
        lines[group] += len(text.splitlines())
        code[group] += code_lines(text)
        files[group] += 1
    print(f"{'folder':<22}{'files':>6}{'lines':>8}{'code':>8}")
    for g in sorted(lines):
        print(f"{g:<22}{files[g]:>6}{lines[g]:>8}{code[g]:>8}")
    print(f"{'total':<22}{sum(files.values()):>6}{sum(lines.values()):>8}{sum(code.values()):>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
