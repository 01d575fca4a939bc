"""Handwritten CUDA and HIP kernels through every toolchain service: NVRTC (sm_80, sm_90) with
resource reports, hiprtc (gfx908, gfx90a), the CPU harness against numpy, and (gpu marker)
the driver launchers. Also: injected bugs must be caught, and compile errors must carry logs."""
from __future__ import annotations

import numpy as np
import pytest

from gir.backends.cuda.compiler import compile_cuda
from gir.backends.errors import CompileError, NoDeviceError
from gir.backends.harness.runner import HarnessError, run_kernel
from gir.backends.hip.compiler import compile_hip
from gir.backends.launcher_base import DeviceBuffer, Launcher, c_arg

i32, f32 = np.int32, np.float32

VEC_ADD = """
extern "C" __global__ void vec_add(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ c, int n) {
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (i + 3 < n) {  // aligned float4 body, scalar tail
    float4 x = reinterpret_cast<const float4*>(a)[i / 4], y = reinterpret_cast<const float4*>(b)[i / 4];
    reinterpret_cast<float4*>(c)[i / 4] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  } else {
    for (; i < n; ++i) c[i] = a[i] + b[i];
  }
}
"""

ROW_SUM = """
extern "C" __global__ void row_sum(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
  int row = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
  if (row >= rows) return;  // whole warps leave together
  float s = 0.0f;
  for (int c = lane; c < cols; c += WARP) s += x[row * cols + c];
  for (int o = WARP / 2; o > 0; o >>= 1) s += SHFL_XOR(s, o);
  if (lane == 0) y[row] = s;
}
"""

BLOCK_SUM = """
extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ partial, int n) {
  __shared__ float buf[256];
  int t = threadIdx.x;
  float s = 0.0f;
  for (int i = blockIdx.x * 256 + t; i < n; i += gridDim.x * 256) s += x[i];
  buf[t] = s;
  __syncthreads();
  for (int stride = 128; stride > 0; stride >>= 1) {
    if (t < stride) buf[t] += buf[t + stride];
    __syncthreads();
  }
  if (t == 0) partial[blockIdx.x] = buf[0];
}
"""

TRANSPOSE = """
#define TILE 32
extern "C" __global__ void transpose(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
  __shared__ float tile[TILE][TILE + 1];  // +1: no bank conflicts on the column read
  int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += blockDim.y)
    if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * cols + x];
  __syncthreads();
  x = blockIdx.y * TILE + threadIdx.x;
  y = blockIdx.x * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += blockDim.y)
    if (x < rows && y + j < cols) out[(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}
"""

RMS_NORM = """
extern "C" __global__ void rms_norm(const __half* __restrict__ x, const __half* __restrict__ w,
                                    __half* __restrict__ y, int rows, int cols, float eps) {
  int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
  if (row >= rows) return;
  const __half2* xr = reinterpret_cast<const __half2*>(x + row * cols);  // cols is even
  float ss = 0.0f;  // fp16 storage, fp32 accumulation
  for (int c = lane; c < cols / 2; c += WARP) {
    float2 v = __half22float2(xr[c]);
    ss += v.x * v.x + v.y * v.y;
  }
  for (int o = WARP / 2; o > 0; o >>= 1) ss += SHFL_XOR(ss, o);
  float r = rsqrtf(ss / cols + eps);
  for (int c = lane; c < cols; c += WARP)
    y[row * cols + c] = __float2half(__half2float(x[row * cols + c]) * r * __half2float(w[c]));
}
"""

PRELUDE = {
    "cuda": "#include <cuda_fp16.h>\n#define WARP 32\n#define SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, v, o)\n",
    "hip": "#include <hip/hip_runtime.h>\n#define WARP 64\n#define SHFL_XOR(v, o) __shfl_xor(v, o)\n",
}
WARP = {"cuda": 32, "hip": 64}


def source(body: str, dialect: str) -> str:
    return PRELUDE[dialect] + body


def case(name: str, dialect: str, rng):
    """(body, kernel, grid, block, args, expected {arg index: array}, tolerance)."""
    w = WARP[dialect]
    if name == "vec_add":
        n = 1003
        a, b = rng.standard_normal(n, f32), rng.standard_normal(n, f32)
        return VEC_ADD, name, (2,), (128,), [a, b, np.zeros(n, f32), i32(n)], {2: a + b}, 1e-6
    if name == "row_sum":
        rows, cols = 37, 300
        x = rng.standard_normal((rows, cols), f32)
        return ROW_SUM, name, (-(-rows * w // 256),), (256,), [x, np.zeros(rows, f32), i32(rows), i32(cols)], \
            {1: x.sum(1)}, 1e-4
    if name == "block_sum":
        n, grid = 10007, 7
        x = rng.standard_normal(n, f32)
        idx = np.arange(n)
        expect = np.array([x[(idx // 256) % grid == b].sum() for b in range(grid)], f32)
        return BLOCK_SUM, name, (grid,), (256,), [x, np.zeros(grid, f32), i32(n)], {1: expect}, 1e-4
    if name == "transpose":
        rows, cols = 70, 45
        x = rng.standard_normal((rows, cols), f32)
        return TRANSPOSE, name, (2, 3), (32, 8), [x, np.zeros((cols, rows), f32), i32(rows), i32(cols)], \
            {1: x.T}, 0.0
    if name == "rms_norm":
        rows, cols, eps = 19, 200, 1e-5
        x = rng.standard_normal((rows, cols)).astype(np.float16)
        wt = rng.standard_normal(cols).astype(np.float16)
        xf = x.astype(f32)
        expect = (xf / np.sqrt((xf * xf).mean(1, keepdims=True) + eps) * wt.astype(f32)).astype(np.float16)
        return RMS_NORM, name, (-(-rows // 4),), (4 * w,), \
            [x, wt, np.zeros((rows, cols), np.float16), i32(rows), i32(cols), f32(eps)], {2: expect}, 2e-3
    raise KeyError(name)


KERNELS = ["vec_add", "row_sum", "block_sum", "transpose", "rms_norm"]
STATIC_SHARED = {"block_sum": 256 * 4, "transpose": 32 * 33 * 4}


def check(args, expected, tol):
    for i, want in expected.items():
        got = args[i]
        np.testing.assert_allclose(got.astype(f32), want.astype(f32), rtol=tol, atol=tol)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", KERNELS)
def test_nvrtc_compiles_with_resource_report(name, arch):
    body, kernel, *_ = case(name, "cuda", np.random.default_rng(0))
    binary = compile_cuda(source(body, "cuda"), arch, name=f"{name}.cu")
    assert binary.cubin and f".target {arch}" in binary.ptx
    res = binary.resources[kernel]
    assert 0 < res.registers <= 255 and not res.spilled and res.stack_bytes == 0
    assert res.shared_bytes == STATIC_SHARED.get(name, 0)


@pytest.mark.parametrize("arch", ["gfx908", "gfx90a"])
@pytest.mark.parametrize("name", KERNELS)
def test_hiprtc_compiles_with_resource_report(name, arch):
    body, kernel, *_ = case(name, "hip", np.random.default_rng(0))
    binary = compile_hip(source(body, "hip"), arch, name=f"{name}.hip")
    assert binary.code[:4] == b"\x7fELF"
    res = binary.resources[kernel]
    assert res.vgprs > 0 and res.sgprs > 0 and not res.spilled and res.wavefront_size == 64
    assert res.lds_bytes == STATIC_SHARED.get(name, 0) and res.scratch_bytes == 0


@pytest.mark.parametrize("dialect", ["cuda", "hip"])
@pytest.mark.parametrize("name", KERNELS)
def test_harness_matches_numpy(name, dialect):
    body, kernel, grid, block, args, expected, tol = case(name, dialect, np.random.default_rng(1))
    run_kernel(source(body, dialect), kernel, grid, block, args, dialect=dialect)
    check(args, expected, tol)


def test_injected_off_by_one_read_is_detected():
    body, kernel, grid, block, args, expected, tol = case("row_sum", "cuda", np.random.default_rng(2))
    bad = body.replace("x[row * cols + c]", "x[row * cols + c + 1]")
    run_kernel(source(bad, "cuda"), kernel, grid, block, args)
    with pytest.raises(AssertionError):
        check(args, expected, tol)


def test_injected_off_by_one_write_is_detected():
    body, kernel, grid, block, args, *_ = case("vec_add", "cuda", np.random.default_rng(3))
    bad = body.replace("i < n; ++i", "i <= n; ++i")
    with pytest.raises(HarnessError, match="outside array argument 2"):
        run_kernel(source(bad, "cuda"), kernel, grid, block, args)


BROKEN = 'extern "C" __global__ void broken(float* x) { x[threadIdx.x] = undefined_name; }'


@pytest.mark.parametrize("compile_fn, target", [
    (lambda s: compile_cuda(s, "sm_90", name="broken.cu"), "sm_90"),
    (lambda s: compile_hip(s, "gfx90a", name="broken.hip"), "gfx90a"),
    (lambda s: run_kernel(s, "broken", (1,), (32,), [np.zeros(32, f32)]), "g++"),
])
def test_compile_error_carries_log(compile_fn, target):
    with pytest.raises(CompileError) as info:
        compile_fn(BROKEN)
    first, *rest = str(info.value).splitlines()
    assert "broken" in first and target in first
    assert "undefined_name" in "\n".join(rest) and "undefined_name" in info.value.log


class HarnessDevice(Launcher):
    """The Launcher interface over host memory and the CPU harness: checks the shared
    upload/launch/download flow and argument packing that the GPU launchers inherit."""

    def __init__(self):
        self.mem: dict[int, np.ndarray] = {}

    def load(self, binary, kernel_name):
        return binary, kernel_name

    def alloc(self, nbytes):
        buf = np.zeros(nbytes, np.uint8)
        self.mem[buf.ctypes.data] = buf
        return DeviceBuffer(buf.ctypes.data, nbytes)

    def free(self, buf):
        del self.mem[buf.ptr]

    def upload(self, buf, array):
        self.mem[buf.ptr][:] = array.reshape(-1).view(np.uint8)

    def download(self, buf, array):
        array.reshape(-1).view(np.uint8)[:] = self.mem[buf.ptr]

    def launch(self, kernel, grid, block, shared_bytes, args):
        packed = [c_arg(i, a) for i, a in enumerate(args)]  # what a GPU launcher would pass
        arrays = [self.mem[a.ptr] if isinstance(a, DeviceBuffer) else p for a, p in zip(args, packed)]
        run_kernel(source(kernel[0], "cuda"), kernel[1], grid, block, arrays, shared_bytes=shared_bytes)

    def synchronize(self):
        pass


def test_launcher_interface_round_trip():
    device = HarnessDevice()
    body, kernel, grid, block, args, expected, tol = case("transpose", "cuda", np.random.default_rng(5))
    device.run(device.load(body, kernel), grid, block, args)
    check(args, expected, tol)
    assert not device.mem
    with pytest.raises(TypeError, match="explicit C type"):
        device.run(device.load(body, kernel), grid, block, args[:2] + [70, 45])


# ---- real GPUs (skipped where none is present) -------------------------------------------------
def _launcher(module):
    try:
        return module.Launcher()
    except NoDeviceError as e:
        pytest.skip(str(e))


@pytest.mark.gpu
@pytest.mark.parametrize("name", KERNELS)
def test_cuda_launcher_matches_numpy(name):
    from gir.backends.cuda import launcher as cuda_launcher
    launcher = _launcher(cuda_launcher)
    body, kernel, grid, block, args, expected, tol = case(name, "cuda", np.random.default_rng(4))
    fn = launcher.load(compile_cuda(source(body, "cuda"), launcher.arch), kernel)
    launcher.run(fn, grid, block, args)
    check(args, expected, tol)


@pytest.mark.gpu
@pytest.mark.parametrize("name", KERNELS)
def test_hip_launcher_matches_numpy(name):
    from gir.backends.hip import launcher as hip_launcher
    launcher = _launcher(hip_launcher)
    if launcher.arch is None:
        pytest.skip("cannot read the AMD GPU's architecture")
    body, kernel, grid, block, args, expected, tol = case(name, "hip", np.random.default_rng(4))
    fn = launcher.load(compile_hip(source(body, "hip"), launcher.arch), kernel)
    launcher.run(fn, grid, block, args)
    check(args, expected, tol)


def test_launchers_without_device_raise_no_device_error():
    from gir.backends.cuda import launcher as cuda_launcher
    from gir.backends.hip import launcher as hip_launcher
    for module in (cuda_launcher, hip_launcher):
        try:
            module.Launcher().close()
        except NoDeviceError as e:
            assert len(str(e).splitlines()) == 1
