"""Lines of code per backend: how much a port costs (the paper: under 1,000 lines).

Counts the Python lines that are not blank, not comments and not docstrings (emitted C held in
Python strings, such as a prelude, counts), per backend folder under gir/backends, and the
shared modules every backend builds on separately. Prints a Markdown table:

    python scripts/backend_loc.py
"""
from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

BACKENDS = Path(__file__).resolve().parent.parent / "gir" / "backends"
PORTS = ("cuda", "hip", "cpu", "opencl")
SHARED = {
    "cstyle.py": "the C-like emitter every dialect subclasses",
    "kernels.py": "kernel formation, resource checks, DRAM buffers",
    "launcher_base.py": "the launcher interface and graph launch",
    "native_cache.py": "cached native builds (CPU port, harness)",
    "errors.py": "toolchain errors",
    "port.py": "the backend interface, backend loading",
    "scaffold.py": "`gir port new`",
}


def code_lines(path: Path) -> int:
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docstrings)


def main() -> int:
    print("| backend | files | lines |\n| --- | --- | ---: |")
    for name in PORTS:
        files = sorted((BACKENDS / name).glob("*.py"))
        print(f"| {name} | {', '.join(f.name for f in files)} | {sum(code_lines(f) for f in files)} |")
    print("\n| shared by every backend | what | lines |\n| --- | --- | ---: |")
    for file, what in SHARED.items():
        print(f"| {file} | {what} | {code_lines(BACKENDS / file)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
