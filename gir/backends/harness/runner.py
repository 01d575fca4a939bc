"""Run unchanged CUDA/HIP kernel source on the CPU (tests only), through gpu_on_cpu.h.

Why: CI has no GPU, yet every emitted kernel's numbers must be checked against numpy. The
source is compiled with g++ and OpenMP against our header (its `#include <cuda_fp16.h>` or
`<hip/hip_runtime.h>` resolve to stubs in include/), cached by content hash, and called through
a generated extern "C" wrapper that deduces the kernel's parameter types, so callers need not
spell a C signature. Arrays are copied into guarded "device" buffers and back, which turns small
out-of-bounds writes into errors and out-of-bounds reads into NaNs.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..native_cache import cached_library
from .precompiled import include_flags

HERE = Path(__file__).resolve().parent
HEADER = HERE / "gpu_on_cpu.h"
INCLUDE = HERE / "include"
CXX = os.environ.get("CXX", "g++")
# Hidden visibility and no STB_GNU_UNIQUE: every kernel library keeps its own launch state and
# fiber pool (unique symbols would be merged across libraries even when loaded RTLD_LOCAL).
FLAGS = ("-O1", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-strict-aliasing", "-U_FORTIFY_SOURCE",
         "-fvisibility=hidden", "-fno-gnu-unique")
WARP = {"cuda": 32, "hip": 64}
GUARD = 16384  # guard bytes around every array: NaN as fp16/32/64, negative as int, distinct per array
_KINDS = {1: "pointer", 2: "i", 3: "u", 4: "f", 5: "struct"}
_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}


class HarnessError(RuntimeError):
    """The kernel failed on the CPU harness (barrier misuse, __trap, out-of-bounds write, bad args)."""


class DeadlockError(HarnessError):
    """Threads of a block (or lanes of a warp) wait at different barriers, or some exited."""


@lru_cache(maxsize=None)
def _toolchain_id() -> str:
    shim = b"".join(p.read_bytes() for p in sorted(HERE.rglob("*.h")))
    version = subprocess.run([CXX, "--version"], capture_output=True, check=True).stdout
    return hashlib.sha256(shim + version + " ".join(FLAGS).encode()).hexdigest()


_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+(?:(?:__align__|alignas)\s*\(\s*\d+\s*\)\s*)*"
                            r"([A-Za-z_][\w:\s]*?)\s+([A-Za-z_]\w*)\s*\[\s*\]\s*;")
_HIP_DYN_SHARED = re.compile(r"HIP_DYNAMIC_SHARED\s*\(\s*([^,]+?)\s*,\s*([A-Za-z_]\w*)\s*\)")


def _translation_unit(source: str, kernel: str, dialect: str) -> str:
    """The source untouched (with #line so diagnostics name its lines), then storage for any
    `extern __shared__` array (per OS thread = per block, sized for the largest request) and
    the launch wrapper."""
    defs = {name: typ for typ, name in _EXTERN_SHARED.findall(source) + _HIP_DYN_SHARED.findall(source)}
    storage = "".join(f"thread_local __attribute__((aligned(16))) {t} {n}[GPUCPU_DYN_SMEM_MAX / sizeof({t})];\n"
                      for n, t in defs.items())
    return (f'#line 1 "{kernel}.{"cu" if dialect == "cuda" else "hip"}"\n{source}\n#line 1 "gpucpu_wrapper.cpp"\n'
            f"{storage}"
            f'extern "C" GPUCPU_API int gpucpu_launch(void** a, const unsigned* d, unsigned long long s) {{\n'
            f"  return ::gpucpu::launch([](void** p) {{ ::gpucpu::invoke({kernel}, p); }}, a, d, s);\n}}\n"
            f'extern "C" GPUCPU_API int gpucpu_signature(int* out, int max) {{ return ::gpucpu::signature({kernel}, out, max); }}\n'
            f'extern "C" GPUCPU_API const char* gpucpu_error() {{ return ::gpucpu::g_err.c_str(); }}\n')


def build(source: str, kernel_name: str, dialect: str = "cuda") -> ctypes.CDLL:
    """Compile (or fetch from the cache) and load the kernel's CPU library."""
    if dialect not in WARP:
        raise ValueError(f"dialect must be 'cuda' or 'hip', got {dialect!r}")
    if not re.fullmatch(r"[A-Za-z_][\w:<>, ]*", kernel_name):
        raise ValueError(f"not a kernel name: {kernel_name!r}")
    tu = _translation_unit(source, kernel_name, dialect)
    return cached_library(f"{_toolchain_id()}\0{dialect}", CXX, build_flags(dialect), tu, ".cpp",
                          f"kernel {kernel_name!r} ({dialect} source, CPU harness)", "the CPU (g++)", _bind)


def build_flags(dialect: str) -> list[str]:
    """g++'s flags for a kernel library of `dialect`, the harness header precompiled."""
    flags = [*FLAGS, f"-DGPUCPU_WARP_SIZE={WARP[dialect]}", f"-I{INCLUDE}"]
    return [*flags, *include_flags(CXX, flags, HEADER, _toolchain_id())]


def _bind(lib: ctypes.CDLL) -> None:
    lib.gpucpu_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong]
    lib.gpucpu_error.restype = ctypes.c_char_p
    lib.lock = threading.Lock()  # the launch state in the library is global


def _signature(lib) -> list[tuple[int, int]]:
    buf = (ctypes.c_int * 256)()
    n = lib.gpucpu_signature(buf, 256)
    return [(buf[2 * i], buf[2 * i + 1]) for i in range(n)]


def _scalar(i: int, value, kind: int, size: int):
    """A C object for a by-value parameter; Python numbers take the parameter's type, explicitly
    typed numbers (numpy or ctypes) must match it."""
    if kind == 5:
        raw = value.tobytes() if isinstance(value, np.generic) else bytes(value)
        if len(raw) != size:
            raise HarnessError(f"argument {i}: kernel expects a {size}-byte value, got {len(raw)} bytes")
        return ctypes.create_string_buffer(raw, size)
    want = np.dtype(f"{_KINDS[kind]}{size}")
    if isinstance(value, ctypes._SimpleCData):
        value = np.dtype(type(value)).type(value.value)
    if isinstance(value, np.generic):
        if value.dtype != want:
            raise HarnessError(f"argument {i}: kernel expects {want}, got {value.dtype}")
    elif not isinstance(value, (int, float)) or (isinstance(value, float) and kind != 4):
        raise HarnessError(f"argument {i}: kernel expects {want}, got {type(value).__name__} {value!r}")
    return np.ctypeslib.as_ctypes(np.array([value], dtype=want))


def _guard(i: int) -> np.ndarray:
    """Bytes (x, 0xFF) with x in 0xF0..0xFE: a NaN in every float width, and distinct per
    argument, so a NaN read past one array and stored past another still shows as a write."""
    return np.array([0xF0 + i % 15, 0xFF], np.uint8)


def run_kernel(source: str, kernel_name: str, grid, block, args: list, dialect: str = "cuda",
               shared_bytes: int = 0) -> None:
    """Run `kernel_name` over `grid` x `block` on the CPU. numpy arrays are device buffers:
    copied in, and copied back into the (writeable) arrays after the launch. Scalars: Python
    numbers take the kernel parameter's type; numpy scalars must match it exactly."""
    grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
    if min(grid + block) < 1 or np.prod(block) > 1024:
        raise HarnessError(f"bad launch shape grid={grid} block={block} (at most 1024 threads per block)")
    lib = build(source, kernel_name, dialect)
    sig = _signature(lib)
    if len(sig) != len(args):
        raise HarnessError(f"kernel {kernel_name} takes {len(sig)} arguments, got {len(args)}")
    buffers: dict[int, tuple[int, np.ndarray, np.ndarray, int]] = {}  # id -> (arg #, array, raw, offset)
    slots = []
    for i, ((kind, size), a) in enumerate(zip(sig, args)):
        if kind == 1:
            if a is None:
                slots.append(ctypes.c_void_p(0))
                continue
            if not isinstance(a, np.ndarray):
                raise HarnessError(f"argument {i}: kernel expects a pointer, got {type(a).__name__}")
            if id(a) not in buffers:
                if not a.flags.c_contiguous:
                    raise HarnessError(f"argument {i}: arrays must be C-contiguous")
                raw = np.resize(_guard(i), a.nbytes + 2 * GUARD + 256)
                off = GUARD + (-(raw.ctypes.data + GUARD) % 256)  # device-like 256-byte alignment
                raw[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
                buffers[id(a)] = (i, a, raw, off)
            _, _, raw, off = buffers[id(a)]
            slots.append(ctypes.c_void_p(raw.ctypes.data + off))
        else:
            slots.append(_scalar(i, a, kind, size))
    argv = (ctypes.c_void_p * max(1, len(slots)))(*[ctypes.addressof(s) for s in slots])
    dims = (ctypes.c_uint * 6)(*grid, *block)
    with lib.lock:
        rc = lib.gpucpu_launch(argv, dims, shared_bytes)
        err = lib.gpucpu_error().decode() if rc else ""
    if rc:
        raise (DeadlockError if err.startswith("deadlock") else HarnessError)(f"kernel {kernel_name}: {err}")
    for i, a, raw, off in buffers.values():
        data = raw[off:off + a.nbytes]
        g = np.resize(_guard(i), raw.size)
        outside = np.count_nonzero(raw[:off] != g[:off]) + np.count_nonzero(raw[off + a.nbytes:] != g[off + a.nbytes:])
        if outside:
            raise HarnessError(f"kernel {kernel_name} wrote {outside} byte(s) outside array argument {i} "
                               f"(shape {a.shape}, {a.dtype})")
        if a.flags.writeable:
            a.reshape(-1).view(np.uint8)[:] = data
        elif not np.array_equal(a.reshape(-1).view(np.uint8), data):
            raise HarnessError(f"kernel {kernel_name} wrote to read-only array argument {i}")
