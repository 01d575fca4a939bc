"""Launch HIP code objects through hip-python (hipModuleLoadData, hipModuleLaunchKernel), and
GEMMs through hipBLAS (hip-python's `hip.hipblas`).

Why hip-python: pip-installable (the `gir[rocm]` extra) and already our hiprtc binding.
Arguments go through its `extra` packing (HIP_LAUNCH_PARAM_BUFFER_POINTER), which every ROCm
version supports. Without a HIP runtime or an AMD GPU the constructor raises NoDeviceError, so
callers can skip cleanly. The runtime's work goes on one stream (copies, launches, GEMMs) and
a run waits once. hipBLAS is loaded only when a plan has library ops; where ROCm's hipblas
library is missing (Debian 12's ROCm 5.2 ships none) that is one LibraryUnavailable line.
Not yet run on an AMD GPU: the GEMM path is checked in CI through the recording stand-in's
cuBLAS conventions, which hipBLAS shares (column-major, same argument order).
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..errors import LibraryUnavailable, NoDeviceError
from ..launcher_base import DeviceBuffer, Launcher, c_arg, dims3
from .compiler import HipBinary

HIPBLAS_HOWTO = ("hipBLAS (libhipblas.so) is not installed, and GEMMs and convolutions run on it: install ROCm's "
                 "hipblas package from repo.radeon.com (Debian 12's ROCm 5.2 has none) or put its lib folder on "
                 "LD_LIBRARY_PATH")


def check_hipblas():
    """hip.hipblas with its library loaded: a handle; LibraryUnavailable (one line) otherwise."""
    try:
        from hip import hipblas
    except ImportError:
        raise LibraryUnavailable("hip-python is not installed: pip install 'gir[rocm]'") from None
    try:
        err, handle = hipblas.hipblasCreate()
    except RuntimeError as e:  # hip-python could not dlopen libhipblas.so
        raise LibraryUnavailable(f"{HIPBLAS_HOWTO} ({str(e).splitlines()[0]})") from None
    if err != hipblas.hipblasStatus_t.HIPBLAS_STATUS_SUCCESS:
        raise LibraryUnavailable(f"hipBLAS could not start: hipblasCreate returned {err.name}")
    return handle


def _hip():
    try:
        from hip import hip
    except ImportError:
        raise NoDeviceError("hip-python is not installed: run scripts/setup.sh") from None
    return hip


class HipLauncher(Launcher):
    def __init__(self, device: int = 0):
        h = self._h = _hip()
        try:
            (err,) = h.hipInit(0)
            err2, count = h.hipGetDeviceCount()
        except RuntimeError as e:  # hip-python could not dlopen libamdhip64.so
            raise NoDeviceError(f"no HIP runtime here ({e}): kernels compile but cannot be launched") from None
        if err != h.hipError_t.hipSuccess or err2 != h.hipError_t.hipSuccess or count <= device:
            raise NoDeviceError(f"no usable HIP device {device}: hipInit returned {err.name}")
        self._ck(h.hipSetDevice(device))
        try:  # hipDeviceProp_t's layout differs across ROCm releases: best effort
            props = h.hipDeviceProp_t()
            self._ck(h.hipGetDeviceProperties(props, device))
            self.arch = props.gcnArchName.decode().split(":")[0]
        except Exception:  # noqa: BLE001
            self.arch = None
        self._modules = []
        self._stream = self._ck(h.hipStreamCreate())
        self._blas = None

    def _ck(self, result):
        err = result[0]
        if err != self._h.hipError_t.hipSuccess:
            raise RuntimeError(f"HIP call failed: {err.name}")
        return result[1] if len(result) == 2 else None

    def load(self, binary, kernel_name: str):
        """`binary`: a HipBinary or code-object bytes."""
        code = binary.code if isinstance(binary, HipBinary) else bytes(binary)
        module = self._ck(self._h.hipModuleLoadData(code))
        self._modules.append((module, code))  # keep the image alive with its module
        return self._ck(self._h.hipModuleGetFunction(module, kernel_name.encode()))

    def alloc(self, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(int(self._ck(self._h.hipMalloc(nbytes))), nbytes)

    def free(self, buf: DeviceBuffer) -> None:
        self._ck(self._h.hipFree(buf.ptr))

    def upload(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        kind = self._h.hipMemcpyKind.hipMemcpyHostToDevice
        self._ck(self._h.hipMemcpy(buf.ptr, array.ctypes.data, array.nbytes, kind))

    def download(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        kind = self._h.hipMemcpyKind.hipMemcpyDeviceToHost
        self._ck(self._h.hipMemcpy(array.ctypes.data, buf.ptr, array.nbytes, kind))

    def launch(self, kernel, grid, block, shared_bytes: int, args: list) -> None:
        extra = tuple(c_arg(i, a) for i, a in enumerate(args))
        self._ck(self._h.hipModuleLaunchKernel(kernel, *dims3(grid), *dims3(block), shared_bytes, self._stream,
                                               None, extra))

    def synchronize(self) -> None:
        self._ck(self._h.hipDeviceSynchronize())

    # -- stream-ordered work of the device runtime --------------------------------------------
    library = "hipblas"

    def check_library(self) -> None:
        if self._blas is None:
            from hip import hipblas
            handle = check_hipblas()
            if hipblas.hipblasSetStream(handle, self._stream)[0] != hipblas.hipblasStatus_t.HIPBLAS_STATUS_SUCCESS:
                raise LibraryUnavailable("hipBLAS: hipblasSetStream failed")
            self._blas = (hipblas, handle)

    def gemm(self, g) -> None:
        hipblas, handle = self._blas
        op = {False: hipblas.hipblasOperation_t.HIPBLAS_OP_N, True: hipblas.hipblasOperation_t.HIPBLAS_OP_T}
        if g.dtype == "float64":
            scale = np.array([g.alpha, g.beta], np.float64)
            err = hipblas.hipblasDgemmStridedBatched(handle, op[g.transa], op[g.transb], g.m, g.n, g.k, scale[0:1],
                                                     g.a, g.lda, g.stride_a, g.b, g.ldb, g.stride_b, scale[1:2],
                                                     g.c, g.ldc, g.stride_c, g.batch)
        else:  # float32, or float16/bfloat16 accumulating in float32
            scale = np.array([g.alpha, g.beta], np.float32)
            t = {"float16": hipblas.hipblasDatatype_t.HIPBLAS_R_16F, "bfloat16": hipblas.hipblasDatatype_t.HIPBLAS_R_16B}.get(
                g.dtype, hipblas.hipblasDatatype_t.HIPBLAS_R_32F)
            err = hipblas.hipblasGemmStridedBatchedEx(
                handle, op[g.transa], op[g.transb], g.m, g.n, g.k, scale[0:1], g.a, t, g.lda, g.stride_a, g.b, t,
                g.ldb, g.stride_b, scale[1:2], g.c, t, g.ldc, g.stride_c, g.batch,
                hipblas.hipblasDatatype_t.HIPBLAS_R_32F, hipblas.hipblasGemmAlgo_t.HIPBLAS_GEMM_DEFAULT)
        err = err[0] if isinstance(err, tuple) else err
        if err != hipblas.hipblasStatus_t.HIPBLAS_STATUS_SUCCESS:
            raise RuntimeError(f"hipBLAS GEMM failed: {err.name} ({g})")

    def host_array(self, nbytes: int) -> np.ndarray:
        ptr = self._ck(self._h.hipHostMalloc(max(1, nbytes), 0))
        self._pinned = getattr(self, "_pinned", []) + [ptr]
        return np.ctypeslib.as_array((ctypes.c_uint8 * max(1, nbytes)).from_address(int(ptr)))[:nbytes]

    def copy_in(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        kind = self._h.hipMemcpyKind.hipMemcpyHostToDevice
        self._ck(self._h.hipMemcpyAsync(buf.ptr, array.ctypes.data, array.nbytes, kind, self._stream))

    def copy_out(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        kind = self._h.hipMemcpyKind.hipMemcpyDeviceToHost
        self._ck(self._h.hipMemcpyAsync(array.ctypes.data, buf.ptr, array.nbytes, kind, self._stream))

    def sync(self) -> None:
        self._ck(self._h.hipStreamSynchronize(self._stream))

    def close(self) -> None:
        self._h.hipStreamSynchronize(self._stream)
        if self._blas is not None:
            hipblas, handle = self._blas
            hipblas.hipblasDestroy(handle)
            self._blas = None
        for ptr in getattr(self, "_pinned", []):
            self._h.hipHostFree(ptr)
        self._pinned = []
        for module, _ in self._modules:
            self._h.hipModuleUnload(module)
        self._modules.clear()
        self._h.hipStreamDestroy(self._stream)


Launcher = HipLauncher  # the backend-neutral name callers use
