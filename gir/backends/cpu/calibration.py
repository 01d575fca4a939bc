"""Measured constants of the CPU the planner runs on (`gir calibrate`): the time model's figures
for the one target whose kernels GIR can time itself.

What is measured, each with the same compiler flags as the emitted kernels:
  - copy bandwidth, read + write bytes per second, with all threads and with one (a thread's
    stream is what its prefetchers sustain: the model's `unit_bandwidth`);
  - launch cost: an empty OpenMP parallel loop over the threads (fork and join);
  - issue rate: SIMD arithmetic on data already in L1, in unit-instructions per second;
  - dependent latency: GIR's own kernel for a sigmoid with one element per unit (nothing to
    overlap within a unit), as cycles per step of the time model's op costs (`perf.OP_COST`);
  - wake-up: a fork after 200 us of one-thread work (the team's spins have run out by then),
    and how long the spins last: the shortest gap of one-thread work after which a fork pays it;
  - warm copy bandwidth, all threads and one: arrays the last-level cache holds (what a kernel
    reads that the kernel before it has just written);
  - op costs: unit-instructions per element of each math op in GIR's own kernels (a libm call
    per element, or the prelude's vectorised polynomial);
  - stream gain: GIR's GEMV kernel on one thread, eight rows side by side over a row at a time
    (gir/ir/streams.py);
  - library calls: oneDNN's convs and matmuls on a few shapes, a fixed cost per call and a share
    of the peak (gir/runtime/library_calls.py), for the partition's time check.
The result is stored as JSON in the compile cache ($GIR_CACHE_DIR/calibration/), keyed by the
CPU model and flags (`host_cpu`) and the kernels' build flags, so a cache folder shared between
machines never hands one machine another's figures, nor a build figures measured with another
(the issue rate of 256-bit code is not that of 512-bit code). Plans made with it are cached
under a key that holds the figures.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from gir.ir.target import Timing

FORMAT = 2
COPY_BYTES = 64 << 20      # per array: far above the last-level cache of any CPU we target
ISSUE_ELEMENTS = 2048      # 8 KiB: stays in L1
ISSUE_CHAIN = 64           # dependent-free FMAs per element and pass (unit-instructions: / SIMD width)
WAKE_GAP_S = 200e-6        # one-thread work before a fork: longer than the engine's 1000 spins
SPIN_GAPS_S = (5e-6, 10e-6, 15e-6, 20e-6, 25e-6, 30e-6, 40e-6, 60e-6, 100e-6, 150e-6)  # gaps tried, shortest first
WARM_BYTES = 2 << 20       # per array of the warm copy: beyond a core's L2, within the last-level cache
HOT_REPEATS = 200          # copies of the hot pair per timing: one copy takes microseconds
STREAM_BYTES = 0          # weights the stream-gain probe reads; 0: twice the last-level cache, 192 MiB-1 GiB
OP_ELEMENTS = 16 << 10     # floats per math-op probe: 64 KiB each way, in L2, one thread (under the one-thread bound)

SOURCE = r"""
#define _POSIX_C_SOURCE 199309L
#include <omp.h>
#include <time.h>
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
static double gir_cal_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
double gir_cal_gap_fork(float *restrict dst, long n, double gap) {
    /* the main thread busy for `gap` seconds (as a one-thread kernel is), then a fork: what the
       first parallel kernel after one-thread work pays once the team's spins ran out */
    double start = gir_cal_now();
    volatile double sink = 0;
    while (gir_cal_now() - start < gap) sink += 1;
    start = gir_cal_now();
    gir_cal_empty(dst, n);
    return gir_cal_now() - start;
}
void gir_cal_threads(int n) { omp_set_num_threads(n); }
int gir_cal_max_threads(void) { return omp_get_max_threads(); }
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
    # since session 15 (absent from older files: those figures stay nominal until re-measured)
    wake_s: float = 0.0               # a fork after the team's threads went to sleep
    # since session 19
    spin_s: float = 0.0               # one-thread work after which a fork finds the team asleep
    warm_bandwidth: float = 0.0       # bytes/s, read + write, all threads, arrays in the last-level cache
    warm_unit_bandwidth: float = 0.0  # the same, one thread
    op_costs: dict | None = None      # unit-instructions per element of each math op, as GIR's kernels run it
    # since session 24
    stream_gain: float = 0.0          # one thread's GEMV rate, eight rows side by side over one (gir/ir/streams.py)
    # since session 36
    adjacent_stream_gain: float = 0.0  # the same, eight adjacent rows (under a page apart)
    # since session 27
    hot_unit_bandwidth: float = 0.0   # bytes/s, read + write, one thread, arrays in its core's own cache (L2)
    # since session 34
    library_calls: dict | None = None  # the target's `library_calls`: oneDNN's calls timed (gir/runtime/library_calls.py)

    @property
    def timing(self) -> Timing:
        from .target import CPU_NOMINAL_TIMING as nominal
        return replace(nominal, issue_per_clock=self.issue_per_s / nominal.clock_hz,
                       unit_bandwidth=self.unit_bandwidth, dependent_cycles=self.dependent_cycles,
                       wake_s=self.wake_s or nominal.wake_s, spin_s=self.spin_s or nominal.spin_s,
                       warm_bandwidth=self.warm_bandwidth or nominal.warm_bandwidth,
                       warm_unit_bandwidth=self.warm_unit_bandwidth or nominal.warm_unit_bandwidth,
                       op_cost=tuple(sorted((self.op_costs or {}).items())) or nominal.op_cost,
                       stream_gain=self.stream_gain or nominal.stream_gain,
                       adjacent_stream_gain=self.adjacent_stream_gain or nominal.adjacent_stream_gain,
                       hot_unit_bandwidth=self.hot_unit_bandwidth or nominal.hot_unit_bandwidth,
                       source=f"measured by `gir calibrate` on this CPU ({self.measured_at}); latency nominal")


def _path() -> Path:
    from gir.backends.cpu.compiler import FLAGS, host_cpu
    from gir.cache import cache_root
    key = host_cpu() + " | " + " ".join(FLAGS)  # the build the probes ran: other flags, other figures
    return cache_root() / "calibration" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


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
        known = {f.name for f in fields(Calibration)}  # a newer or older file: what this version reads
        return Calibration(**{k: v for k, v in data.items() if k in known})
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


def copy_bandwidth(nbytes: int, repeats: int) -> float:
    """Read + write bytes/s of a C copy of `nbytes` over the OpenMP team the kernels get (all
    threads, or OMP_NUM_THREADS), built with their compiler and flags: `gir run --profile` sets
    each kernel's GB/s against it."""
    from gir.backends.cpu.compiler import build
    lib = build(SOURCE, "calibration")
    lib.gir_cal_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    src, dst = np.ones(nbytes // 4, np.float32), np.zeros(nbytes // 4, np.float32)
    threads = lib.gir_cal_max_threads()
    run = lambda: lib.gir_cal_copy(dst.ctypes.data, src.ctypes.data, src.size, threads)  # noqa: E731
    run()  # page faults
    return 2 * nbytes / _best_of(run, repeats)


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

    def copy(t, count=n, times=1):
        return lambda: [lib.gir_cal_copy(dst.ctypes.data, src.ctypes.data, count, t) for _ in range(times)]
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

    lib.gir_cal_gap_fork.argtypes, lib.gir_cal_gap_fork.restype = [ctypes.c_void_p, ctypes.c_long, ctypes.c_double], ctypes.c_double
    wakes = [lib.gir_cal_gap_fork(scratch.ctypes.data, threads, WAKE_GAP_S) for _ in range(20 * repeats)]
    wake = float(np.median(wakes))
    spin = _spin_s(lib, scratch, threads, launch, wake, repeats)
    progress(f"fork after {WAKE_GAP_S * 1e6:.0f} us of one-thread work: {wake * 1e6:.1f} us; "
             f"the team sleeps after {spin * 1e6:.0f} us")
    warm_all, warm_one = (2 * WARM_BYTES * 20 / _best_of(copy(t, WARM_BYTES // 4, 20), repeats) for t in (threads, 1))
    progress(f"copy of {WARM_BYTES >> 20} MiB in cache: {warm_all / 1e9:.1f} GB/s with {threads} threads, {warm_one / 1e9:.1f} with one")
    from .target import core_cache_bytes
    hot = (core_cache_bytes() or 1 << 20) // 4  # per array: the pair fills half a core's own cache, as hot_bytes does
    hot_one = 2 * hot * HOT_REPEATS / _best_of(copy(1, hot // 4, HOT_REPEATS), repeats)
    progress(f"copy of {hot >> 10} KiB in a core's own cache: {hot_one / 1e9:.1f} GB/s with one thread")
    gain, adjacent_gain = _stream_gains(lib, repeats)
    progress(f"GEMV, 1 thread, eight rows side by side: {gain:.2f}x a row at a time ({adjacent_gain:.2f}x eight adjacent rows)")
    costs = _op_costs(repeats, issue)
    progress("math ops, unit-instructions per element: " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()))
    from gir.runtime import library_calls
    calls = library_calls.measure(all_bw, progress)
    return Calibration(cpu=host_cpu().split(" | ")[0], threads=threads, copy_bandwidth=all_bw,
                       unit_bandwidth=one_bw, launch_s=launch, issue_per_s=issue, dependent_cycles=dependent,
                       measured_at=time.strftime("%Y-%m-%d %H:%M"), wake_s=wake, spin_s=spin,
                       warm_bandwidth=warm_all, warm_unit_bandwidth=warm_one, op_costs=costs, stream_gain=gain,
                       adjacent_stream_gain=adjacent_gain, hot_unit_bandwidth=hot_one, library_calls=calls)


def one_row_gemv_target():
    """The local CPU target planning GEMVs a row at a time (no spreading): the probe's baseline."""
    from .target import local_cpu
    base = local_cpu()
    return replace(base, timing=replace(base.timing, stream_gain=1.0, adjacent_stream_gain=1.0))


def _stream_gains(lib, repeats: int) -> tuple[float, float]:
    """GIR's own GEMV kernel (768 x 3072) over STREAM_BYTES of weight matrices in turn, on one thread:
    its rate with eight rows an eighth of the matrix apart side by side (gir/fusion/spread.py,
    the emitter's interleaved loop) over its rate a row at a time, at least 1 (a machine whose
    one stream already saturates gains nothing: the planner then never spreads) and at most 2;
    and the same with eight adjacent rows, at least 0.25 (the time model charges adjacent rows
    that measured slower at their rate: an AMD EPYC VM ran them at 0.64-0.72x, rows apart at
    0.97-1.17x; scripts/gemv_streams.py, results/gemv_streams_epyc.md). A
    hand-written C probe would not do: a plain sum of rows gained nothing where GIR's GEMV
    gained 1.15x, and the same loops ran from 0.5x to 1.2x the one-row rate depending on how
    gcc compiled them (results/gemv_streams.md)."""
    from gir.backends.cpu.compiler import build
    from gir.backends.cpu.emitter import CpuEmitter
    from gir.backends.kernels import split_kernels
    from gir.fusion.spread import gemv_forms
    from gir.ir.streams import GAINFUL_STREAMS as ROWS

    from .target import last_level_cache_bytes
    k, n = 768, 3072  # GPT-2's c_fc GEMV, over matrices in turn that together exceed the cache
    target, forms = gemv_forms(one_row_gemv_target(), k, n, (ROWS,), adjacent=True)
    if ROWS not in forms:
        return 1.0, 1.0
    emitter, kernels = CpuEmitter(target), {rows: split_kernels(g)[0] for rows, g in forms.items()}
    sources = [emitter.prelude(), *(emitter.kernel_source(kr).replace(kr.name, f"probe_rows{rows}") for rows, kr in kernels.items())]
    probes = build("\n".join(sources), "calibration_streams")
    # from DRAM (partly cached, it read 1.25-1.5x for 1.15-1.2x); at most 1 GiB held at once
    total = STREAM_BYTES or min(max(192 << 20, 2 * last_level_cache_bytes()), 1 << 30)
    matrices = [np.ones(k * n, np.float32) for _ in range(max(1, total // (k * n * 4)))]
    small = {}
    rates, pool = {}, lib.gir_cal_max_threads()
    lib.gir_cal_threads(1)
    try:
        for rows, kernel in kernels.items():
            fn = getattr(probes, f"probe_rows{rows}")
            fn.argtypes, fn.restype = [ctypes.c_void_p] * len(kernel.params), None
            calls = [[(m if b.size == k * n else small.setdefault(b.name, np.ones(b.size, np.float32))).ctypes.data
                      for b in kernel.params] for m in matrices]
            run = lambda: [fn(*args) for args in calls]
            run()
            rates[rows] = 1 / _best_of(run, repeats)
    finally:
        lib.gir_cal_threads(pool)
    return round(min(max(rates[ROWS] / rates[1], 1.0), 2.0), 3), round(min(max(rates.get("adjacent", rates[1]) / rates[1], 0.25), 2.0), 3)


def _spin_s(lib, scratch, threads: int, launch: float, wake: float, repeats: int) -> float:
    """The shortest of SPIN_GAPS_S after which a fork costs more than halfway from a spinning
    team's launch to a sleeping team's wake-up (the longest gap tried where none does)."""
    for gap in SPIN_GAPS_S:
        forks = [lib.gir_cal_gap_fork(scratch.ctypes.data, threads, gap) for _ in range(5 * repeats)]
        if np.median(forks) > (launch + wake) / 2:
            return gap
    return SPIN_GAPS_S[-1]


# ONNX op -> the time model's op name (gir/fusion/perf.py OP_COST), with inputs in a range the op
# is defined on; each is timed as GIR emits it (the libm call or the prelude's polynomial)
OP_PROBES = {"Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "recip", "Div": "div", "Erf": "erf",
             "Tanh": "tanh", "Sigmoid": "sigmoid", "Sin": "sin", "Cos": "cos", "Pow": "pow"}


def _op_costs(repeats: int, issue_per_s: float) -> dict[str, float]:
    """Unit-instructions per element of each math op as the emitted kernels compute it: GIR's
    own one-thread kernel of the op over OP_ELEMENTS floats in L2 (its widest 'chunk'
    structure, vectorised), less the same kernel with an Add, over the time one unit-instruction takes.
    The nominal table counts instructions of typical listings; here erf is a libm call per
    element that gcc does not vectorise, and exp the prelude's polynomial that it does."""
    from onnx import TensorProto, helper

    from gir.backends.cpu.compiler import build
    from gir.backends.cpu.emitter import CpuEmitter
    from gir.backends.kernels import split_kernels
    from gir.frontend import load
    from gir.rewrite import optimize
    from gir.templates import candidates

    from .target import local_cpu
    target, n = local_cpu(), OP_ELEMENTS
    emitter = CpuEmitter(target)
    kernels, sources = {}, [emitter.prelude()]
    for op in ("Add", *OP_PROBES):
        two = op in ("Add", "Div", "Pow")
        io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [n])
        node = helper.make_node(op, ["x", "z"] if two else ["x"], ["y"])
        model = helper.make_model(helper.make_graph([node], op, [io("x")] + ([io("z")] if two else []), [io("y")]),
                                  opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
        graph = load(model)
        chunks = [c for c in candidates(graph.ops[0], graph.tensors, target).candidates if c.structure == "chunk"]
        if not chunks:
            continue
        widest = min(chunks, key=lambda c: c.graph.prim.num_units)
        (kernel,) = split_kernels(optimize(widest.graph)[0])
        kernels[op] = kernel
        sources.append(emitter.kernel_source(kernel).replace(kernel.name, f"probe_{op}"))
    lib = build("\n".join(sources), "calibration_ops")
    x = np.linspace(0.5, 2.0, n, dtype=np.float32)
    arrays = {"x": x, "z": x[::-1].copy(), "y": np.zeros(n, np.float32)}
    probes = {}
    for op, kernel in kernels.items():
        fn = getattr(lib, f"probe_{op}")
        fn.argtypes, fn.restype = [ctypes.c_void_p] * len(kernel.params), None
        probes[op] = lambda fn=fn, args=[arrays[b.name].ctypes.data for b in kernel.params]: [fn(*args) for _ in range(20)]
    # the probes in turn, round after round, each op's fastest round kept: an op timed in one
    # burst after Add's took the machine's state of that moment with it (on a shared 2-core
    # guest, erf 37.8 to 58.7 and exp 10.3 to 21.8 unit-instructions in three calibrations)
    rounds = [{op: _best_of(probe, 1) for op, probe in probes.items()} for _ in range(3 * repeats)]
    seconds = {op: min(r[op] for r in rounds) / 20 for op in probes}
    tm = target.timing  # the rate the time model issues one thread's unit-instructions at (gir/fusion/perf.py)
    model_rate = tm.clock_hz * min(issue_per_s / tm.clock_hz, 1 / tm.alu_latency_cycles)
    per_instruction = n / target.lanes_per_unit / model_rate  # seconds of one unit-instruction over the array
    return {name: round(1 + max(0.0, seconds[op] - seconds["Add"]) / per_instruction, 1)
            for op, name in OP_PROBES.items() if op in seconds}


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
