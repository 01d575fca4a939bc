"""Lines of code per backend: how much a port costs (the paper: under 1,000 lines).

Counts the Python lines that are not blank, not comments and not docstrings (emitted C held in
Python strings, such as a prelude, counts), per registered backend folder under gir/backends,
and the shared modules every backend builds on separately. What a port may skip is counted apart
from the port proper (OPTIONAL files): its own plan engine (how a whole plan runs with its
memory resident; the shared step engine runs a plan otherwise), a calibration that measures
the machine (nominal figures otherwise), a profiler of its engine (`gir run --profile`) and a
convolution library binding (im2col + GEMM otherwise). Prints Markdown tables:

    python scripts/backend_loc.py
"""
from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ROOT / "gir" / "backends"
# its own plan engine, machine measurement, profiler, and a vendor convolution library binding
# (the device engine runs convolutions as im2col + GEMM without one)
OPTIONAL = ("engine.py", "calibration.py", "profile.py", "conv_library.py")


def ports() -> list[str]:
    """The backends registered from folders under gir/backends (gir/backends/registry.py)."""
    sys.path.insert(0, str(ROOT))
    from gir.backends.registry import backends
    return [b.name for b in backends().values() if (BACKENDS / b.name / "__init__.py").is_file()]


def split(name: str) -> tuple[list[Path], list[Path]]:
    """(port files, optional files) of one backend folder."""
    files = sorted((BACKENDS / name).glob("*.py"))
    return [f for f in files if f.name not in OPTIONAL], [f for f in files if f.name in OPTIONAL]


SHARED = {
    "cstyle.py": "the C-like emitter every dialect subclasses",
    "prelude.py": "the C prelude every dialect shares (fp16/bf16, NaN min/max)",
    "kernels.py": "kernel formation, resource checks, DRAM buffers",
    "launcher_base.py": "the launcher interface and graph launch",
    "native_cache.py": "cached native builds (CPU port, harness)",
    "errors.py": "toolchain errors",
    "port.py": "the backend interface, backend loading",
    "registry.py": "backend registration and discovery, lookup by target name",
    "device_engine.py": "the plan engine every GPU backend shares (launcher + memory)",
    "step_engine.py": "the plan engine a port gets for free (its own run per step)",
    "scaffold.py": "`gir port new`",
    "across_units.py": "SIMD across units for dialects whose lanes are loop iterations (the CPU)",
    "channel_lanes.py": "its form for windowed kernels: lanes on channels, planes staged",
    "transpose_tiles.py": "its form for transposing copies: 16x16 tiles",
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
    print("| backend | port files | port lines | optional files (own engine, calibration, profiler, conv library) | lines | total |\n"
          "| --- | --- | ---: | --- | ---: | ---: |")
    for name in ports():
        port, optional = split(name)
        a, b = sum(map(code_lines, port)), sum(map(code_lines, optional))
        print(f"| {name} | {', '.join(f.name for f in port)} | {a} | {', '.join(f.name for f in optional) or '-'} | {b} "
              f"| {a + b} |")
    print("\n| shared by every backend | what | lines |\n| --- | --- | ---: |")
    for file, what in SHARED.items():
        print(f"| {file} | {what} | {code_lines(BACKENDS / file)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
