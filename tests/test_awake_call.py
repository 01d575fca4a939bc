"""One-thread calls run while the team spins (gir/runtime/awake_call.py): which calls,
that the trampoline calls any kernel or library op with its own arguments on the calling
thread inside a parallel region, that the engine chooses the mode by timing runs, and that a
session gives the same outputs either way."""
import ctypes

import numpy as np
import onnxruntime as ort
import pytest

import gir
from gir.backends.cpu.compiler import build
from gir.runtime import awake_call
from gir.runtime.awake_call import MAX_ARGS, AwakeChoice, awake_calls, awake_thunk
from test_cpu_awake import gemv_softmax_library_model  # GEMV, softmax, library matmul, softmax, GEMV


def test_the_calls_before_the_last_fork_that_do_not_fork_run_awake():
    assert awake_calls([False, True, False, False, True, False]) == {0, 2, 3}
    assert awake_calls([True, True]) == frozenset()
    assert awake_calls([False, False]) == frozenset()  # nothing forks: nothing to keep awake for
    assert awake_calls([]) == frozenset()


_PROBE = r"""
#include <omp.h>
/* the sum of its arguments' first ints, and where it ran */
int gir_probe_in_parallel, gir_probe_thread, gir_probe_team;
%s
"""


def _probe_library():
    bodies = []
    for n in range(MAX_ARGS + 1):
        params = ", ".join(f"int *a{i}" for i in range(n)) or "void"
        total = " + ".join(f"*a{i}" for i in range(n)) or "0"
        bodies.append(f"int probe_int{n}({params}) {{ gir_probe_in_parallel = omp_in_parallel(); "
                      f"gir_probe_thread = omp_get_thread_num(); gir_probe_team = omp_get_num_threads(); return {total}; }}\n"
                      f"void probe_void{n}({params}) {{ {f'*a0 = {total};' if n else ''} gir_probe_in_parallel = omp_in_parallel(); }}")
    return build(_PROBE % "\n".join(bodies), "awake_probe")


@pytest.mark.parametrize("n", [0, 1, 2, 7, MAX_ARGS])
def test_the_trampoline_calls_the_function_with_its_arguments_inside_a_parallel_region(n):
    lib = _probe_library()
    values = [ctypes.c_int(3 * i + 1) for i in range(n)]
    addresses = [ctypes.addressof(v) for v in values]
    thunk = awake_thunk(getattr(lib, f"probe_int{n}"), addresses, returns_int=True)
    assert thunk() == sum(3 * i + 1 for i in range(n))
    inside = ctypes.c_int.in_dll(lib, "gir_probe_in_parallel").value
    team = ctypes.c_int.in_dll(lib, "gir_probe_team").value
    assert ctypes.c_int.in_dll(lib, "gir_probe_thread").value == 0  # the calling thread runs it
    # in a team of the pool's size where the pool has more than one thread; nested regions inside
    # it run on that thread alone (libgomp's default)
    from gir.runtime import onednn
    pool = onednn.library().gir_dnnl_pool() if onednn.library() is not None else None
    if pool and pool > 1:
        assert inside == 1 and team == pool
    void = awake_thunk(getattr(lib, f"probe_void{n}"), addresses)
    assert void() == 0
    if n:
        assert values[0].value == sum(3 * i + 1 for i in range(n))


def test_a_call_with_more_arguments_than_the_trampoline_takes_runs_plainly():
    lib = _probe_library()
    assert awake_thunk(lib.probe_int1, [0] * (MAX_ARGS + 1)) is None


def test_the_choice_tries_both_modes_then_keeps_the_faster_and_explores_the_other():
    choice = AwakeChoice()
    first = [choice.next() for _ in range(1)]
    seen = []
    for _ in range(2 * AwakeChoice.FIRST):
        mode = choice.next()
        seen.append(mode)
        choice.record(mode, 1.0 if mode else 2.0)
    assert seen.count(True) == seen.count(False) == AwakeChoice.FIRST and first[0] in (True, False)
    modes = []
    for _ in range(2 * AwakeChoice.EXPLORE):
        mode = choice.next()
        modes.append(mode)
        choice.record(mode, 1.0 if mode else 2.0)
    assert modes.count(False) == 2 and modes.count(True) == 2 * AwakeChoice.EXPLORE - 2
    # the load changes: awake runs slow down, the plain mode takes over within a window
    for _ in range(AwakeChoice.WINDOW + 1):
        mode = choice.next()
        choice.record(mode, 5.0 if mode else 2.0)
    assert choice.best() is False and choice.next() is False
    assert AwakeChoice(always=True).next() is True


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_session_runs_the_same_awake_and_plain(monkeypatch, mode):
    model = gemv_softmax_library_model()
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 768)).astype(np.float32)}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    monkeypatch.setenv(awake_call.AWAKE_ENV, mode)
    session = gir.Session(model, target="cpu", plan_cache=None)
    engine = session.engine
    if engine.plan.target.processors < 2 or not engine.awake:
        pytest.skip("one processor, or no call before a fork runs on one thread here")
    for awake in (True, False):  # both modes, whichever the choice would take
        per_run, thunks = engine.bind(feeds, awake)
        for thunk in thunks:
            thunk()
    outs = [session.run(None, feeds)[0] for _ in range(2 * AwakeChoice.FIRST + 1)]
    for got in outs:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    chosen = engine.awake_choice.seconds
    if mode == "on":
        assert engine.awake_choice.runs == len(outs) and not chosen[False]
    else:
        assert len(chosen[True]) >= AwakeChoice.FIRST and len(chosen[False]) >= AwakeChoice.FIRST


def test_off_runs_nothing_awake(monkeypatch):
    monkeypatch.setenv(awake_call.AWAKE_ENV, "off")
    session = gir.Session(gemv_softmax_library_model(), target="cpu", plan_cache=None)
    assert session.engine.awake == frozenset() and session.engine.awake_choice is None
