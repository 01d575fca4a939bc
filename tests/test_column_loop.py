"""Reductions read down a matrix's columns on the CPU, and a KV cache's concat read from the
output it is written to.

Decode attention multiplies its probabilities by V [S, 64] read down V's columns. A unit of a
SIMD width or more of outputs then loads, for each of the S terms, a contiguous vector across
its outputs (gir/ir/streams.py `column_products`): the emitter runs the outputs in the SIMD
lanes and, past COLUMN_GROUP terms, the group as a loop rather than written out; the time model
charges those loads as vectors, so the planner takes that tiling over a unit per output that
gathers. And a graph output whose content is a concat (present.value = past ++ new) is read by
its consumers from the output's storage (gir/fusion/compose.py), so that the attention's
operands alias or fold it instead of being written a second time."""
import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import gir
from gir.backends.cpu import compiler as cpu
from gir.backends.cpu.emitter import CpuEmitter
from gir.backends.cstyle import LoopedLanes
from gir.backends.kernels import split_kernels
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import get_target, run
from gir.ir.streams import column_products

CPU = get_target("cpu")


def _model(nodes, inputs, outputs):
    info = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph(nodes, "g", [info(n, s) for n, s in inputs], [info(n, s) for n, s in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _probs_times_v(s: int, heads: int = 12, d: int = 64):
    return _model([helper.make_node("MatMul", ["p", "v"], ["y"])],
                  [("p", [1, heads, 1, s]), ("v", [1, heads, s, d])], [("y", [1, heads, 1, d])])


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


@pytest.mark.parametrize("s", [129, 300])
def test_a_long_column_group_runs_as_a_loop_with_the_outputs_in_lanes(s):
    """Past COLUMN_GROUP terms: the outputs in the SIMD lanes, the terms a loop in
    COLUMN_PARTIALS partials, V's addresses affine in k and g (no division); several outputs a
    unit, and the interpreter, the emitted C and numpy agree."""
    assert s > LoopedLanes.COLUMN_GROUP
    model = _probs_times_v(s)
    (kernel,) = plan(load(model), CPU).kernels
    g = kernel.graph
    assert g.prim.num_units < 12 * 64, "a unit per output: the column form was not taken"
    assert column_products([op for _, op in g.ops()], g.buffers)
    (k,) = split_kernels(g)
    source = CpuEmitter(CPU).kernel_source(k)
    parts = LoopedLanes.COLUMN_PARTIALS
    assert f"for (int g0 = 0; g0 < {s - s % parts}; g0 += {parts}) {{" in source
    refs = re.findall(r"g_v\[([^\]]*)\]", source)
    assert refs and all("/" not in a and "%" not in a and "64*g" in a and a.endswith("+ k") for a in refs), refs
    feeds = _feeds(model)
    want = feeds["p"] @ feeds["v"]
    flat = {n: v.ravel() for n, v in feeds.items()}
    np.testing.assert_allclose(run(g, flat).outputs["y"].reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cpu.run(g, flat)["y"].reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_the_model_charges_column_loads_as_vectors():
    """The lane tiling's loads are vectors: its modelled compute is below the unit-per-output
    tiling's, whose V loads gather an element an instruction."""
    from gir.fusion.perf import estimate
    model = _probs_times_v(129)
    chosen = plan(load(model), CPU).kernels[0]
    narrow = plan(load(model), CPU, limit=1).kernels[0]  # the templates' first: a unit per output
    assert narrow.graph.prim.num_units == 12 * 64
    assert estimate(chosen.graph).parts["compute"] < estimate(narrow.graph).parts["compute"]


def test_a_kv_cache_concat_is_read_from_its_output():
    """present = past ++ new is a graph output; the attention reads it (K^T, a transpose of a
    transpose for its matmul; V down its columns) from that storage: no kernel writes a DRAM
    tensor but the graph's outputs, and the session matches onnxruntime."""
    heads, past, d = 2, 40, 16
    nodes = [helper.make_node("Concat", ["past_k", "k"], ["present_k"], axis=2),
             helper.make_node("Concat", ["past_v", "v"], ["present_v"], axis=2),
             helper.make_node("Transpose", ["present_k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "present_v"], ["y"])]
    inputs = [("past_k", [1, heads, past, d]), ("k", [1, heads, 1, d]), ("past_v", [1, heads, past, d]),
              ("v", [1, heads, 1, d]), ("q", [1, heads, 1, d])]
    outputs = [("y", [1, heads, 1, d]), ("present_k", [1, heads, past + 1, d]), ("present_v", [1, heads, past + 1, d])]
    model = _model(nodes, inputs, outputs)
    p = plan(load(model), CPU)
    written = {n for kernel in p.kernels for n, b in kernel.graph.buffers.items() if b.level == "dram" and b.role == "output"}
    graph_outputs = {"y", "present_k", "present_v"}
    assert written - graph_outputs <= {"scores", "probs"}, written  # no second copy of K or V
    assert not any("expand_b" in n for n in written), written
    feeds = _feeds(model, 3)
    session = gir.Session(model, target="cpu", plan_cache=None)
    got = session.run(None, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w, rtol=1e-5, atol=1e-5)
