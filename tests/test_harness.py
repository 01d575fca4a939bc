"""The CPU harness's semantics: shuffle/vote lane rules in both warp sizes, fp16 rounding,
dynamic shared memory, 3-D indexing, atomics across parallel blocks, and clear errors (never a
hang) for barrier misuse and bad arguments."""
from __future__ import annotations

import faulthandler
import os

import numpy as np
import pytest

from gir.backends.cuda.compiler import compile_cuda
from gir.backends.harness.runner import DeadlockError, HarnessError, run_kernel

FULL = {"cuda": "0xffffffffu, ", "hip": ""}
SUFFIX = {"cuda": "_sync", "hip": ""}


def shuffle_source(dialect: str) -> str:
    m, s = FULL[dialect], SUFFIX[dialect]
    ballot = "(unsigned)__ballot_sync(0xffffffffu, t % 3 == 0)" if dialect == "cuda" else "(unsigned)__ballot(t % 3 == 0)"
    return f"""
extern "C" __global__ void shuffles(int* idx, float* xr, int* down, int* up, unsigned* vote, int* anyall) {{
  int t = threadIdx.x;
  idx[t] = __shfl{s}({m}t * 10, 3, 16);
  xr[t] = __shfl_xor{s}({m}t + 0.5f, 5, 8);
  down[t] = __shfl_down{s}({m}t, 3, 16);
  up[t] = __shfl_up{s}({m}t, 2);
  vote[t] = {ballot};
  anyall[t] = __any{s}({m}t == 7) + 2 * __all{s}({m}t >= 0) + 4 * __all{s}({m}t != 1);
}}
"""


@pytest.mark.parametrize("dialect, warp", [("cuda", 32), ("hip", 64)])
def test_shuffle_and_vote_lane_rules(dialect, warp):
    check_shuffles(dialect, warp, 128)
    if dialect == "cuda":  # the harness accepts what NVRTC accepts
        compile_cuda(shuffle_source(dialect), "sm_90")


def test_kernel_libraries_keep_separate_state():
    """Wave-64 then warp-32 1024-thread blocks: each library has its own fiber pool and warps."""
    check_shuffles("hip", 64, 1024)
    check_shuffles("cuda", 32, 1024)


def check_shuffles(dialect, warp, n):
    t = np.arange(n)
    lane, base = t % warp, t - t % warp
    out = [np.zeros(n, np.int32), np.zeros(n, np.float32), np.zeros(n, np.int32), np.zeros(n, np.int32),
           np.zeros(n, np.uint32), np.zeros(n, np.int32)]
    src = shuffle_source(dialect)
    run_kernel(src, "shuffles", (1,), (n,), out, dialect=dialect)
    np.testing.assert_array_equal(out[0], 10 * ((t & ~15) + 3))
    np.testing.assert_array_equal(out[1], (t ^ 5) + 0.5)
    np.testing.assert_array_equal(out[2], np.where((lane & 15) + 3 >= 16, t, t + 3))
    np.testing.assert_array_equal(out[3], np.where(lane < 2, t, t - 2))
    bits = [sum(1 << int(l) for l in range(min(warp, 32)) if (b + l) % 3 == 0) for b in base]
    np.testing.assert_array_equal(out[4], np.array(bits, np.uint32))
    has7 = (base == 0).astype(np.int32)  # only the first warp contains t == 7
    np.testing.assert_array_equal(out[5], has7 + 2 + 4 * (base != 0))


FP16 = """
#include <cuda_fp16.h>
extern "C" __global__ void fp16(const unsigned short* bits, float* widened, const float* f, unsigned short* narrowed, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    widened[i] = __half2float(__ushort_as_half(bits[i]));
    narrowed[i] = __half_as_ushort(__float2half(f[i]));
  }
}
"""


def test_fp16_conversions_round_like_numpy():
    bits = np.arange(65536, dtype=np.uint16)
    halves = bits.view(np.float16).astype(np.float32)
    rng = np.random.default_rng(0)
    mids = halves[np.isfinite(halves)][:-1] + np.diff(halves[np.isfinite(halves)]) / 2  # ties to even
    f = np.concatenate([rng.standard_normal(65536 // 2).astype(np.float32) * 10.0 ** rng.integers(-8, 6, 65536 // 2),
                        np.float32([65504, 65519.99, 65520, 1e9, -1e9, np.inf, -np.inf, np.nan, 2 ** -25, 2 ** -24]),
                        mids.astype(np.float32)])[:65536].astype(np.float32)
    widened, narrowed = np.zeros(65536, np.float32), np.zeros(65536, np.uint16)
    run_kernel(FP16, "fp16", (256,), (256,), [bits, widened, f, narrowed, 65536])
    np.testing.assert_array_equal(widened, halves)
    with np.errstate(over="ignore"):
        want = f.astype(np.float16)
    got = narrowed.view(np.float16)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)].view(np.uint16), want[~np.isnan(want)].view(np.uint16))


DYN_SHARED = """
extern "C" __global__ void dyn_sum(const float* x, float* out) {
  extern __shared__ __align__(16) float smem[];
  int t = threadIdx.x, b = blockIdx.x;
  smem[t] = x[b * blockDim.x + t];
  __syncthreads();
  if (t == 0) {
    float s = 0.0f;
    for (int i = 0; i < blockDim.x; ++i) s += smem[i];
    out[b] = s;
  }
}
"""


@pytest.mark.parametrize("dialect", ["cuda", "hip"])
def test_dynamic_shared_memory_is_per_block(dialect):
    x = np.random.default_rng(1).standard_normal((16, 96)).astype(np.float32)
    out = np.zeros(16, np.float32)
    run_kernel(DYN_SHARED, "dyn_sum", (16,), (96,), [x, out], dialect=dialect, shared_bytes=96 * 4)
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-5, atol=1e-5)


INDEX_3D = """
extern "C" __global__ void ids(int* out) {
  int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  int thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  int per = blockDim.x * blockDim.y * blockDim.z;
  out[block * per + thread] = blockIdx.x + 10 * blockIdx.y + 100 * blockIdx.z
                            + 1000 * (threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z);
  atomicAdd(out + gridDim.x * gridDim.y * gridDim.z * per, 1);
}
"""


def test_3d_indices_and_atomics_across_parallel_blocks():
    grid, block = (3, 2, 2), (4, 3, 2)
    out = np.zeros(12 * 24 + 1, np.int32)
    run_kernel(INDEX_3D, "ids", grid, block, [out])
    bz, by, bx, tz, ty, tx = np.meshgrid(*(np.arange(d) for d in (2, 2, 3, 2, 3, 4)), indexing="ij")
    np.testing.assert_array_equal(out[:-1], (bx + 10 * by + 100 * bz + 1000 * (tx + 10 * ty + 100 * tz)).ravel())
    assert out[-1] == 12 * 24


def _run_with_watchdog(src, *args, **kw):
    """A regression to a hang fails the run (traceback, exit) instead of stalling CI."""
    faulthandler.dump_traceback_later(120, exit=True)
    try:
        run_kernel(src, *args, **kw)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.mark.parametrize("dialect", ["cuda", "hip"])
def test_barrier_in_divergent_branch_is_a_clear_error(dialect):
    src = 'extern "C" __global__ void k(float* x) {\n  if (threadIdx.x < 16) __syncthreads();\n  x[threadIdx.x] = 1.0f;\n}\n'
    with pytest.raises(DeadlockError) as info:
        _run_with_watchdog(src, "k", (2,), (64,), [np.zeros(64, np.float32)], dialect=dialect)
    msg = str(info.value)
    assert "deadlock" in msg and "16 thread(s) wait at __syncthreads() on line 2" in msg
    assert "48 thread(s) have exited" in msg and len(msg.splitlines()) == 1


def test_two_different_barriers_are_a_clear_error():
    src = """extern "C" __global__ void k(float* x) {
  if (threadIdx.x % 2) { __syncthreads(); x[threadIdx.x] = 1.0f; }
  else { __syncthreads(); x[threadIdx.x] = 2.0f; }
}"""
    with pytest.raises(HarnessError, match="divergent barrier"):
        _run_with_watchdog(src, "k", (1,), (64,), [np.zeros(64, np.float32)])


def test_shuffle_with_missing_lanes_is_a_clear_error():
    src = """extern "C" __global__ void k(float* x) {
  float v = x[threadIdx.x];
  if (threadIdx.x % 32 < 8) v += __shfl_xor_sync(0xffffffffu, v, 1);
  x[threadIdx.x] = v;
}"""
    with pytest.raises(DeadlockError, match=r"16 thread\(s\) wait at a warp shuffle on line 3.*48 thread\(s\) have exited"):
        _run_with_watchdog(src, "k", (1,), (64,), [np.zeros(64, np.float32)])


def test_trap_and_bad_arguments_are_clear_errors():
    trap = 'extern "C" __global__ void k(int* x, int n) { if (threadIdx.x == 5) __trap(); x[threadIdx.x] = n; }'
    x = np.zeros(32, np.int32)
    with pytest.raises(HarnessError, match=r"thread \(5,0,0\): __trap\(\) called"):
        run_kernel(trap, "k", (1,), (32,), [x, 1])
    with pytest.raises(HarnessError, match="takes 2 arguments"):
        run_kernel(trap, "k", (1,), (32,), [x])
    with pytest.raises(HarnessError, match="expects int32, got int64"):
        run_kernel(trap, "k", (1,), (32,), [x, np.int64(1)])
    with pytest.raises(HarnessError, match="expects int32, got float"):
        run_kernel(trap, "k", (1,), (32,), [x, 1.5])
    ro = np.zeros(32, np.int32)
    ro.flags.writeable = False
    with pytest.raises(HarnessError, match="read-only"):
        run_kernel(trap.replace("__trap();", ""), "k", (1,), (32,), [ro, 1])


def test_the_harness_builds_first_in_a_fresh_process(tmp_path):
    """The first native library of a process built for the harness, with an empty cache: the
    cache directory lookup imports the backends, whose CPU backend builds a library of its
    own on import; under the cache's lock that deadlocked (this test file run alone hung)."""
    import os
    import subprocess
    import sys
    script = ("from gir.backends.harness.runner import build\n"
              "src = 'extern \"C\" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }'\n"
              "build(src, 'k')\nprint('built')\n")
    env = os.environ | {"GIR_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and "built" in done.stdout, done.stderr[-2000:]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts Linux memory mappings")
def test_a_launch_gives_back_its_fiber_stacks():
    """Fiber stacks with their guard pages are two kernel mappings per fiber; kept after a launch
    in every loaded library, they reached Linux's 65,530-mapping limit within one test file, and
    the suite then failed to map libraries and numpy arrays (CI of stop 53)."""
    from gir.backends.harness.runner import build
    src = 'extern "C" __global__ void fill(float* y) { y[blockIdx.x * blockDim.x + threadIdx.x] = 2.0f; }'
    build(src, "fill")  # loaded before counting: a library's own mappings stay while it is loaded
    y = np.zeros(4 * 1024, np.float32)
    run_kernel(src, "fill", (1,), (32,), [y[:32]])  # starts the OpenMP threads (their stacks stay)
    before = _mappings()
    run_kernel(src, "fill", (4,), (1024,), [y])
    np.testing.assert_array_equal(y, 2.0)
    assert _mappings() - before < 64  # held, 1024 fibers on each OS thread were 2,048 mappings each


def _mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def test_the_harness_header_is_precompiled_and_a_refused_pch_falls_back(tmp_path, monkeypatch):
    """g++ reads gpu_on_cpu.h.gch beside the header it is told to include (1.6 -> 0.5 s for a
    one-line kernel); where the PCH cannot be built, the plain header is included instead."""
    from gir.backends.harness import precompiled, runner
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    flags = [*runner.FLAGS, "-DGPUCPU_WARP_SIZE=32", f"-I{runner.INCLUDE}", "-DGIR_TEST_PCH=1"]
    _, header = precompiled.include_flags(runner.CXX, flags, runner.HEADER, "test")
    assert header != str(runner.HEADER) and os.path.isfile(header + ".gch")
    assert os.path.commonpath([header, str(tmp_path)]) == str(tmp_path)
    refused = [*flags, "-fno-such-option-gir"]
    assert precompiled.include_flags(runner.CXX, refused, runner.HEADER, "test") == ["-include", str(runner.HEADER)]
