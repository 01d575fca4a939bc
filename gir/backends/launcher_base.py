"""The launch interface every GPU backend implements, and the argument packing they share.

Why one interface: the runtime and the GPU tests drive CUDA and HIP the same way (load a
compiled binary, move arrays, launch, synchronise). Scalars must carry an explicit C type
(np.int32(n), np.float32(x), ctypes.c_int(n)): on a GPU nothing checks the kernel's signature,
and a wrong width silently corrupts every later argument.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from .errors import LibraryUnavailable
from .kernels import allocate_dram, check_gather_flag, collect_outputs, gather_flags


@dataclass(frozen=True)
class DeviceBuffer:
    ptr: int
    nbytes: int


def c_arg(i: int, value):
    """The ctypes object whose bytes are the kernel parameter."""
    if isinstance(value, DeviceBuffer):
        return ctypes.c_void_p(value.ptr)
    if isinstance(value, (ctypes._SimpleCData, ctypes.Structure)):
        return value
    if isinstance(value, np.generic):
        if value.dtype.itemsize == 2 and value.dtype.kind in "fV":  # __half, __nv_bfloat16: no ctypes type, same bits
            return ctypes.c_uint16(int(value.view(np.uint16)))
        return np.ctypeslib.as_ctypes_type(value.dtype)(value.item())
    raise TypeError(f"kernel argument {i}: give scalars an explicit C type (np.int32(n), np.float32(x)); "
                    f"got {type(value).__name__}")


class Launcher:
    """load(binary, kernel_name) -> kernel; alloc/free/upload/download; launch; synchronize.

    The device runtime (gir/runtime/device.py) also uses the stream-ordered part: copy_in /
    copy_out (asynchronous copies on the launcher's one stream; synchronous here), launch and
    gemm enqueue on that stream, and sync() waits for all of it: one wait per run. A GEMM is
    a blas.Gemm on device pointers in cuBLAS's column-major convention, a convolution (where
    open_conv() names a library) a dnn.Conv in cuDNN's; check_library()
    raises LibraryUnavailable (one line: what is missing, how to get it) where the vendor
    library is not there, never a host fallback. begin_capture / end_capture / replay record
    the enqueued work once and launch it again as one graph (CUDA graphs) where supported."""

    arch: str | None = None  # the device's compile target, e.g. "sm_90" or "gfx90a"
    library: str = "none"    # the GEMM library, for messages ("cublaslt 13.0", "hipblas")
    supports_capture: bool = False
    # library-op epilogue kinds its GEMM library runs (blas.LIBRARY_EPILOGUE_KINDS); the device
    # engine refuses a plan whose matmuls carry others
    epilogue_kinds: frozenset = frozenset()

    def check_library(self) -> None:
        raise LibraryUnavailable(f"{type(self).__name__} has no GEMM library binding")

    def open_conv(self) -> str | None:
        """The convolution library (e.g. "cudnn 9.13.0") when library convolutions run in it
        here, else None: the engine then runs them as im2col + GEMM. `conv_note` says why not."""
        return None

    conv_note: str = "no convolution library binding"
    conv_refusals: tuple = ()  # convolution shapes (or bias fusions) the library had no engine for, and why

    def prepare_conv(self, conv) -> bool:
        """Plan a dnn.Conv's shape once, before any capture; True when the library call adds
        the bias itself (else the engine adds it with a GEMM)."""
        raise LibraryUnavailable(f"{type(self).__name__} has no convolution library binding")

    def conv(self, conv) -> None:
        raise LibraryUnavailable(f"{type(self).__name__} has no convolution library binding")

    def prepare_gemm(self, gemm) -> None:
        """Plan a Gemm's shape once (descriptors, algorithm), before any capture."""

    def gemm(self, gemm) -> None:
        raise LibraryUnavailable(f"{type(self).__name__} has no GEMM library binding")

    def host_array(self, nbytes: int) -> np.ndarray:
        """A host staging buffer for asynchronous copies (pinned memory where the API has it)."""
        return np.empty(nbytes, np.uint8)

    def copy_in(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        self.upload(buf, array)

    def copy_out(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        self.download(buf, array)

    def sync(self) -> None:
        self.synchronize()

    def begin_capture(self) -> None:
        raise NotImplementedError

    def end_capture(self):
        raise NotImplementedError

    def replay(self, graph) -> None:
        raise NotImplementedError

    def load(self, binary, kernel_name: str):
        raise NotImplementedError

    def alloc(self, nbytes: int) -> DeviceBuffer:
        raise NotImplementedError

    def free(self, buf: DeviceBuffer) -> None:
        raise NotImplementedError

    def upload(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        raise NotImplementedError

    def download(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        raise NotImplementedError

    def launch(self, kernel, grid, block, shared_bytes: int, args: list) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def run(self, kernel, grid, block, args: list, shared_bytes: int = 0) -> None:
        """Like the CPU harness's run_kernel: numpy arrays are uploaded, and downloaded back
        into the writeable ones after the kernel finished."""
        bufs: dict[int, DeviceBuffer] = {}
        try:
            for a in args:
                if isinstance(a, np.ndarray) and id(a) not in bufs:
                    bufs[id(a)] = self.alloc(max(a.nbytes, 1))
                    self.upload(bufs[id(a)], np.ascontiguousarray(a))
            self.launch(kernel, grid, block, shared_bytes,
                        [bufs[id(a)] if isinstance(a, np.ndarray) else a for a in args])
            self.synchronize()
            for a in args:
                if isinstance(a, np.ndarray) and a.flags.writeable:
                    self.download(bufs[id(a)], a)
        finally:
            for b in bufs.values():
                self.free(b)


def launch_graph(launcher: Launcher, built, graph, feeds: dict) -> dict:
    """Outputs of a compiled graph (a CompiledGraph) launched kernel by kernel on the
    launcher's device: every backend's `run` on real hardware."""
    arrays = allocate_dram(graph, feeds)
    flags = gather_flags(built.kernels)
    for k in built.kernels:
        launcher.run(launcher.load(built.binary, k.name), (k.num_blocks,), (k.block_threads,),
                     [arrays[b.name] for b in k.params] + ([flags[k.name]] if k.name in flags else []))
        if k.name in flags:
            check_gather_flag(k.name, flags[k.name])
    return collect_outputs(graph, arrays)


def dims3(shape) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    return (shape + (1, 1))[:3]
