"""Spread units (gir/fusion/spread.py) and the interleaved reduction loop (gir/backends/cstyle.py
`interleaved_reduce_loop`): a CPU unit that runs several of a GEMV's outputs side by side, rows
a fraction of the matrix apart, computes exactly what the one-output units did; the emitter walks
those rows in one loop with the sums bit-identical to one row at a time; the time model charges
such a unit at the calibrated faster rate and the planner picks it only where that gain exists."""
from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
from gir.backends.cpu import compiler as cpu
from gir.backends.cpu.emitter import CpuEmitter
from gir.backends.kernels import split_kernels
from gir.frontend import load
from gir.fusion.perf import estimate
from gir.fusion.plan import plan
from gir.fusion.spread import spread_choices, spread_units
from gir.ir import get_target, run
from gir.ir.streams import inlined_products, stream_factor, unit_streams

CPU = get_target("cpu")


def _gemv(k: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Tanh", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _one_row_kernel(model, target=CPU):
    """The GEMV group's kernel with one output per unit (the templates' first structure), as
    the planner builds it without spreading."""
    flat = replace(target, timing=replace(target.timing, stream_gain=1.0, adjacent_stream_gain=1.0))
    (step,) = [s for s in plan(load(model), flat, limit=1).steps if hasattr(s, "graph")]
    if target is CPU:
        assert step.graph.prim.grid[-1] == model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    return step.graph


def _feeds(graph, seed=1):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(b.shape or (b.size,)).astype(np.float32)
            for n, b in graph.buffers.items() if b.role in ("input", "const")}


@pytest.mark.parametrize("rows", [4, 8])
def test_spread_units_compute_what_the_one_output_units_did(rows):
    g = _one_row_kernel(_gemv(64, 256))
    spread = spread_units(g, rows)
    assert spread is not None and spread.prim.num_units * rows == g.prim.num_units
    feeds = _feeds(g)
    want = run(g, feeds).outputs
    got = run(spread, feeds).outputs  # the reference interpreter on the new units
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)
    native = cpu.run(spread, feeds)  # the emitted C, on the CPU harness
    for name, w in want.items():
        np.testing.assert_allclose(native[name].reshape(w.shape), w, rtol=1e-5, atol=1e-5)


def test_the_interleaved_loop_sums_exactly_as_one_row_at_a_time(monkeypatch):
    """Rows 16 KB apart: the emitter walks them side by side in one SIMD-marked loop over a C
    variable k; the result is bit-identical to the loop per output it replaces."""
    spread = spread_units(_one_row_kernel(_gemv(64, 256)), 4)
    (kernel,) = split_kernels(spread)
    source = CpuEmitter(CPU).kernel_source(kernel)
    assert "for (int k = 0; k < 4; ++k) {" in source and "part[k][j] = part[k][j] +" in source
    assert unit_streams(inlined_products([op for _, op in spread.ops()], spread.buffers), spread.buffers) == 4
    feeds = _feeds(spread)
    interleaved = cpu.run(spread, feeds)
    monkeypatch.setattr(CpuEmitter, "interleave_rows", False)
    one_at_a_time = cpu.run(spread, feeds)
    for name, v in one_at_a_time.items():
        np.testing.assert_array_equal(interleaved[name], v)


def test_rows_within_a_page_are_one_stream_and_run_one_at_a_time():
    """Four consecutive outputs of 64 floats sit 256 bytes apart: one prefetch stream, so no
    gain is modelled and the emitter keeps its loop per output."""
    g = _one_row_kernel(_gemv(64, 8))  # 8 outputs: spread rows 2 x 64 floats apart
    spread = spread_units(g, 4)
    assert spread is not None and unit_streams(inlined_products([op for _, op in spread.ops()], spread.buffers), spread.buffers) == 1
    assert spread_choices(g) == []
    (kernel,) = split_kernels(spread)
    assert "part[k][j]" not in CpuEmitter(CPU).kernel_source(kernel)


@pytest.mark.parametrize("rows", [4, 8])
def test_adjacent_units_mask_the_last_units_surplus_rows(rows):
    """250 outputs: rows a fraction apart would leave a ragged row; consecutive units do, the
    last unit's surplus masked by n - rows*q, on the interpreter and the emitted C."""
    g = _one_row_kernel(_gemv(768, 250))
    assert spread_units(g, rows) is None
    spread = spread_units(g, rows, adjacent=True)
    assert spread is not None and spread.prim.num_units == -(-250 // rows)
    feeds = _feeds(g)
    want = run(g, feeds).outputs
    got = run(spread, feeds).outputs
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)
    native = cpu.run(spread, feeds)
    for name, w in want.items():
        np.testing.assert_allclose(native[name].reshape(w.shape), w, rtol=1e-5, atol=1e-5)


def test_adjacent_rows_stream_the_pages_they_span_side_by_side():
    """Eight adjacent rows of 768 floats span six pages: six streams for the model, and the
    interior copy walks them side by side (the unit-dependent limit holds there)."""
    g = _one_row_kernel(_gemv(768, 250))
    spread = spread_units(g, 8, adjacent=True)
    assert unit_streams(inlined_products([op for _, op in spread.ops()], spread.buffers), spread.buffers) == 6
    (kernel,) = split_kernels(spread)
    source = CpuEmitter(CPU).kernel_source(kernel)
    interior, border = source.split("} else {", 1)
    assert "part[k][j] = part[k][j] +" in interior and "768*k + g]" in interior
    assert "part[k][j]" not in border  # the last unit: masked, one output at a time
    gained = replace(CPU, timing=replace(CPU.timing, stream_gain=1.3, adjacent_stream_gain=1.3))
    g.target = gained
    assert [(c.rows, c.adjacent) for c in spread_choices(g)] == [(4, True), (8, True)]


def test_adjacent_rows_that_measured_slower_are_neither_offered_nor_modelled_faster():
    """A CPU whose calibration ran eight adjacent rows slower than one (0.68x on an AMD EPYC
    VM, while rows an eighth apart gained 1.10x): the planner offers no adjacent spread, and
    the model charges an adjacent-row unit's stream below one row's rate."""
    g = _one_row_kernel(_gemv(768, 250))
    spread = spread_units(g, 8, adjacent=True)
    slower = replace(CPU, timing=replace(CPU.timing, stream_gain=1.1, adjacent_stream_gain=0.68))
    g.target = spread.target = slower
    assert spread_choices(g) == []
    assert estimate(spread).parts["latency"] > estimate(g).parts["latency"]
    spread.target = replace(slower, timing=replace(slower.timing, adjacent_stream_gain=1.3))
    assert estimate(spread).parts["latency"] < estimate(g).parts["latency"]


def test_spread_units_decline_what_they_cannot_spread():
    g = _one_row_kernel(_gemv(64, 250))
    assert spread_units(g, 4) is None  # 250 outputs: a ragged row a fraction apart
    assert spread_units(g, 1) is None and spread_units(g, 16) is None
    gpu = _one_row_kernel(_gemv(64, 256), get_target("cuda:sm_90"))
    assert spread_units(gpu, 4) is None  # a GPU unit is a warp, not a thread with prefetchers


def test_the_model_charges_spread_rows_at_the_calibrated_gain():
    g = _one_row_kernel(_gemv(768, 3072))
    gained = replace(CPU, timing=replace(CPU.timing, stream_gain=1.3))
    g.target = gained
    choices = spread_choices(g)
    assert [(c.graph.prim.num_units, c.adjacent) for c in choices] == [(768, False), (384, False)]
    assert all(estimate(c.graph).parts["latency"] < estimate(g).parts["latency"] for c in choices)
    assert stream_factor(1, 1.3) == 1.0 and stream_factor(8, 1.3) == pytest.approx(1.3)
    assert stream_factor(4, 1.3) == pytest.approx(1 + 0.3 * 3 / 7)
    g.target = replace(CPU, timing=replace(CPU.timing, stream_gain=1.0, adjacent_stream_gain=1.0))
    assert spread_choices(g) == []  # a machine that gains nothing never spreads


def test_a_session_runs_a_spread_gemv_and_matches_onnxruntime():
    model = _gemv(768, 3072, seed=3)
    x = np.random.default_rng(4).standard_normal((1, 768)).astype(np.float32)
    session = gir.Session(model, target="cpu", plan_cache=None)
    steps = [s for s in session.plan.steps if hasattr(s, "graph")]
    if CPU.timing.stream_gain > 1:
        assert any(step.rule == "spread-units" for s in steps for step in s.log), [s.log for s in steps]
    (got,) = session.run(None, {"x": x})
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # sums of 768 products of about 28 in size
