"""Launch CUDA kernels through the driver API (cuda.bindings.driver), GEMMs through cuBLASLt
(nvmath-python's raw bindings, the `gir[cuda]` extra).

Why the driver API: it loads NVRTC's cubin/PTX directly (cuModuleLoadData) and needs no CUDA
toolkit or pycuda build; cuda-bindings is already our NVRTC wheel. Without a driver or GPU the
constructor raises NoDeviceError, so callers (and the gpu-marked tests) can skip cleanly.

The device runtime's work goes on one stream: asynchronous copies from pinned host buffers,
kernel launches and cuBLASLt matmuls; the whole plan is captured once as a CUDA graph
(cuStreamBeginCapture .. cuGraphInstantiate) and each run replays it. cuBLASLt: one
descriptor set and heuristic algorithm per GEMM shape, planned before capture, a fixed
workspace, fp32 in COMPUTE_32F (no silent TF32), fp16 accumulating in fp32, host scalars.
A library matmul's epilogue is cuBLASLt's (blas.Gemm.epilogue: bias, ReLU, GELU; a residual
as C with beta = 1, C and D apart): the EPILOGUE attribute is part of the descriptor's key,
the bias pointer is set on the descriptor before each call (see `gemm`).
Convolutions go to cuDNN 9 through its Python frontend (`open_conv`, conv_library.py: one
graph per shape, no TF32 for fp32, planned before capture); without cuDNN, the engine runs
them as im2col + cuBLASLt. Run on an H100 (2026-11-25, results/bench_gpu.md): the seven zoo
models match onnxruntime, and the gpu-marked tests pass, epilogues and graph replay included.
CI checks the calls through the recording stand-in, which executes them with the libraries'
conventions.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..blas import LIBRARY_EPILOGUE_KINDS
from ..errors import LibraryUnavailable, NoDeviceError
from ..launcher_base import DeviceBuffer, Launcher, c_arg, dims3
from .compiler import CudaBinary
from .conv_library import CudnnConvolutions


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
        self._module_of: dict[int, tuple] = {}  # id(CudaBinary) -> (the binary, kept alive; its module)
        self._stream = self._ck(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING.value))
        self._lt = None
        self._convs = None  # CudnnConvolutions once open_conv was asked
        self._plans: dict = {}
        self._pinned: list = []
        self._graphs: list = []

    def _ck(self, result):
        err = result[0]
        if err != self._d.CUresult.CUDA_SUCCESS:
            name = self._d.cuGetErrorName(err)[1]
            raise RuntimeError(f"CUDA driver call failed: {name.decode() if name else err}")
        return result[1] if len(result) == 2 else result[1:] or None

    @property
    def stream_handle(self) -> int:
        """The launcher's stream as an integer (CUDA events, libraries that take a raw stream)."""
        return int(self._stream)

    def load(self, binary, kernel_name: str):
        """`binary`: a CudaBinary (its cubin when built for this GPU, else its PTX for the driver
        to JIT), cubin bytes, or PTX text. A CudaBinary is loaded as one module once, however
        many of its kernels are asked for (a module load of a large cubin takes milliseconds)."""
        if isinstance(binary, CudaBinary) and id(binary) in self._module_of:
            module = self._module_of[id(binary)][1]
        else:
            image = binary
            if isinstance(binary, CudaBinary):
                image = binary.cubin if binary.arch == self.arch else binary.ptx
            image = ctypes.create_string_buffer(image.encode() if isinstance(image, str) else bytes(image))
            module = self._ck(self._d.cuModuleLoadData(ctypes.addressof(image)))
            self._modules.append(module)
            if isinstance(binary, CudaBinary):
                self._module_of[id(binary)] = (binary, module)
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
        self._ck(self._d.cuLaunchKernel(kernel, *dims3(grid), *dims3(block), shared_bytes, self._stream,
                                        ctypes.addressof(params), 0))

    def synchronize(self) -> None:
        self._ck(self._d.cuCtxSynchronize())

    # -- stream-ordered work of the device runtime --------------------------------------------
    library = "cublaslt"
    supports_capture = True
    epilogue_kinds = LIBRARY_EPILOGUE_KINDS["cublaslt"]
    WORKSPACE = 32 << 20

    def check_library(self) -> None:
        if self._lt is not None:
            return
        try:
            from nvmath.bindings import cublasLt
        except ImportError as e:
            raise LibraryUnavailable(f"cuBLASLt bindings missing ({e}): pip install 'gir[cuda]'") from None
        try:
            handle = cublasLt.create()
        except Exception as e:  # noqa: BLE001 -- libcublasLt.so.13 not found, or no usable device
            raise LibraryUnavailable(f"cuBLASLt could not start ({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
                                     f"pip install 'gir[cuda]' installs nvidia-cublas") from None
        self.library = f"cublaslt {cublasLt.get_version()}"
        self._lt = (cublasLt, handle, self.alloc(self.WORKSPACE))

    @staticmethod
    def _key(g) -> tuple:
        """The shape and each pointer's alignment: cuBLASLt's heuristic assumes 256-byte
        aligned operands unless told less, and a batch loop's offsets can be less. C's is the
        lesser of C's and D's where they are apart."""
        align = [min(256, p & -p) if p else 256 for p in (g.a, g.b, g.c, g.c_in)]
        return g.shape_key + (align[0], align[1], min(align[2:]), align[2])

    def prepare_gemm(self, g) -> None:
        """Descriptors and the heuristic's first algorithm for this shape, once."""
        key = self._key(g)
        if key in self._plans:
            return
        import nvmath
        from nvmath.bindings import cublas
        lt, handle, workspace = self._lt
        types = {"float32": (nvmath.CudaDataType.CUDA_R_32F, cublas.ComputeType.COMPUTE_32F, np.float32),
                 "float16": (nvmath.CudaDataType.CUDA_R_16F, cublas.ComputeType.COMPUTE_32F, np.float32),
                 "bfloat16": (nvmath.CudaDataType.CUDA_R_16BF, cublas.ComputeType.COMPUTE_32F, np.float32),
                 "float64": (nvmath.CudaDataType.CUDA_R_64F, cublas.ComputeType.COMPUTE_64F, np.float64)}
        data, compute, scale = types[g.dtype]
        scale_type = nvmath.CudaDataType.CUDA_R_64F if scale is np.float64 else nvmath.CudaDataType.CUDA_R_32F
        desc = lt.matmul_desc_create(int(compute), int(scale_type))

        def put(setter, dtype_of, obj, attr, value):
            buf = np.asarray(value, dtype=dtype_of(attr))
            setter(obj, attr, buf.ctypes.data, buf.nbytes)
        for attr, trans in ((lt.MatmulDescAttribute.TRANSA, g.transa), (lt.MatmulDescAttribute.TRANSB, g.transb)):
            put(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc, attr,
                int(cublas.Operation.T if trans else cublas.Operation.N))
        if g.epilogue != 1:  # bias in D's type (BIAS_DATA_TYPE's default), added before the activation
            put(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc,
                lt.MatmulDescAttribute.EPILOGUE, g.epilogue)
        if g.bias:
            put(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc,
                lt.MatmulDescAttribute.BIAS_POINTER, g.bias)
        layouts = []
        for rows, cols, ld, stride in (((g.k, g.m) if g.transa else (g.m, g.k)) + (g.lda, g.stride_a),
                                       ((g.n, g.k) if g.transb else (g.k, g.n)) + (g.ldb, g.stride_b),
                                       (g.m, g.n, g.ldc, g.stride_c)):
            layout = lt.matrix_layout_create(int(data), rows, cols, ld)
            if g.batch > 1:
                for attr, value in ((lt.MatrixLayoutAttribute.BATCH_COUNT, g.batch),
                                    (lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, stride)):
                    put(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, layout, attr, value)
            layouts.append(layout)
        pref = lt.matmul_preference_create()
        put(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref,
            lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, self.WORKSPACE)
        P = lt.MatmulPreferenceAttribute
        for attr, alignment in zip((P.MIN_ALIGNMENT_A_BYTES, P.MIN_ALIGNMENT_B_BYTES, P.MIN_ALIGNMENT_C_BYTES,
                                    P.MIN_ALIGNMENT_D_BYTES), key[-4:]):
            put(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref, attr, alignment)
        results, found = np.zeros(1, lt.matmul_heuristic_result_dtype), np.zeros(1, np.int32)
        a, b, c = layouts
        lt.matmul_algo_get_heuristic(handle, desc, a, b, c, c, pref, 1, results.ctypes.data, found.ctypes.data)
        lt.matmul_preference_destroy(pref)
        if not found[0]:
            raise RuntimeError(f"cuBLASLt has no algorithm for {g}")
        algo = results["algo"].copy()  # cublasLtMatmulAlgo_t: 8 x uint64
        self._plans[key] = (desc, a, b, c, algo, np.array([g.alpha, g.beta], scale))

    def gemm(self, g) -> None:
        """Enqueue `g`. Calls of one shape share a descriptor, so a bias pointer is written into
        it right before each call: cublasLtMatmul reads the descriptor when it enqueues (a
        captured graph keeps each call's pointer), and a key per bias pointer would plan the
        heuristic again for every layer of a model whose layers share shapes."""
        self.prepare_gemm(g)
        lt, handle, workspace = self._lt
        desc, a, b, c, algo, scale = self._plans[self._key(g)]
        if g.bias:
            ptr = np.asarray(g.bias, dtype=lt.get_matmul_desc_attribute_dtype(lt.MatmulDescAttribute.BIAS_POINTER))
            lt.matmul_desc_set_attribute(desc, lt.MatmulDescAttribute.BIAS_POINTER, ptr.ctypes.data, ptr.nbytes)
        lt.matmul(handle, desc, scale[0:].ctypes.data, g.a, a, g.b, b, scale[1:].ctypes.data, g.c_in or g.c, c, g.c, c,
                  algo.ctypes.data, workspace.ptr, self.WORKSPACE, int(self._stream))

    # -- convolutions in cuDNN (conv_library.py) ---------------------------------------------
    def open_conv(self) -> str | None:
        if self._convs is None:
            self._convs = CudnnConvolutions(int(self._stream), self.alloc)
        if self._convs.library is None:
            self.conv_note = self._convs.note
        return self._convs.library

    def prepare_conv(self, c) -> bool | None:
        return self._convs.prepare(c)

    def conv(self, c) -> None:
        self._convs.run(c)

    @property
    def conv_refusals(self) -> list[str]:
        return self._convs.refusals if self._convs else []

    def host_array(self, nbytes: int) -> np.ndarray:
        ptr = int(self._ck(self._d.cuMemAllocHost(max(1, nbytes))))
        self._pinned.append(ptr)
        return np.ctypeslib.as_array((ctypes.c_uint8 * max(1, nbytes)).from_address(ptr))[:nbytes]

    def copy_in(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        self._ck(self._d.cuMemcpyHtoDAsync(self._d.CUdeviceptr(buf.ptr), array.ctypes.data, array.nbytes, self._stream))

    def copy_out(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        self._ck(self._d.cuMemcpyDtoHAsync(array.ctypes.data, self._d.CUdeviceptr(buf.ptr), array.nbytes, self._stream))

    def sync(self) -> None:
        self._ck(self._d.cuStreamSynchronize(self._stream))

    def begin_capture(self) -> None:
        mode = self._d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._ck(self._d.cuStreamBeginCapture(self._stream, mode))

    def end_capture(self):
        graph = self._ck(self._d.cuStreamEndCapture(self._stream))
        executable = self._ck(self._d.cuGraphInstantiate(graph, 0))
        self._graphs.append((graph, executable))
        return executable

    def replay(self, graph) -> None:
        self._ck(self._d.cuGraphLaunch(graph, self._stream))

    def close(self) -> None:
        d = self._d
        d.cuStreamSynchronize(self._stream)
        for graph, executable in self._graphs:
            d.cuGraphExecDestroy(executable)
            d.cuGraphDestroy(graph)
        self._graphs.clear()
        if self._lt is not None:
            lt, handle, workspace = self._lt
            for desc, a, b, c, _, _ in self._plans.values():
                lt.matmul_desc_destroy(desc)
                for layout in (a, b, c):
                    lt.matrix_layout_destroy(layout)
            self._plans.clear()
            lt.destroy(handle)
            self.free(workspace)
            self._lt = None
        if self._convs is not None:
            self._convs.close(self.free)
            self._convs = None
        for ptr in self._pinned:
            d.cuMemFreeHost(ptr)
        self._pinned.clear()
        for module in self._modules:
            d.cuModuleUnload(module)
        self._modules.clear()
        self._module_of.clear()
        d.cuStreamDestroy(self._stream)
        d.cuDevicePrimaryCtxRelease(self._dev)


Launcher = CudaLauncher  # the backend-neutral name callers use
