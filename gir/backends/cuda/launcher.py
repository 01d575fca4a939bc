"""Launch CUDA kernels through the driver API (cuda.bindings.driver).

Why the driver API: it loads NVRTC's cubin/PTX directly (cuModuleLoadData) and needs no CUDA
toolkit or pycuda build; cuda-bindings is already our NVRTC wheel. Without a driver or GPU the
constructor raises NoDeviceError, so callers (and the gpu-marked tests) can skip cleanly.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..errors import NoDeviceError
from ..launcher_base import DeviceBuffer, Launcher, c_arg, dims3
from .compiler import CudaBinary


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        raise NoDeviceError("cuda-bindings is not installed: run scripts/setup.sh") from None
    return driver


class CudaLauncher(Launcher):
    def __init__(self, device: int = 0):
        d = self._d = _driver()
        try:
            (err,) = d.cuInit(0)
        except Exception as e:  # noqa: BLE001 -- cuda-bindings raises RuntimeError when libcuda.so.1 is absent
            raise NoDeviceError(f"no CUDA driver here ({e}): kernels compile but cannot be launched") from None
        if err != d.CUresult.CUDA_SUCCESS:
            raise NoDeviceError(f"no usable CUDA device: cuInit returned {err.name}")
        err, count = d.cuDeviceGetCount()
        if err != d.CUresult.CUDA_SUCCESS or count <= device:
            raise NoDeviceError(f"no CUDA device {device} ({count if not err else 0} present)")
        self._dev = self._ck(d.cuDeviceGet(device))
        self._ctx = self._ck(d.cuDevicePrimaryCtxRetain(self._dev))
        self._ck(d.cuCtxSetCurrent(self._ctx))
        attr = d.CUdevice_attribute
        major = self._ck(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._dev))
        minor = self._ck(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._dev))
        self.arch = f"sm_{major}{minor}"
        self._modules = []

    def _ck(self, result):
        err = result[0]
        if err != self._d.CUresult.CUDA_SUCCESS:
            name = self._d.cuGetErrorName(err)[1]
            raise RuntimeError(f"CUDA driver call failed: {name.decode() if name else err}")
        return result[1] if len(result) == 2 else result[1:] or None

    def load(self, binary, kernel_name: str):
        """`binary`: a CudaBinary (its cubin when built for this GPU, else its PTX for the driver
        to JIT), cubin bytes, or PTX text."""
        if isinstance(binary, CudaBinary):
            binary = binary.cubin if binary.arch == self.arch else binary.ptx
        image = ctypes.create_string_buffer(binary.encode() if isinstance(binary, str) else bytes(binary))
        module = self._ck(self._d.cuModuleLoadData(ctypes.addressof(image)))
        self._modules.append(module)
        return self._ck(self._d.cuModuleGetFunction(module, kernel_name.encode()))

    def alloc(self, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(int(self._ck(self._d.cuMemAlloc(nbytes))), nbytes)

    def free(self, buf: DeviceBuffer) -> None:
        self._ck(self._d.cuMemFree(self._d.CUdeviceptr(buf.ptr)))

    def upload(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        self._ck(self._d.cuMemcpyHtoD(self._d.CUdeviceptr(buf.ptr), array.ctypes.data, array.nbytes))

    def download(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        self._ck(self._d.cuMemcpyDtoH(array.ctypes.data, self._d.CUdeviceptr(buf.ptr), array.nbytes))

    def launch(self, kernel, grid, block, shared_bytes: int, args: list) -> None:
        objs = [c_arg(i, a) for i, a in enumerate(args)]
        params = (ctypes.c_void_p * max(1, len(objs)))(*[ctypes.addressof(o) for o in objs])
        if shared_bytes > 48 * 1024:  # above 48 KiB dynamic shared memory is opt-in
            attr = self._d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self._ck(self._d.cuFuncSetAttribute(kernel, attr, shared_bytes))
        self._ck(self._d.cuLaunchKernel(kernel, *dims3(grid), *dims3(block), shared_bytes, 0,
                                        ctypes.addressof(params), 0))

    def synchronize(self) -> None:
        self._ck(self._d.cuCtxSynchronize())

    def close(self) -> None:
        for module in self._modules:
            self._d.cuModuleUnload(module)
        self._modules.clear()
        self._d.cuDevicePrimaryCtxRelease(self._dev)


Launcher = CudaLauncher  # the backend-neutral name callers use
