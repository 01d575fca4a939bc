"""CUDA C++ -> PTX + cubin with NVRTC, no GPU or driver needed.

Why NVRTC through cuda-bindings: it is a pip wheel (no CUDA toolkit install), it compiles
without a GPU, and `--ptxas-options=-v` reports registers, spills and shared memory, so CI can
check every emitted kernel's resource use. The CUDA family is pinned to 13.0 (pyproject.toml):
a newer NVRTC emits a PTX version the CUDA 13.0 ptxas and drivers reject.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from typing import Sequence

from gir.cache import Store

from ..errors import CompileError, ToolchainMissingError

_INSTALL = "run scripts/setup.sh (pip install -e '.[test]') to install cuda-bindings and the NVRTC wheels"


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one entry function. `registers`, `shared_bytes`, `stack_bytes`
    and `spilled` mean the same on every backend, so limits can be checked generically."""
    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    shared_bytes: int = 0       # static shared memory
    stack_bytes: int = 0        # local memory: stack frame
    barriers: int = 0

    @property
    def spilled(self) -> bool:
        return bool(self.spill_store_bytes or self.spill_load_bytes)


@dataclass(frozen=True)
class CudaBinary:
    arch: str
    ptx: str
    cubin: bytes
    log: str
    resources: dict[str, KernelResources] = field(default_factory=dict)  # by (lowered) kernel name


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise ToolchainMissingError(f"NVRTC is not available: {_INSTALL}") from None
    return nvrtc


@lru_cache(maxsize=None)
def cuda_include_dir() -> str | None:
    """The CUDA headers (cuda_fp16.h, ...) shipped by the nvidia-cuda-runtime wheel."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
        return find_nvidia_header_directory("cudart")
    except Exception:  # noqa: BLE001 -- no headers just means `#include <cuda_fp16.h>` fails with a log
        return None


def _check(nvrtc, result, what: str):
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC {what} failed: {nvrtc.nvrtcGetErrorString(err)[1].decode()}")
    return result[1] if len(result) > 1 else None


def _get_bytes(nvrtc, prog, size_fn, get_fn) -> bytes:
    n = _check(nvrtc, size_fn(prog), size_fn.__name__)
    buf = b" " * n
    _check(nvrtc, get_fn(prog, buf), get_fn.__name__)
    return buf


def compile_cuda(source: str, arch: str = "sm_90", *, name: str = "kernel.cu",
                 options: Sequence[str] = ()) -> CudaBinary:
    """Compile for one real architecture ("sm_80", "sm_90"); returns PTX, cubin and the
    per-kernel resource report. Raises CompileError carrying the NVRTC log. A source compiled
    before with the same NVRTC and options comes from the compile cache (gir/cache.py)."""
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"CUDA arch must look like 'sm_90', got {arch!r}")
    nvrtc = _nvrtc()
    opts = [f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v", *options]
    if inc := cuda_include_dir():
        opts.append(f"-I{inc}")
    store = Store("cuda", toolchain_version())
    key = (name, tuple(opts), source)
    if (built := store.get(key)) is None:
        built = store[key] = _nvrtc_compile(nvrtc, source, name, arch, opts)
    ptx, cubin, log = built
    return CudaBinary(arch, ptx, cubin, log, parse_ptxas_log(log))


@lru_cache(maxsize=None)
def toolchain_version() -> str:
    """NVRTC's version and the CUDA wheels' (NVRTC, headers): part of every cached binary's key."""
    _, major, minor = _nvrtc().nvrtcVersion()
    wheels = []
    for dist in ("nvidia-cuda-nvrtc", "nvidia-cuda-runtime"):
        try:
            wheels.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            wheels.append(f"{dist} absent")
    return f"NVRTC {major}.{minor} ({', '.join(wheels)})"


def _nvrtc_compile(nvrtc, source: str, name: str, arch: str, opts: list[str]) -> tuple[str, bytes, str]:
    """(PTX, cubin, log) of one NVRTC compilation."""
    prog = _check(nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "create")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _get_bytes(nvrtc, prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
        log = log.rstrip(b"\0").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"CUDA source {name!r}", arch, log or nvrtc.nvrtcGetErrorString(err)[1].decode())
        ptx = _get_bytes(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX).rstrip(b"\0").decode()
        cubin = _get_bytes(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return ptx, cubin, log


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FUNC = re.compile(r"Function properties for (\S+)")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas_log(log: str) -> dict[str, KernelResources]:
    """`ptxas -v` prints, per entry function: 'Compiling entry function', 'Function properties'
    with a stack/spill line (also for non-inlined device functions, which we skip), and a
    'Used N registers, ... N bytes smem' line whose fields vary by arch."""
    found: dict[str, dict] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = found.setdefault(m.group(1), {})
        elif m := _FUNC.search(line):
            props = found.get(m.group(1))
        elif (m := _PROPS.search(line)) and props is not None:
            props.update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                         spill_load_bytes=int(m.group(3)))
        elif (m := re.search(r"Used (\d+) registers", line)) and entry is not None:
            entry["registers"] = int(m.group(1))
            for key, pattern in (("shared_bytes", r"(\d+) bytes smem"), ("barriers", r"used (\d+) barriers")):
                if m := re.search(pattern, line):
                    entry[key] = int(m.group(1))
    return {name: KernelResources(**fields) for name, fields in found.items()}
