"""A recording stand-in for a GPU: the Launcher interface with device memory in host arrays,
every call recorded, so CI checks what the device runtime would do on a GPU (tests only).

- Memory: each allocation is a host byte array, filled with 0xFF (NaN as floats) as fresh
  device memory is not zero; pointers are the arrays' addresses, and every use of a pointer
  (launch argument, GEMM operand, copy) must lie inside one live allocation.
- Kernel launches run the emitted CUDA/HIP source on the CPU harness (gpu_on_cpu.h): the
  module is built once as one library with an entry per kernel, called on the stand-in's
  memory directly (a launch frees its fiber stacks at its end, as every harness launch does:
  each stack is two memory mappings of the 65,530 a process may hold). Guard bytes around
  each allocation catch writes past it.
- GEMMs run through blas.reference_gemm: numpy over the same column-major, leading-dimension
  and batch-stride conventions as cuBLAS, so argument-order and layout mistakes fail; with
  cuBLASLt's epilogue (bias per row of D, C read apart from D, then ReLU/GELU), whose kinds the
  stand-in offers as the library of its dialect does (`epilogue_kinds`: hipBLAS none).
- Convolutions (`conv_library`, on by default for the cuda dialect, as the CUDA launcher runs
  them in cuDNN where it is installed) run through dnn.reference_conv, cuDNN's NC* convention;
  `conv_bias=False` plays a cuDNN that cannot fuse the bias (the engine adds it by GEMM),
  `conv_refuses(conv)` one that has no engine for a shape (the engine uses im2col for it).
- Capture: between begin_capture and end_capture, launches and GEMMs are recorded into a
  graph and not executed (as CUDA stream capture); copies and syncs there are errors.
  replay(graph) executes it.
- `execute=False` records without computing (counts for full-size models).

`events` lists every call as (kind, details...); `mark()` and `since(mark)` delimit a run.
"""
from __future__ import annotations

import ctypes
import re
from collections import Counter
from types import SimpleNamespace

import numpy as np

from ..blas import LIBRARY_EPILOGUE_KINDS, check_gemm, reference_gemm
from ..dnn import check_conv, reference_conv
from ..launcher_base import DeviceBuffer, Launcher
from ..native_cache import cached_library
from . import runner

GUARD = 256  # poisoned bytes before and after every allocation
# a kernel's name after its bounds: __launch_bounds__(threads) or (threads, blocks per SM)
_KERNEL = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\([\d,\s]+\)\s*)?([A-Za-z_]\w*)\s*\(')


def _module_unit(source: str, names: list[str]) -> str:
    """The module's source, storage for its dynamic shared arrays, and per kernel a launch and
    a signature entry (a launch frees its fiber stacks itself: gpu_on_cpu.h)."""
    defs = {n: t for t, n in runner._EXTERN_SHARED.findall(source) + runner._HIP_DYN_SHARED.findall(source)}
    out = ['#line 1 "module.cu"', source, '#line 1 "gpucpu_module_wrapper.cpp"']
    out += [f"thread_local __attribute__((aligned(16))) {t} {n}[GPUCPU_DYN_SMEM_MAX / sizeof({t})];" for n, t in defs.items()]
    for name in names:
        out.append(f'extern "C" GPUCPU_API int gpucpu_launch_{name}(void** a, const unsigned* d, unsigned long long s) '
                   f"{{ return ::gpucpu::launch([](void** p) {{ ::gpucpu::invoke({name}, p); }}, a, d, s); }}")
        out.append(f'extern "C" GPUCPU_API int gpucpu_signature_{name}(int* out, int max) '
                   f"{{ return ::gpucpu::signature({name}, out, max); }}")
    out.append('extern "C" GPUCPU_API const char* gpucpu_error() { return ::gpucpu::g_err.c_str(); }')
    return "\n".join(out) + "\n"


def _bind(lib) -> None:
    lib.gpucpu_error.restype = ctypes.c_char_p


def module_library(source: str, dialect: str) -> ctypes.CDLL:
    names = _KERNEL.findall(source)
    return cached_library(f"{runner._toolchain_id()}\0{dialect}\0module", runner.CXX, runner.build_flags(dialect),
                          _module_unit(source, names), ".cpp", f"a module of {len(names)} kernels ({dialect}, "
                          f"CPU harness)", "the CPU (g++)", _bind)


class CaptureError(RuntimeError):
    """A call that CUDA stream capture forbids (a copy or a synchronisation) during capture."""


class RecordingLauncher(Launcher):
    supports_capture = True
    library = "recording stand-in (numpy, cuBLAS conventions)"

    def __init__(self, dialect: str = "cuda", execute: bool = True, capture: bool = True,
                 conv_library: bool | None = None, conv_bias: bool = True, conv_refuses=None):
        self.dialect, self.execute, self.supports_capture = dialect, execute, capture
        self.conv_library = (dialect == "cuda") if conv_library is None else conv_library
        self.conv_bias, self.conv_refuses = conv_bias, conv_refuses or (lambda conv: False)
        self.epilogue_kinds = LIBRARY_EPILOGUE_KINDS["cublaslt" if dialect == "cuda" else "hipblas"]
        self.allocations: dict[int, np.ndarray] = {}
        self._raw: dict[int, tuple[np.ndarray, int]] = {}
        self.events: list[tuple] = []
        self._capturing: list | None = None
        self.arch = None

    # -- bookkeeping ------------------------------------------------------------------------
    def mark(self) -> int:
        return len(self.events)

    def since(self, mark: int = 0) -> list[tuple]:
        return self.events[mark:]

    def counts(self, mark: int = 0) -> Counter:
        """Calls per kind since `mark`, graph replays expanded into what they launch."""
        c = Counter()
        for e in self.events[mark:]:
            c[e[0]] += 1
            if e[0] == "replay":
                for op in e[1]:
                    c[op[0]] += 1
        return c

    def copied_bytes(self, kind: str, mark: int = 0) -> int:
        return sum(e[2] for e in self.events[mark:] if e[0] == kind)

    def _memory(self, ptr: int, nbytes: int, what: str) -> np.ndarray:
        for base, a in self.allocations.items():
            if base <= ptr and ptr + nbytes <= base + a.nbytes:
                return a[ptr - base:ptr - base + nbytes]
        raise AssertionError(f"{what}: [{ptr:#x}, +{nbytes}) lies in no live device allocation")

    def view(self, buf: DeviceBuffer) -> np.ndarray:
        return self._memory(buf.ptr, buf.nbytes, "buffer")

    def typed_at(self, ptr: int, count: int, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if ptr % dtype.itemsize:
            raise AssertionError(f"library operand {ptr:#x} is not aligned to its {dtype} elements")
        return self._memory(ptr, count * dtype.itemsize, "library operand").view(dtype)

    # -- the Launcher interface ---------------------------------------------------------------
    def check_library(self) -> None:
        pass

    def open_conv(self):
        return "recording stand-in (numpy, cuDNN conventions)" if self.conv_library else None

    def prepare_conv(self, conv) -> bool:
        assert self.conv_library, "a library conv on a stand-in without one"
        self._no_capture("convolution planning")
        check_conv(conv)
        return None if self.conv_refuses(conv) else self.conv_bias

    def _conv(self, c):
        check_conv(c)
        if c.bias and not self.conv_bias:
            raise AssertionError("a conv with a bias the library was told it cannot fuse")
        if self.execute:
            reference_conv(c, self.typed_at)

    def _library_call(self, kind: str, call, execute) -> None:
        """A library call: recorded into the capture, or recorded and executed now."""
        if self._capturing is not None:
            self._capturing.append((kind, call))
        else:
            self.events.append((kind, call))
            execute(call)

    def conv(self, c):
        self._library_call("conv", c, self._conv)

    def load(self, binary, kernel_name):
        return binary.source, kernel_name

    def alloc(self, nbytes):
        raw = np.full(max(1, nbytes) + 2 * GUARD + 256, 0xFF, np.uint8)
        start = GUARD + (-(raw.ctypes.data + GUARD) % 256)  # 256-byte aligned, as cudaMalloc
        a = raw[start:start + max(1, nbytes)]
        self.allocations[a.ctypes.data] = a
        self._raw[a.ctypes.data] = (raw, start)
        self.events.append(("alloc", a.ctypes.data, nbytes))
        return DeviceBuffer(a.ctypes.data, nbytes)

    def free(self, buf):
        del self.allocations[buf.ptr], self._raw[buf.ptr]
        self.events.append(("free", buf.ptr, buf.nbytes))

    def _check_guards(self, what: str) -> None:
        for ptr, (raw, start) in self._raw.items():
            n = self.allocations[ptr].nbytes
            if (raw[:start] != 0xFF).any() or (raw[start + n:] != 0xFF).any():
                raise AssertionError(f"{what} wrote outside the {n}-byte allocation at {ptr:#x}")

    def _no_capture(self, what: str) -> None:
        if self._capturing is not None:
            raise CaptureError(f"{what} during stream capture")

    def upload(self, buf, array):
        self._no_capture("synchronous host-to-device copy")
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        self._memory(buf.ptr, data.nbytes, "upload")[:] = data
        self.events.append(("h2d", buf.ptr, data.nbytes, data.copy(), "sync"))

    def download(self, buf, array):
        self._no_capture("synchronous device-to-host copy")
        array.reshape(-1).view(np.uint8)[:] = self._memory(buf.ptr, array.nbytes, "download")
        self.events.append(("d2h", buf.ptr, array.nbytes, array.reshape(-1).view(np.uint8).copy(), "sync"))

    def copy_in(self, buf, array):
        self._no_capture("host-to-device copy")
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        self._memory(buf.ptr, data.nbytes, "copy_in")[:] = data
        self.events.append(("h2d", buf.ptr, data.nbytes, data.copy(), "async"))

    def copy_out(self, buf, array):
        self._no_capture("device-to-host copy")
        array.reshape(-1).view(np.uint8)[:] = self._memory(buf.ptr, array.nbytes, "copy_out")
        self.events.append(("d2h", buf.ptr, array.nbytes, array.reshape(-1).view(np.uint8).copy(), "async"))

    def _launch(self, kernel, grid, block, shared_bytes, args):
        for a in args:
            if not isinstance(a, DeviceBuffer):
                raise AssertionError(f"kernel {kernel[1]}: the runtime passes device buffers only, not {a!r}")
            self.view(a)
        if not self.execute:
            return
        source, name = kernel
        grid = (tuple(grid) if isinstance(grid, tuple) else (grid,)) + (1, 1)
        block = (tuple(block) if isinstance(block, tuple) else (block,)) + (1, 1)
        lib = module_library(source, self.dialect)
        signature = runner._signature(SimpleNamespace(gpucpu_signature=getattr(lib, f"gpucpu_signature_{name}")))
        if len(signature) != len(args) or any(kind != 1 for kind, _ in signature):
            raise AssertionError(f"kernel {name} takes {signature}, launched with {len(args)} pointers")
        argv = [ctypes.c_void_p(a.ptr) for a in args]
        slots = (ctypes.c_void_p * max(1, len(argv)))(*[ctypes.addressof(p) for p in argv])
        dims = (ctypes.c_uint * 6)(*grid[:3], *block[:3])
        fn = getattr(lib, f"gpucpu_launch_{name}")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong]
        with runner._lock:
            rc = fn(slots, dims, shared_bytes)
            err = lib.gpucpu_error().decode() if rc else ""
        if rc:
            raise (runner.DeadlockError if err.startswith("deadlock") else runner.HarnessError)(f"kernel {name}: {err}")
        self._check_guards(f"kernel {name}")

    def launch(self, kernel, grid, block, shared_bytes, args):
        op = ("launch", kernel[1], grid, block, shared_bytes, tuple(args), kernel)
        if self._capturing is not None:
            self._capturing.append(op)
        else:
            self.events.append(op[:6])
            self._launch(kernel, grid, block, shared_bytes, args)

    def _gemm(self, g):
        check_gemm(g)
        if self.execute:
            reference_gemm(g, self.typed_at)

    def gemm(self, g):
        self._library_call("gemm", g, self._gemm)

    def synchronize(self):
        self._no_capture("synchronisation")
        self.events.append(("sync", "device"))

    def sync(self):
        self._no_capture("synchronisation")
        self.events.append(("sync", "stream"))

    def begin_capture(self):
        if self._capturing is not None:
            raise CaptureError("capture already under way")
        self._capturing = []

    def end_capture(self):
        ops, self._capturing = tuple(self._capturing), None
        self.events.append(("capture", len(ops)))
        return ops

    def replay(self, graph):
        self._no_capture("graph launch")
        self.events.append(("replay", graph))
        for op in graph:
            if op[0] == "launch":
                self._launch(op[6], *op[2:6])
            elif op[0] == "conv":
                self._conv(op[1])
            else:
                self._gemm(op[1])


def harness_toolchain(backend: str):
    """In place of device._toolchain: the backend's emitter, a 'compiler' that keeps the
    source (the stand-in's load hands it to the CPU harness), no static shared limit."""
    if backend == "cuda":
        from ..cuda.emitter import CudaEmitter as emitter
    else:
        from ..hip.emitter import HipEmitter as emitter
    return emitter, lambda source, arch: SimpleNamespace(source=source, resources={}), None
