"""Build emitted C with the system compiler into a cached shared library, and run graphs.

Why the system `cc` and ctypes: every Linux CI image has gcc with OpenMP, and a shared library
called through ctypes needs no Python extension build. Libraries are cached by a hash of the
compiler version, flags and source in the compile cache (gir/cache.py), so tests rebuild nothing.
"""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
from functools import lru_cache
from typing import Callable

import numpy as np

from ..errors import ToolchainMissingError
from ..native_cache import cached_library
from ..kernels import GUARD, CompiledGraph, allocate_dram, check_guards, collect_outputs, emit_graph, with_guards
from .emitter import CpuEmitter

CC = os.environ.get("CC", "cc")
# -O3 vectorises the element and reduction loops; -march=native uses this machine's SIMD (AVX2 or
# AVX-512, not SSE2 only), so a library is built for the CPU it runs on and its cache key holds
# the CPU (host_cpu); -fno-math-errno lets sqrtf & co. inline instead of calling libm for errno.
# -std=c11 keeps -ffp-contract=off: no fused multiply-adds, the same rounding as the reference.
# -mno-red-zone: gcc 12.2 at -O3 -march=native placed a leaf kernel's stack arrays in the red
# zone 8 bytes off the 16 its vmovdqa needs (a segfault in a one-thread Upsample kernel, where
# the frame pointer was set up without realigning); with the frame allocated it aligns them.
BASE_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-mno-red-zone", "-fopenmp", "-shared", "-fPIC", "-std=c11")


WIDE_VECTOR_FLAGS = ("-mprefer-vector-width=512", "-mmove-max=512", "-mstore-max=512")


def wide_vector_flags(cpu_flags: str, accepts=None) -> tuple[str, ...]:
    """512-bit vectors where the CPU has AVX-512 and the compiler takes all three options.
    gcc 12 vectorises for 256-bit registers on every AVX-512 CPU it knows (against the clock
    drop 512-bit code caused on Skylake-SP). On this project's Sapphire Rapids VM, the GIR
    kernels of each zoo model, one thread, each timed alone, 256-bit build against this one
    (`scripts/loop_forms_ab.py --baseline vectors`, results/wide_vectors_ab.md): RedNet-50
    1.58x, ShuffleNet-v2 1.20x, EfficientNet-B0 1.18x, BERT 1.11x, GPT-2 1.03x, ViT 0.98x (its
    softmax over rows of 197 a little slower). The width alone is not enough: gcc still copied
    a row into its stack array in 256-bit moves (move-max), and reading it back in 512-bit
    loads missed store forwarding (perf annotate on BERT's softmax kernel, which ran slower
    than in 256-bit code); hence all three or none (gcc 11 and clang lack -mmove-max).
    On a Cascade Lake guest (the Skylake-SP family whose clock drop gcc's default guards
    against) the same A/B still favours 512 bits: RedNet-50 2.00x, EfficientNet-B0 1.79x, BERT
    1.35x, ShuffleNet-v2 1.26x, ViT 1.15x, GPT-2 0.99x (results/wide_vectors_ab_cascadelake.md)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or " avx512f " not in f" {cpu_flags} ":
        return ()
    return WIDE_VECTOR_FLAGS if (accepts or compiler_accepts)(WIDE_VECTOR_FLAGS) else ()


@lru_cache(maxsize=None)
def compiler_accepts(flags: tuple[str, ...]) -> bool:
    """Whether CC compiles an empty C file with `flags` (no warning about them either)."""
    if shutil.which(CC) is None:
        return False
    done = subprocess.run([CC, *flags, "-Werror", "-x", "c", "-c", "-o", os.devnull, "-"], input="",
                          capture_output=True, text=True)
    return done.returncode == 0


# libgomp reads its settings once, when the first OpenMP library is loaded. Its default policy
# spins ~300k times between parallel regions; next to numpy's OpenBLAS pool (the fallback for
# library ops), which spins too, the two pools then steal the cores from each other (ViT-B/16
# on 2 cores: 6.8 s a run spinning, 0.45 s passive), and with another process on a core a
# spinning thread takes the core from the one doing the work (GPT-2 decode 6x slower at 30k
# spins). Fully passive, every region pays a futex wake-up (~38 us here). A short spin catches
# the next region of a run's back-to-back kernels and then sleeps: 1000 spins on the AMD guest
# where this was measured (passive -> 1000 spins, default threads, idle: EfficientNet-B0
# 17.0-18.9 -> 14.6 ms, ShuffleNet-v2 5.0-6.0 -> 5.0-5.2, GPT-2 decode 20.3-21.0 -> 18.2-19.5;
# results/omp_wait.md), which is about 20 us there; `spin.set_spin_window` (called when the
# package registers the backend, before anything loads libgomp) sets that window in time for
# the CPU it runs on. A setting of the caller's wins.


@lru_cache(maxsize=None)
def toolchain_version() -> str:
    """`cc --version` and the host CPU: part of every cached library's key (-march=native)."""
    if shutil.which(CC) is None:
        raise ToolchainMissingError(f"no C compiler {CC!r} on PATH: install gcc (apt-get install gcc) or set CC")
    return subprocess.run([CC, "--version"], capture_output=True, text=True).stdout + host_cpu()


@lru_cache(maxsize=None)
def host_cpu() -> str:
    """The CPU model and its feature flags (what -march=native compiles for); a cache folder
    shared between machines then never hands one a library built for another's instructions."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return platform.machine() + " " + platform.processor()
    keep = [ln.split(":", 1)[1].strip() for ln in lines if ln.split(":", 1)[0].strip() in ("model name", "flags")]
    return " | ".join(dict.fromkeys(keep))


# -march=native plus the vector width this CPU is fastest at (FLAGS' cache key holds both).
FLAGS = BASE_FLAGS[:2] + wide_vector_flags(host_cpu()) + BASE_FLAGS[2:]


def build(source: str, name: str = "gir", flags: tuple[str, ...] | None = None) -> ctypes.CDLL:
    """Compile (or fetch from the cache) and load a library of emitted kernels; `flags`: other
    than FLAGS (an A/B of the build, scripts/loop_forms_ab.py --baseline vectors)."""
    return cached_library(toolchain_version(), CC, list(flags or FLAGS), source, ".c",
                          f"C source of {name!r}", f"the CPU ({CC})", libraries=("-lm",))


def compile(graph, target=None) -> CompiledGraph:
    source, kernels = emit_graph(CpuEmitter(target or graph.target), graph)
    return CompiledGraph(source, kernels, build(source, graph.name))


def run(graph, feeds: dict, edit: Callable[[str], str] | None = None) -> dict:
    """Outputs of `graph` computed by its emitted C kernels, launched in order. Every buffer sits
    between guard bytes (0xFF: NaN or -1 when read), so a stray write is an error, not silent
    heap damage. `edit` rewrites the source before it is built (tests inject bugs with it)."""
    source, kernels = emit_graph(CpuEmitter(graph.target), graph)
    lib = build(edit(source) if edit else source, graph.name)
    arrays = allocate_dram(graph, feeds)
    raws = {name: with_guards(a) for name, a in arrays.items()}
    for k in kernels:
        fn = getattr(lib, k.name)
        fn.argtypes = [ctypes.c_void_p] * len(k.params)
        fn.restype = None
        fn(*[raws[b.name].ctypes.data + GUARD for b in k.params])
        for b in k.params:
            check_guards(raws[b.name], arrays[b.name].nbytes, k.name, b.name)
    for name, a in arrays.items():
        a.view(np.uint8)[:] = raws[name][GUARD:GUARD + a.nbytes]
    return collect_outputs(graph, arrays)
