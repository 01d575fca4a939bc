"""The checks of the conformance suite, each run in the backend's own worker process
(test_conformance.py): a check returns normally, raises (the test fails with that traceback)
or calls pytest.skip. `spec` names the backend: a folder under gir/backends or a path."""
from __future__ import annotations

import random
import traceback
from collections import Counter
from functools import lru_cache

import numpy as np
import onnxruntime as ort
import pytest

import models
from backend_cases import compare, fused_graph, seeded_feeds, template_cases
from gir.backends.cstyle import CStyle
from gir.backends.errors import NoDeviceError
from gir.backends.kernels import emit_graph
from gir.backends.port import load_backend
from gir.frontend import load
from gir.frontend.basic import BasicOp
from gir.frontend.reference import execute_op
from gir.fusion.group import FusionError
from gir.fusion.plan import plan
from gir.ir import (BLOCK, DEVICE, DRAM, REGISTER, SHARED, UNIT, Elementwise, GIRGraph, Input, Move,
                    ParallelPrimitive, Slice, Target, U, run, validate)
from gir.templates import candidates

CASES = template_cases()


@lru_cache(maxsize=None)
def backend(spec: str):
    return load_backend(spec)


@lru_cache(maxsize=None)
def target(spec: str) -> Target:
    return backend(spec).describe()


def probe_graph(tgt: Target) -> tuple[GIRGraph, dict]:
    """y = 2x + 1 over three units: the smallest graph with a load, a computation and a store."""
    n = 2 * tgt.lanes_per_unit
    g = GIRGraph("probe", ParallelPrimitive((3,), 1), tgt)
    g.buffer("x", DRAM, (3 * n,), role="input")
    g.buffer("y", DRAM, (3 * n,), role="output")
    g.buffer("%x", REGISTER, n)
    g.buffer("%y", REGISTER, n)
    g.add(Move(src=Slice.flat("x", U * n, n), dst=Slice.flat("%x", 0, n)))
    g.add(Elementwise(expr=Input(0) * 2.0 + 1.0, inputs=(Slice.flat("%x", 0, n),), out=Slice.flat("%y", 0, n)))
    g.add(Move(src=Slice.flat("%y", 0, n), dst=Slice.flat("y", U * n, n)))
    validate(g)
    return g, {"x": np.arange(3 * n, dtype=np.float32)}


@lru_cache(maxsize=None)
def executes(spec: str) -> bool:
    """Whether the backend runs kernels on this machine (else the suite only compiles)."""
    graph, feeds = probe_graph(target(spec))
    try:
        out = backend(spec).run(graph, feeds)
    except NoDeviceError:
        return False
    np.testing.assert_array_equal(out["y"], 2 * feeds["x"] + 1, err_msg=f"{spec}: the probe kernel")
    return True


def check(spec: str, graph, feeds: dict, label: str) -> None:
    if executes(spec):
        compare(backend(spec).run(graph, feeds), run(graph, feeds).outputs, label)
    else:
        backend(spec).compile(graph)


# -- 1. import and description ----------------------------------------------------------------------
def port_interface(spec: str) -> None:
    port = backend(spec)
    assert isinstance(port.Emitter, type) and issubclass(port.Emitter, CStyle), "Emitter must subclass CStyle"
    assert all(callable(getattr(port, n)) for n in ("describe", "compile", "run"))


def hardware_description(spec: str) -> None:
    t = target(spec)
    assert isinstance(t, Target), f"describe() returned {type(t).__name__}, not a Target"
    assert t.backend == spec.rstrip("/").split("/")[-1], "Target.backend must be the backend's folder name"
    assert len(t.hierarchy) >= 3 and all(isinstance(h, str) and h for h in t.hierarchy)
    assert t.lanes_per_unit >= 1 and t.lanes_per_unit & (t.lanes_per_unit - 1) == 0, "lanes: a power of two"
    assert t.max_units_per_block >= 1 and t.processors >= 1 and t.max_units_per_processor >= 1
    names = [m.name for m in t.memory]
    assert names[0] == REGISTER and names[-1] == DRAM and set(names) <= {REGISTER, SHARED, DRAM}
    assert len(set(names)) == len(names)
    scopes = {REGISTER: UNIT, SHARED: BLOCK, DRAM: DEVICE}
    for m in t.memory:
        assert m.scope == scopes[m.name], f"{m.name} memory carries {scopes[m.name]}-scope syncs"
        assert m.capacity_bytes >= 64 and m.bandwidth_bytes_per_s > 0
    if t.has_level(SHARED):
        assert 1024 <= t.shared_bytes_per_block < t.level(DRAM).capacity_bytes
        assert np.isfinite(t.level(SHARED).bandwidth_bytes_per_s)
    assert np.isfinite(t.dram_bandwidth) and 1e8 <= t.dram_bandwidth <= 1e14, "DRAM bandwidth in bytes/s"
    assert 1e8 <= t.peak_flops <= t.peak_matrix_flops <= 1e17, "peak FLOP/s: fp32 vector <= matrix"
    assert 0 < t.launch_latency_s < 1e-2
    assert 0 < t.ridge_point() < 1e4


def emitter_matches_description(spec: str) -> None:
    t = target(spec)
    emitter = backend(spec).Emitter(t)
    assert emitter.L == t.lanes_per_unit
    source, kernels = emit_graph(emitter, probe_graph(t)[0])
    assert kernels and all(k.name in source for k in kernels)


# -- 2. templates -----------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def sample(spec: str) -> dict[str, list]:
    """case -> its candidates to check: one of the structure its kind sampled least so far (the
    one fewest cases offer, on a tie), seeded; then, for a structure still unsampled, one more
    from the first case that offers it."""
    found = {case: candidates(op, ts, target(spec)).candidates for case, (op, ts) in CASES.items()}
    offers = Counter((case.split("-")[0], s) for case, cands in found.items() for s in {c.structure for c in cands})
    seen: Counter = Counter()
    picks: dict[str, list] = {}

    def pick(case, structure):
        seen[case.split("-")[0], structure] += 1
        rnd = random.Random(f"{case}/{spec}/{structure}")
        picks.setdefault(case, []).append(rnd.choice([c for c in found[case] if c.structure == structure]))

    for case, cands in found.items():
        kind = case.split("-")[0]
        pick(case, min(sorted({c.structure for c in cands}), key=lambda s: (seen[kind, s], offers[kind, s])))
    for case, cands in found.items():
        for structure in sorted({c.structure for c in cands}):
            if not seen[case.split("-")[0], structure]:
                pick(case, structure)
    return picks


def template_case(spec: str, case: str) -> None:
    op, ts = CASES[case]
    for cand in sample(spec)[case]:
        check(spec, cand.graph, seeded_feeds(op, ts, case), f"{case} {cand.label}")


def sample_spans_every_structure(spec: str) -> None:
    offered = {(case.split("-")[0], c.structure) for case, (op, ts) in CASES.items()
               for c in candidates(op, ts, target(spec)).candidates}
    sampled = {(case.split("-")[0], c.structure) for case, cands in sample(spec).items() for c in cands}
    assert offered == sampled, f"never sampled: {sorted(offered - sampled)}"
    assert len(sample(spec)) == len(CASES) and all(sample(spec).values())


# -- 3. rewritten chains ----------------------------------------------------------------------------
def fused_chain(spec: str, model: str, shape: tuple, structure: str | None) -> None:
    try:
        graph, feeds = fused_graph(model, shape, target(spec), structure)
    except (FusionError, LookupError) as err:  # the planner's reach on this target, not the backend's
        pytest.skip(str(err))
    check(spec, graph, feeds, f"{model} {shape} {structure or 'fuse()'}")


# -- 4. zoo models ----------------------------------------------------------------------------------
def run_plan(port, result, feeds: dict) -> dict:
    """A plan's steps in order, kernels through the backend: library ops in numpy (as the
    runtime does); a kernel writing part of a tensor starts from what earlier kernels wrote."""
    g = result.graph
    env = {n: t.value for n, t in g.tensors.items() if t.value is not None} | dict(feeds)

    def value(name):
        return env[result.aliases.get(name, name)].reshape(g.tensors[name].shape)

    for step in result.steps:
        if isinstance(step, BasicOp):
            env[step.outputs[0]] = execute_op(step, g.tensors, [value(t) for t in step.inputs])
            continue
        given = {b.name: value(b.name) for b in step.graph.buffers.values()
                 if b.role in ("input", "const") or (b.role == "output" and result.aliases.get(b.name, b.name) in env)}
        env.update(port.run(step.graph, given))
    return {name: value(name) for name in g.outputs}


def zoo_model(spec: str, model: str) -> None:
    proto = models.load_bundled(model)
    feeds = models.example_inputs(proto, 0)
    graph = load(proto)
    result = plan(graph, target(spec), limit=1)
    if not executes(spec):
        for step in result.steps:
            if not isinstance(step, BasicOp):
                backend(spec).compile(step.graph)
        return
    got = run_plan(backend(spec), result, feeds)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, w in zip(graph.outputs, want):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())),
                                   err_msg=f"{model} on {spec}: {name}")


def outcome(check_fn, *args) -> tuple[str, str | None]:
    """("ok" | "skip" | "fail", detail) of one check: plain data, whatever the check raised
    (exceptions with their own constructors do not survive pickling back)."""
    try:
        check_fn(*args)
    except pytest.skip.Exception as skip:
        return "skip", str(skip.msg)
    except Exception:  # noqa: BLE001 -- reported by the test that asked for the check
        return "fail", traceback.format_exc()
    return "ok", None
