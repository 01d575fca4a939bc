"""HIP source -> AMD GPU code object with hiprtc (through hip-python), no GPU needed.

Why this shape: Debian 12's ROCm 5.2 ships hiprtc inside libamdhip64.so.5, while hip-python
dlopens "libhiprtc.so"; pointing hip-python's loader at the real file before first use saves
users from LD_LIBRARY_PATH and symlinks. hiprtc 5.2 prints no resource remarks, so resource
use (VGPRs, SGPRs, spills, LDS, scratch) is read from the code object's AMDGPU metadata note.
"""
from __future__ import annotations

import ctypes.util
import os
import re
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

from gir.cache import Store

from ..errors import CompileError, ToolchainMissingError

_INSTALL = "run scripts/setup.sh (installs hip-python and Debian's ROCm 5.2 hiprtc packages)"
_CANDIDATES = ("/opt/rocm/lib/libhiprtc.so", "/usr/lib/x86_64-linux-gnu/libhiprtc.so.5",
               "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5", "/opt/rocm/lib/libamdhip64.so")


@dataclass(frozen=True)
class KernelResources:
    """From the AMDGPU metadata; `registers`, `shared_bytes`, `stack_bytes`, `spilled` mean
    what they mean for CUDA (registers are VGPRs: they bound occupancy)."""
    vgprs: int = 0
    sgprs: int = 0
    agprs: int = 0
    vgpr_spills: int = 0
    sgpr_spills: int = 0
    lds_bytes: int = 0          # static LDS (shared memory)
    scratch_bytes: int = 0      # private segment: stack and spills
    wavefront_size: int = 64

    registers = property(lambda self: self.vgprs)
    shared_bytes = property(lambda self: self.lds_bytes)
    stack_bytes = property(lambda self: self.scratch_bytes)
    spilled = property(lambda self: bool(self.vgpr_spills or self.sgpr_spills))


@dataclass(frozen=True)
class HipBinary:
    arch: str
    code: bytes                 # ELF code object, what hipModuleLoadData takes
    log: str
    resources: dict[str, KernelResources] = field(default_factory=dict)


def hiprtc_library() -> str | None:
    """The shared library that exports hiprtc: $GIR_HIPRTC_LIB, ROCm >= 6's libhiprtc, or 5.2's libamdhip64."""
    for path in (os.environ.get("GIR_HIPRTC_LIB"), *_CANDIDATES):
        if path and os.path.exists(path):
            return path
    return ctypes.util.find_library("hiprtc") or ctypes.util.find_library("amdhip64")


@lru_cache(maxsize=None)
def hiprtc_module():
    """hip-python's hiprtc module, loaded from the library hiprtc_library() finds."""
    try:
        from hip import chiprtc
    except ImportError:
        raise ToolchainMissingError(f"hip-python is not installed: {_INSTALL}") from None
    lib = hiprtc_library()
    if lib is None:
        raise ToolchainMissingError(f"hiprtc not found (no libhiprtc.so or libamdhip64.so.5): {_INSTALL}")
    chiprtc.DLL = lib.encode()  # read by hip-python's loader at its first hiprtc call
    from hip import hiprtc
    try:
        hiprtc.hiprtcVersion()
    except RuntimeError as e:
        raise ToolchainMissingError(f"hiprtc in {lib} cannot be loaded ({e}): {_INSTALL}") from None
    return hiprtc


def compile_hip(source: str, arch: str = "gfx90a", *, name: str = "kernel.hip",
                options: Sequence[str] = ()) -> HipBinary:
    """Compile for one AMD GPU ("gfx908", "gfx90a"); raises CompileError with the hiprtc log.
    Do not include hip/hip_fp16.h: hiprtc's built-in headers already define __half. A source
    compiled before with the same hiprtc and options comes from the compile cache (gir/cache.py)."""
    if not re.fullmatch(r"gfx[0-9a-f]+(:[a-z+-]+)*", arch):
        raise ValueError(f"HIP arch must look like 'gfx90a', got {arch!r}")
    hiprtc = hiprtc_module()
    opts = [f"--offload-arch={arch}", "-O3", "-std=c++17", *options]
    store = Store("hip", toolchain_version())
    key = (name, tuple(opts), source)
    if (built := store.get(key)) is None:
        built = store[key] = _hiprtc_compile(hiprtc, source, name, arch, opts)
    code, log = built
    return HipBinary(arch, code, log, code_object_resources(code))


@lru_cache(maxsize=None)
def toolchain_version() -> str:
    """hiprtc's version and the library it lives in: part of every cached code object's key."""
    _, major, minor = hiprtc_module().hiprtcVersion()
    return f"hiprtc {major}.{minor} ({os.path.realpath(hiprtc_library())})"


def _hiprtc_compile(hiprtc, source: str, name: str, arch: str, opts: list[str]) -> tuple[bytes, str]:
    """(code object, log) of one hiprtc compilation."""
    ok = hiprtc.hiprtcResult.HIPRTC_SUCCESS
    err, prog = hiprtc.hiprtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != ok:
        raise RuntimeError(f"hiprtcCreateProgram failed: {err}")
    try:
        (err,) = hiprtc.hiprtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, n = hiprtc.hiprtcGetProgramLogSize(prog)
        log = bytearray(n)
        if n:
            hiprtc.hiprtcGetProgramLog(prog, log)
        log = bytes(log).rstrip(b"\0").decode(errors="replace")
        log = re.sub(r"\S*/input/CompileSource", name, log)  # comgr's temp path -> our name
        if err != ok:
            raise CompileError(f"HIP source {name!r}", arch, log or str(err))
        _, n = hiprtc.hiprtcGetCodeSize(prog)
        code = bytearray(n)
        hiprtc.hiprtcGetCode(prog, code)
    finally:
        hiprtc.hiprtcDestroyProgram(prog.createRef())
    return _unbundle(bytes(code)), log


def _unbundle(blob: bytes) -> bytes:
    """Newer hiprtc returns a clang offload bundle; take its AMDGPU entry."""
    magic = b"__CLANG_OFFLOAD_BUNDLE__"
    if not blob.startswith(magic):
        return blob
    (count,), pos = struct.unpack_from("<Q", blob, len(magic)), len(magic) + 8
    for _ in range(count):
        offset, size, id_len = struct.unpack_from("<QQQ", blob, pos)
        ident, pos = blob[pos + 24:pos + 24 + id_len], pos + 24 + id_len
        if b"amdgcn" in ident and size:
            return blob[offset:offset + size]
    return blob


_KEYS = {".vgpr_count": "vgprs", ".sgpr_count": "sgprs", ".agpr_count": "agprs",
         ".vgpr_spill_count": "vgpr_spills", ".sgpr_spill_count": "sgpr_spills",
         ".group_segment_fixed_size": "lds_bytes", ".private_segment_fixed_size": "scratch_bytes",
         ".wavefront_size": "wavefront_size"}


def code_object_resources(elf: bytes) -> dict[str, KernelResources]:
    """Per-kernel resources from the NT_AMDGPU_METADATA note (msgpack) of a code object."""
    if elf[:4] != b"\x7fELF":
        return {}
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    out = {}
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", elf, shoff + i * shentsize + 4)
        offset, size = struct.unpack_from("<QQ", elf, shoff + i * shentsize + 0x18)
        if sh_type != 7:  # SHT_NOTE
            continue
        pos = offset
        while pos + 12 <= offset + size:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name_end = pos + 12 + (namesz + 3) // 4 * 4
            desc = elf[name_end:name_end + descsz]
            if ntype == 32 and elf[pos + 12:pos + 12 + namesz].rstrip(b"\0") == b"AMDGPU":
                meta = _msgpack(desc, 0)[0]
                for k in meta.get("amdhsa.kernels", []):
                    out[k[".name"]] = KernelResources(**{f: int(k[key]) for key, f in _KEYS.items() if key in k})
            pos = name_end + (descsz + 3) // 4 * 4
    return out


def _msgpack(b: bytes, i: int):
    """Just enough MessagePack to read AMDGPU metadata; returns (value, next offset)."""
    t = b[i]
    if t <= 0x7F or t >= 0xE0:
        return (t if t <= 0x7F else t - 0x100), i + 1
    if 0x80 <= t <= 0x9F:
        return _container(b, i + 1, t & 0x0F, t < 0x90)  # fixmap, fixarray
    if 0xA0 <= t <= 0xBF:
        n = t & 0x1F
        return b[i + 1:i + 1 + n].decode(), i + 1 + n
    simple = {0xC0: None, 0xC2: False, 0xC3: True}
    if t in simple:
        return simple[t], i + 1
    fixed = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
             0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
    if t in fixed:
        (v,) = struct.unpack_from(fixed[t], b, i + 1)
        return v, i + 1 + struct.calcsize(fixed[t])
    sized = {0xC4: (">B", "bin"), 0xC5: (">H", "bin"), 0xC6: (">I", "bin"), 0xD9: (">B", "str"),
             0xDA: (">H", "str"), 0xDB: (">I", "str"), 0xDC: (">H", "arr"), 0xDD: (">I", "arr"),
             0xDE: (">H", "map"), 0xDF: (">I", "map")}
    if t not in sized:
        raise ValueError(f"unsupported msgpack type 0x{t:02x} in AMDGPU metadata")
    fmt, kind = sized[t]
    (n,), i = struct.unpack_from(fmt, b, i + 1), i + 1 + struct.calcsize(fmt)
    if kind == "bin":
        return b[i:i + n], i + n
    if kind == "str":
        return b[i:i + n].decode(), i + n
    return _container(b, i, n, kind == "map")


def _container(b: bytes, i: int, n: int, is_map: bool):
    items = []
    for _ in range(n * (2 if is_map else 1)):
        v, i = _msgpack(b, i)
        items.append(v)
    return (dict(zip(items[::2], items[1::2])) if is_map else items), i
