"""Measured constants of the CPU the planner runs on (`gir calibrate`): the time model's figures
for the one target whose kernels GIR can time itself.

What is measured, each with the same compiler flags as the emitted kernels:
  - copy bandwidth, read + write bytes per second, with all threads and with one (a thread's
    stream is what its prefetchers sustain: the model's `unit_bandwidth`);
  - launch cost: an empty OpenMP parallel loop over the threads (fork and join);
  - issue rate: SIMD arithmetic on data already in L1, in unit-instructions per second;
  - dependent latency: GIR's own kernel for a sigmoid with one element per unit (nothing to
    overlap within a unit), as cycles per step of the time model's op costs (`perf.OP_COST`).
The result is stored as JSON in the compile cache ($GIR_CACHE_DIR/calibration/), keyed by the
CPU model and flags (`host_cpu`), so a cache folder shared between machines never hands one
machine another's figures. Plans made with it are cached under a key that holds the figures.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from gir.ir.target import Timing

FORMAT = 2
COPY_BYTES = 64 << 20      # per array: far above the last-level cache of any CPU we target
ISSUE_ELEMENTS = 2048      # 8 KiB: stays in L1
ISSUE_CHAIN = 64           # dependent-free FMAs per element and pass (unit-instructions: / SIMD width)

SOURCE = r"""
#include <omp.h>
void gir_cal_copy(float *restrict dst, const float *restrict src, long n, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < n; ++i) dst[i] = src[i];
}
void gir_cal_empty(float *restrict dst, long n) {
    /* as the emitted kernels launch: the default team, no num_threads clause (which made
       every call several times dearer with GNU OpenMP) */
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) dst[i] = (float)i;
}
void gir_cal_issue(float *restrict x, long n, int passes) {
    for (int p = 0; p < passes; ++p) {
        #pragma omp simd
        for (long i = 0; i < n; ++i) {
            float a = x[i], b = a * 0.5f, c = a * 0.25f, d = a * 0.125f;
            for (int k = 0; k < 16; ++k) { a = a * 0.999f + 0.001f; b = b * 0.999f + 0.001f;
                                           c = c * 0.999f + 0.001f; d = d * 0.999f + 0.001f; }
            x[i] = a + b + c + d;
        }
    }
}
"""


@dataclass(frozen=True)
class Calibration:
    cpu: str                 # host_cpu()'s model name
    threads: int
    copy_bandwidth: float    # bytes/s, read + write, all threads
    unit_bandwidth: float    # bytes/s, read + write, one thread
    launch_s: float          # one empty parallel loop
    issue_per_s: float       # unit-instructions per second, one thread
    dependent_cycles: float  # nominal-clock cycles per dependent step of the model's op costs
    measured_at: str
    format: int = FORMAT

    @property
    def timing(self) -> Timing:
        from .target import CPU_NOMINAL_TIMING
        return replace(CPU_NOMINAL_TIMING, issue_per_clock=self.issue_per_s / CPU_NOMINAL_TIMING.clock_hz,
                       unit_bandwidth=self.unit_bandwidth, dependent_cycles=self.dependent_cycles,
                       source=f"measured by `gir calibrate` on this CPU ({self.measured_at}); latency nominal")


def _path() -> Path:
    from gir.backends.cpu.compiler import host_cpu
    from gir.cache import cache_root
    return cache_root() / "calibration" / (hashlib.sha256(host_cpu().encode()).hexdigest()[:24] + ".json")


def stored() -> Calibration | None:
    """This CPU's stored calibration, or None (never measured, or unreadable: nominal figures)."""
    path = _path()
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _read(str(path), stamp)


@lru_cache(maxsize=8)
def _read(path: str, stamp: int) -> Calibration | None:
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT:
            return None
        return Calibration(**data)
    except (OSError, ValueError, TypeError):
        return None


def save(cal: Calibration) -> Path:
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(cal), indent=1) + "\n")
    tmp.replace(path)
    return path


def _best_of(fn, repeats: int) -> float:
    """Fastest of `repeats` timed calls: other processes only ever make a call slower."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(repeats: int = 7, progress=print) -> Calibration:
    from gir.backends.cpu.compiler import build, host_cpu
    lib = build(SOURCE, "calibration")
    lib.gir_cal_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    lib.gir_cal_empty.argtypes = [ctypes.c_void_p, ctypes.c_long]
    lib.gir_cal_issue.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    threads = os.cpu_count() or 1
    n = COPY_BYTES // 4
    src, dst = np.ones(n, np.float32), np.zeros(n, np.float32)
    scratch = np.zeros(max(threads, 1), np.float32)

    calls = 200  # first: a num_threads clause before it made the default team dearer to start
    lib.gir_cal_empty(scratch.ctypes.data, threads)
    launch = _best_of(lambda: [lib.gir_cal_empty(scratch.ctypes.data, threads) for _ in range(calls)], repeats) / calls

    def copy(t):
        return lambda: lib.gir_cal_copy(dst.ctypes.data, src.ctypes.data, n, t)
    copy(threads)()  # page faults
    all_bw = 2 * COPY_BYTES / _best_of(copy(threads), repeats)
    progress(f"copy, {threads} thread(s): {all_bw / 1e9:.1f} GB/s")
    one_bw = 2 * COPY_BYTES / _best_of(copy(1), repeats)
    progress(f"copy, 1 thread: {one_bw / 1e9:.1f} GB/s")
    progress(f"empty parallel loop: {launch * 1e6:.2f} us")
    x = np.full(ISSUE_ELEMENTS, 0.5, np.float32)
    passes = 200
    seconds = _best_of(lambda: lib.gir_cal_issue(x.ctypes.data, ISSUE_ELEMENTS, passes), repeats)
    simd = 8
    issue = passes * ISSUE_ELEMENTS / simd * (ISSUE_CHAIN * 2) / seconds  # mul + add each (or one FMA: counted as 2)
    progress(f"SIMD arithmetic, 1 thread: {issue / 1e9:.2f} G unit-instructions/s")
    dependent = _dependent_cycles(repeats, threads, launch)
    progress(f"dependent step (one element per unit): {dependent:.2f} cycles")
    return Calibration(cpu=host_cpu().split(" | ")[0], threads=threads, copy_bandwidth=all_bw,
                       unit_bandwidth=one_bw, launch_s=launch, issue_per_s=issue, dependent_cycles=dependent,
                       measured_at=time.strftime("%Y-%m-%d %H:%M"))


def _dependent_cycles(repeats: int, threads: int, launch: float) -> float:
    """Time GIR's CPU kernel of Sigmoid over 2^20 elements, one element per unit (the 'element'
    structure) in the per-unit form (not across units: the time model gives that form no
    chain): per unit, the time model's dependent chain (`perf._program(...).chain`) and
    nothing to overlap it with, so the time per unit over the chain is the cycles per step."""
    from onnx import TensorProto, helper

    from gir.backends.cpu.compiler import build
    from gir.backends.cpu.emitter import CpuEmitter
    from gir.backends.kernels import split_kernels
    from gir.frontend import load
    from gir.fusion.perf import _program
    from .target import CPU_NOMINAL_TIMING, local_cpu
    from gir.rewrite import optimize
    from gir.templates import candidates
    n = 1 << 20  # long enough that the parallel loop's launch is a small share of the time
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [n])
    model = helper.make_model(helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "sigmoid", [io("x")], [io("y")]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    graph = load(model)
    target = local_cpu()
    element = next(c for c in candidates(graph.ops[0], graph.tensors, target).candidates if c.structure == "element")
    g = optimize(element.graph)[0]
    (kernel,) = split_kernels(g)
    emitter = CpuEmitter(target)
    emitter.allow_across = False
    lib = build(emitter.prelude() + "\n" + emitter.kernel_source(kernel), "calibration_chain")
    fn = getattr(lib, kernel.name)
    fn.argtypes, fn.restype = [ctypes.c_void_p] * len(kernel.params), None
    arrays = {"x": np.linspace(-4, 4, n, dtype=np.float32), "y": np.zeros(n, np.float32)}
    args = [arrays[b.name].ctypes.data for b in kernel.params]
    fn(*args)
    seconds = max(_best_of(lambda: fn(*args), repeats) - launch, 1e-9)
    chain = _program(g).chain
    return seconds * min(threads, g.prim.num_units) * CPU_NOMINAL_TIMING.clock_hz / (g.prim.num_units * chain)
