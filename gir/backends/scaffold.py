"""`gir port new NAME`: write a backend folder that already passes the conformance suite's
import and description checks, with every instruction mapping still to write marked
`TODO(port)`. Until they are written, compile() and run() raise NotImplementedError naming
the file and what goes there, so the suite's compile and execute checks fail saying so.
"""
from __future__ import annotations

import re
from pathlib import Path
from string import Template

FILES = {
    "__init__.py": '''"""The $name backend (scaffolded by `gir port new $name`; see docs/PORTING.md). The four names
below are what every backend exposes; the registration is what `gir compile`, `gir run` and
gir.Session find it by (gir/backends/registry.py). Check it with
    python3 -m pytest tests/conformance --backend $spec
"""
from gir.backends.registry import Backend, Compiler, TargetEntry, register
from gir.backends.step_engine import step_engine

from .compiler import SOURCE_SUFFIX, compile, run, toolchain_version
from .device import describe
from .emitter import Emitter

register(Backend(
    name="$name", emitter=Emitter, module=__name__,
    targets=(TargetEntry("$name", describe),),  # the names `--target` takes
    compiler=Compiler(compile, SOURCE_SUFFIX, toolchain_version),
    engine=step_engine(run, compile),  # a plan runs step by step through run(); a resident engine can come later
))

__all__ = ["Emitter", "compile", "describe", "run"]
''',
    "device.py": '''"""Hardware description of $name: data the templates, rewrites and performance model read.
TODO(port): every figure below is a placeholder; state which are measured and which nominal."""
from gir.ir.target import BLOCK, DEVICE, DRAM, REGISTER, SHARED, UNIT, MemoryLevel, Target


def describe() -> Target:
    return Target(
        name="$name", backend="$name",
        arch="$name",                      # TODO(port): the architecture name the compiler takes
        hierarchy=("grid", "block", "unit", "lane"),  # TODO(port): the hardware's names, outermost first
        lanes_per_unit=32,                 # TODO(port): lanes that run in lockstep (warp 32, wavefront 64, thread 1)
        max_units_per_block=32,            # TODO(port): units a block (work-group) may hold
        processors=1,                      # TODO(port): SMs / CUs / cores
        memory=(
            MemoryLevel(REGISTER, UNIT, 255 * 4, float("inf")),  # TODO(port): register bytes per lane
            MemoryLevel(SHARED, BLOCK, 48 * 1024, 1e12),  # TODO(port): bytes per block, bytes/s; drop if none
            MemoryLevel(DRAM, DEVICE, 1 << 34, 1e11),  # TODO(port): device memory bytes, bytes/s
        ),
        peak_flops=1e12,                   # TODO(port): fp32 FLOP/s
        peak_matrix_flops=1e12,            # TODO(port): what the vendor GEMM reaches
        launch_latency_s=5e-6,             # TODO(port)
        notes="scaffold placeholders",
    )
''',
    "emitter.py": '''"""Emitter dialect of $name over the shared C-like emitter (gir/backends/cstyle.py). Each
TODO(port) is an instruction mapping; gir/backends/{cuda,hip,opencl,cpu}/emitter.py show each
one written for another device. Until then this emits CUDA."""
from gir.backends.cstyle import CStyle
from gir.backends.prelude import GPU_PRELUDE
from gir.backends.kernels import Kernel


class Emitter(CStyle):
    kernel_prefix = 'extern "C" __global__ void'  # TODO(port): how a kernel is declared
    restrict = "__restrict__"                      # TODO(port): the no-alias qualifier, or ""
    shared_prefix = "__shared__ "                  # TODO(port): qualifier of arrays shared by a block
    types = dict(CStyle.types)                     # TODO(port): the C type of each dtype in memory

    def prelude(self) -> str:
        """TODO(port): includes, and the macros every kernel uses (GIR_INF_F, GIR_NAN_F,
        GIR_INF_D, GIR_NAN_D, GIR_MAX, GIR_MIN, GIR_MAXS, GIR_MINS, GIR_RH, gir_ipow)."""
        return GPU_PRELUDE

    def prologue(self, k: Kernel) -> list[str]:
        """TODO(port): lane, w (unit in block), b (block) and u (global unit) from the hardware's indices."""
        return super().prologue(k)

    def barrier(self) -> str:
        return "__syncthreads();"  # TODO(port): block barrier that orders shared memory

    def sync_unit(self) -> str:
        return "__syncwarp();"  # TODO(port): barrier among a unit's lanes

    def shfl(self, value: str, src: str) -> str:
        return f"__shfl_sync(0xffffffffu, ({value}), ({src}))"  # TODO(port): read `value` of lane `src`

    def shfl_xor(self, value: str, mask: int) -> str:
        return f"__shfl_xor_sync(0xffffffffu, ({value}), {mask})"  # TODO(port): butterfly exchange

    def half_to_float(self, x: str) -> str:
        return f"__half2float({x})"  # TODO(port): fp16 in memory -> float

    def float_to_half(self, x: str) -> str:
        return f"__float2half({x})"  # TODO(port): float -> fp16 in memory
''',
    "compiler.py": '''"""Compiler call and launcher of $name."""
from gir.backends.kernels import CompiledGraph, check_shared, emit_graph

from .emitter import Emitter

SOURCE_SUFFIX = ".cu"  # TODO(port): the suffix of this toolchain's sources (`gir compile` writes kernels/k000.cu)


def toolchain_version() -> str:
    """TODO(port): the compiler's version and flags: part of the compile cache's keys."""
    return "$name scaffold"


def compile(graph, target=None) -> CompiledGraph:
    """Emit every kernel of `graph` into one source and build it."""
    target = target or graph.target
    source, kernels = emit_graph(Emitter(target), graph)
    check_shared(kernels, target)
    return CompiledGraph(source, kernels, build(source, graph.name))


def build(source: str, name: str):
    """TODO(port): compile `source` with the $name toolchain and return the binary; on a
    compiler error raise gir.backends.errors.CompileError(what, target, log)."""
    raise NotImplementedError(f"TODO(port) {__file__}: build() has no compiler call yet ({name})")


def run(graph, feeds: dict) -> dict:
    """TODO(port): launch compile(graph)'s kernels in order on this machine's device and return
    the outputs (gir.backends.launcher_base: a Launcher and launch_graph), or raise
    gir.backends.errors.NoDeviceError where there is none (the suite then only compiles)."""
    raise NotImplementedError(f"TODO(port) {__file__}: run() has no launcher yet ({graph.name})")
''',
}


class ScaffoldError(ValueError):
    """The backend cannot be written (bad name, folder exists); the message is one line."""


def default_parent() -> Path:
    return Path(__file__).resolve().parent


def new_backend(name: str, parent: Path | None = None) -> Path:
    """Write PARENT/NAME/ (default: gir/backends/NAME/) and return it."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ScaffoldError(f"backend name {name!r}: use lower-case letters, digits and _ (a Python package name)")
    parent = (parent or default_parent()).resolve()
    folder = parent / name
    if not parent.is_dir():
        raise ScaffoldError(f"{parent} is not a folder")
    if folder.exists() or (parent / f"{name}.py").exists():
        raise ScaffoldError(f"{name!r} is taken in {parent}: choose another name or --dir")
    spec = name if parent == default_parent() else str(folder)
    folder.mkdir()
    for file, text in FILES.items():
        (folder / file).write_text(Template(text).substitute(name=name, spec=spec))
    return folder
