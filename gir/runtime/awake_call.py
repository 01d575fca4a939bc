"""Run a one-thread call while the team's other threads spin, so the next call that forks
finds them awake.

The team's threads spin `Timing.spin_s` (20 us) after a parallel region and then sleep; waking
them costs the next fork 55-65 us on the 2-core Intel VM (an empty region after one-thread
work, as `gir calibrate` times it) and 100-180 us for a oneDNN conv in sequence
(scripts/step_times_cpu.py). A longer spin keeps them awake but costs latency when another
process holds a core: `GOMP_SPINCOUNT` for 1 ms took the zoo's CNNs and GPT-2 decode to
9.9-15.9x their idle latency (results/spin_window_busy.md). So the engine keeps them spinning only
through the one-thread calls that lead up to a fork (`awake_calls`), in its own loop, and lets
them sleep between runs. `gir_awake_call(fn, returns_int, n, args)` calls `fn` with `n`
pointer arguments on the calling thread inside a parallel region whose other threads spin on a
flag until it returns; nested parallelism is off (libgomp's default), so a parallel region
inside `fn` runs on the calling thread alone, as a one-thread call does anyway."""
from __future__ import annotations

import ctypes
import os
import statistics
from collections import deque
from functools import lru_cache

MAX_ARGS = 32  # a call with more pointer arguments runs plainly
# $GIR_AWAKE: auto (AwakeChoice), on (every run awake), off (none): A/B runs and debugging
AWAKE_ENV = "GIR_AWAKE"

_CASES = "\n".join(
    f"    case {n}: if (ret) r = ((int (*)({', '.join(['P'] * n) or 'void'}))fn)({', '.join(f'a[{i}]' for i in range(n))});"
    f" else ((void (*)({', '.join(['P'] * n) or 'void'}))fn)({', '.join(f'a[{i}]' for i in range(n))}); break;"
    for n in range(MAX_ARGS + 1))

SOURCE = r"""
#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#define GIR_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define GIR_PAUSE() __asm__ __volatile__("yield" ::: "memory")
#else
#define GIR_PAUSE() __asm__ __volatile__("" ::: "memory")
#endif
typedef void *P;
static int call(void *fn, int ret, int n, P *a) {
    int r = 0;
    switch (n) {
%s
    }
    return r;
}
/* fn's result (0 where it returns nothing); the team's other threads spin until it returns */
int gir_awake_call(void *fn, int ret, int n, P *a) {
    int r = 0, done = 0;
    #pragma omp parallel
    {
        if (omp_get_thread_num() == 0) {
            r = call(fn, ret, n, a);
            __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
        } else {
            while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) GIR_PAUSE();
        }
    }
    return r;
}
int gir_awake_team(void) { return omp_get_max_threads(); }
""" % _CASES


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    from gir.backends.cpu.compiler import build
    lib = build(SOURCE, "awake_call")
    lib.gir_awake_call.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.gir_awake_call.restype = ctypes.c_int
    lib.gir_awake_team.argtypes, lib.gir_awake_team.restype = [], ctypes.c_int
    return lib


def team_size() -> int:
    """Threads a parallel region forks (OMP_NUM_THREADS, else the cores): with one, no call
    has a team to keep awake."""
    return int(library().gir_awake_team())


def awake_thunk(fn, args: list, returns_int: bool = False):
    """A callable that runs the ctypes function `fn` on `args` (addresses) awake, or None where
    it takes more than MAX_ARGS arguments."""
    if len(args) > MAX_ARGS:
        return None
    lib = library()
    address = ctypes.cast(fn, ctypes.c_void_p).value
    argv = (ctypes.c_void_p * max(len(args), 1))(*args)
    call, n, flag = lib.gir_awake_call, len(args), int(returns_int)

    def thunk():
        return call(address, flag, n, argv)
    thunk.argv = argv  # kept alive
    return thunk


def awake_plan(forks: list[bool]) -> tuple[frozenset, "AwakeChoice | None"]:
    """(the calls of a run that may run awake, the choice of mode per run), as $GIR_AWAKE says:
    off: none; on: every run awake; auto (the default): AwakeChoice. None where no call may."""
    mode = os.environ.get(AWAKE_ENV, "auto").lower()
    calls = awake_calls(forks) if mode != "off" and team_size() > 1 else frozenset()
    return calls, (AwakeChoice(always=mode == "on") if calls else None)


def awake_calls(forks: list[bool]) -> frozenset[int]:
    """Indices of the one-thread calls (forks[c] False) that lead up to a call that forks: every
    one-thread call before the run's last fork. After it, nothing needs the team awake."""
    if not any(forks):
        return frozenset()
    last = max(c for c, f in enumerate(forks) if f)
    return frozenset(c for c in range(last) if not forks[c])


class AwakeChoice:
    """Whether a run keeps the team spinning through its one-thread calls, chosen by timing the
    runs themselves. On an idle machine it saves each fork the wake-up (ShuffleNet-v2 at default
    threads, one session: 2.93 -> 2.67 ms); with another process on a core the spinning thread
    takes time from the one doing the work (2.7-5.1x the idle latency, against 1.2-2.3x without;
    results/awake_calls.md). Neither is
    known in advance and the load changes while a session lives, so runs use the mode whose
    recent runs were faster and every EXPLORE-th run tries the other."""
    EXPLORE = 16
    WINDOW = 5  # runs per mode that decide (median)
    FIRST = 3   # runs per mode before choosing

    def __init__(self, always: bool = False):
        self.always = always
        self.seconds = {True: deque(maxlen=self.WINDOW), False: deque(maxlen=self.WINDOW)}
        self.runs = 0

    def best(self) -> bool:
        return min((True, False), key=lambda mode: statistics.median(self.seconds[mode]))

    def next(self) -> bool:
        """The mode of the next run."""
        if self.always:
            return True
        short = [mode for mode in (True, False) if len(self.seconds[mode]) < self.FIRST]
        if short:
            return short[0] if len(short) == 1 else self.runs % 2 == 0
        best = self.best()
        return (not best) if self.runs % self.EXPLORE == self.EXPLORE - 1 else best

    def record(self, mode: bool, seconds: float) -> None:
        self.seconds[mode].append(seconds)
        self.runs += 1
