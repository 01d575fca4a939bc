"""Build emitted C with the system compiler into a cached shared library, and run graphs.

Why the system `cc` and ctypes: every Linux CI image has gcc with OpenMP, and a shared library
called through ctypes needs no Python extension build. Libraries are cached by a hash of the
compiler version, flags and source under the system temp dir, so tests rebuild nothing.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ToolchainMissingError
from ..native_cache import cached_library
from ..kernels import CompiledGraph, allocate_dram, collect_outputs, emit_graph
from .emitter import CpuEmitter

CC = os.environ.get("CC", "cc")
FLAGS = ("-O2", "-fopenmp", "-shared", "-fPIC", "-std=c11")


def cache_dir() -> Path:
    d = Path(os.environ.get("GIR_CPU_CACHE") or Path(tempfile.gettempdir()) / f"gir-cpu-{os.getuid()}")
    d.mkdir(parents=True, exist_ok=True)
    return d


@lru_cache(maxsize=None)
def _compiler_id() -> str:
    if shutil.which(CC) is None:
        raise ToolchainMissingError(f"no C compiler {CC!r} on PATH: install gcc (apt-get install gcc) or set CC")
    return subprocess.run([CC, "--version"], capture_output=True, text=True).stdout


def build(source: str, name: str = "gir") -> ctypes.CDLL:
    """Compile (or fetch from the cache) and load a library of emitted kernels."""
    return cached_library(cache_dir(), _compiler_id(), CC, list(FLAGS), source, ".c",
                          f"C source of {name!r}", f"the CPU ({CC})", libraries=("-lm",))


def compile(graph, target=None) -> CompiledGraph:
    source, kernels = emit_graph(CpuEmitter(target or graph.target), graph)
    return CompiledGraph(source, kernels, build(source, graph.name))


class OutOfBoundsError(RuntimeError):
    """An emitted kernel wrote outside a DRAM buffer (seen in the guard bytes around it)."""


def run(graph, feeds: dict, edit: Callable[[str], str] | None = None) -> dict:
    """Outputs of `graph` computed by its emitted C kernels, launched in order. Every buffer sits
    between guard bytes (0xFF: NaN or -1 when read), so a stray write is an error, not silent
    heap damage. `edit` rewrites the source before it is built (tests inject bugs with it)."""
    source, kernels = emit_graph(CpuEmitter(graph.target), graph)
    lib = build(edit(source) if edit else source, graph.name)
    arrays = allocate_dram(graph, feeds)
    raws = {name: _guarded(a) for name, a in arrays.items()}
    for k in kernels:
        fn = getattr(lib, k.name)
        fn.argtypes = [ctypes.c_void_p] * len(k.params)
        fn.restype = None
        fn(*[raws[b.name].ctypes.data + GUARD for b in k.params])
        for b in k.params:
            raw = raws[b.name]
            if (raw[:GUARD] != 0xFF).any() or (raw[GUARD + arrays[b.name].nbytes:] != 0xFF).any():
                raise OutOfBoundsError(f"kernel {k.name} wrote outside DRAM buffer {b.name!r}")
    for name, a in arrays.items():
        a.view(np.uint8)[:] = raws[name][GUARD:GUARD + a.nbytes]
    return collect_outputs(graph, arrays)


GUARD = 4096


def _guarded(a: np.ndarray) -> np.ndarray:
    raw = np.full(a.nbytes + 2 * GUARD, 0xFF, np.uint8)
    raw[GUARD:GUARD + a.nbytes] = a.view(np.uint8)
    return raw
