"""Launch HIP code objects through hip-python (hipModuleLoadData, hipModuleLaunchKernel).

Why hip-python: pip-installable and already our hiprtc binding. Arguments go through its
`extra` packing (HIP_LAUNCH_PARAM_BUFFER_POINTER), which every ROCm version supports. Without a
HIP runtime or an AMD GPU the constructor raises NoDeviceError, so callers can skip cleanly.
"""
from __future__ import annotations

import numpy as np

from ..errors import NoDeviceError
from ..launcher_base import DeviceBuffer, Launcher, c_arg, dims3
from .compiler import HipBinary


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
        self._ck(self._h.hipModuleLaunchKernel(kernel, *dims3(grid), *dims3(block), shared_bytes, None, None, extra))

    def synchronize(self) -> None:
        self._ck(self._h.hipDeviceSynchronize())

    def close(self) -> None:
        for module, _ in self._modules:
            self._h.hipModuleUnload(module)
        self._modules.clear()


Launcher = HipLauncher  # the backend-neutral name callers use
