"""How long libgomp's threads spin for the next parallel region before they sleep, set as a time
rather than a count.

GOMP_SPINCOUNT counts iterations of a loop around the CPU's pause instruction, whose latency
differs by a factor of several between CPUs: 1000 spins caught the gap between a run's
back-to-back kernels on the AMD EPYC guest where that count was chosen (results/omp_wait.md),
but on an Intel Xeon guest whose pause takes 10 ns they last 10 us, the threads sleep between
kernels and every parallel region pays a futex wake-up: ShuffleNet-v2 at default threads 7.5 ms
against 4.5 ms on one thread. Longer spins cost latency when another process holds a core (the
spinning thread keeps the core from the one doing the work), so the window is the shortest
that keeps the team awake across a run: 20 us (on that Xeon, 2000 spins: ShuffleNet-v2 7.5 ->
5.2 ms idle, 2.2x that with one core taken; 3000 spins: 4.6 ms, 2.7x; results/bench_cpu.md
run 16). The pause is timed once per process, on a helper built without OpenMP so that timing
it does not load libgomp before its settings are in place."""
from __future__ import annotations

import os

SPIN_WINDOW_S = 20e-6
FALLBACK_SPINS = 1000  # no C compiler, or a CPU without a pause instruction we know
PAUSES = 20000

SOURCE = r"""
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#define GIR_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define GIR_PAUSE() __asm__ __volatile__("yield" ::: "memory")
#else
#define GIR_PAUSE() __asm__ __volatile__("" ::: "memory")
#endif
/* seconds n pause instructions take (libgomp's spin loop is a pause and a load per spin) */
double gir_pause_seconds(long n) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; ++i) GIR_PAUSE();
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}
"""


def pause_seconds() -> float | None:
    """One pause instruction's time on this CPU (fastest of five timings), or None."""
    import ctypes

    from ..native_cache import cached_library
    from .compiler import CC, toolchain_version
    try:
        lib = cached_library(toolchain_version(), CC, ["-O2", "-shared", "-fPIC"], SOURCE, ".c",
                             "the pause timer", f"the CPU ({CC})")
    except Exception:  # noqa: BLE001 -- no compiler: the engine reports that where it needs one
        return None
    lib.gir_pause_seconds.argtypes, lib.gir_pause_seconds.restype = [ctypes.c_long], ctypes.c_double
    best = min(lib.gir_pause_seconds(PAUSES) for _ in range(5))
    return best / PAUSES if best > 0 else None


def spin_count(window_s: float = SPIN_WINDOW_S) -> int:
    """GOMP_SPINCOUNT for a spin of `window_s` on this CPU."""
    pause = pause_seconds()
    if not pause:
        return FALLBACK_SPINS
    return max(100, min(1_000_000, round(window_s / pause)))


def set_spin_window() -> None:
    """Before libgomp loads: spin for SPIN_WINDOW_S, unless the caller chose a wait policy or
    a spin count (theirs wins)."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(spin_count())
