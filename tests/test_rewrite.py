"""Rewriting (sync insertion, merging, swapping, Algorithm 1) on merged GIR-Graphs: outputs
never change, DRAM traffic never grows, and the paper's fusion targets end as one kernel at
their compulsory DRAM bound."""
import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from gir.frontend import load, run_reference
from gir.frontend.basic import BasicGraph, BasicOp, Tensor
from gir.fusion.group import common_structures, escaping_tensors, fuse
from gir.fusion.merge import merge_graphs
from gir.fusion.plan import plan
from gir.ir import SHARED, Elementwise, Sync, get_target, run, validate
from gir.ir.cost import compulsory_bytes, dram_footprint, level_bytes
from gir.ir.expr import Input, call
from gir.rewrite import optimize
from gir.templates import candidates

H100 = get_target("h100")
rng = np.random.default_rng(3)


def onnx_model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def fused_as(g: BasicGraph, ops, structures: list[str], units_per_block: int = 1):
    """The chain merged and rewritten on one named structure per op (the rule under test needs
    that tiling; which structure the time model would pick is the search's business)."""
    per_op = [candidates(op, g.tensors, H100).candidates for op in ops]
    chosen = next(ch for ch in common_structures(per_op) if [c.structure for c in ch] == structures
                  and ch[0].params["units_per_block"] == units_per_block)
    merged = merge_graphs("+".join(op.name for op in ops), [c.graph for c in chosen], escaping_tensors(g, ops))
    optimized, log = optimize(merged)
    return chosen, optimized, log


def feeds_for(g: BasicGraph):
    feeds = {n: rng.standard_normal(g.tensors[n].shape).astype(np.float32) for n in g.inputs}
    consts = {n: t.value for n, t in g.tensors.items() if t.value is not None}
    return feeds, consts


def assert_one_kernel_at_bound(model, target=H100):
    g = load(model)
    fused = fuse(g, g.ops, target)
    feeds, consts = feeds_for(g)
    want = run_reference(g, feeds)
    got = run(fused.graph, {**feeds, **consts}).outputs
    for name in g.outputs:
        np.testing.assert_allclose(got[name].reshape(want[name].shape), want[name], rtol=1e-5, atol=1e-5)
    assert fused.device_syncs == 0, "more than one kernel"
    footprint = dram_footprint(fused.graph)
    assert footprint["read"] + footprint["write"] == compulsory_bytes(fused.graph)
    steps = [(s.dram_before, s.dram_after) for s in fused.log]
    assert all(after <= before for before, after in steps)
    return fused


def test_softmax_bert_shape_is_one_kernel_at_the_bound():
    s = [1, 12, 128, 128]
    fused = assert_one_kernel_at_bound(onnx_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", s)], [("y", s)]))
    assert level_bytes(fused.graph) == {"read": 4 * np.prod(s), "write": 4 * np.prod(s)}  # x read exactly once


def test_masked_softmax_stays_in_registers_when_a_unit_reads_back_its_own_store():
    """BERT's scaled, masked softmax as planned for A100 (a block of units per row): a unit
    stores its exponentials and loads exactly the same elements back for the division. That
    read is the unit's own write, so it takes the registers even though the buffer is in DRAM
    and its address depends on the unit: the exponentials never reach DRAM, one read and one
    write of the scores (the bound)."""
    s = [1, 12, 128, 128]
    inits = [numpy_helper.from_array(np.array(8.0, np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal((1, 1, 1, 128)).astype(np.float32), "mask")]
    nodes = [helper.make_node("Div", ["x", "scale"], ["d"]), helper.make_node("Add", ["d", "mask"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    g = load(onnx_model(nodes, [("x", s)], [("y", s)], inits))
    p = plan(g, get_target("a100"), limit=2)
    assert len(p.kernels) == 1
    assert sum(sub.gir_bytes for sub in p.subgraphs) == sum(sub.bound_bytes for sub in p.subgraphs)
    feeds, consts = feeds_for(g)
    got = run(p.kernels[0].graph, {**feeds, **consts}).outputs["y"]
    np.testing.assert_allclose(got.reshape(s), run_reference(g, feeds)["y"], rtol=1e-5, atol=1e-6)


def test_layernorm_bert_shape_is_one_kernel_at_the_bound():
    h = [1, 128, 768]
    inits = [numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), n) for n in ("g", "b")]
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)
    assert_one_kernel_at_bound(onnx_model([node], [("x", h)], [("y", h)], inits))


def test_bias_gelu_residual_bert_shape_is_one_kernel_at_the_bound():
    f = [1, 128, 3072]
    consts = {"bias": rng.standard_normal(3072).astype(np.float32), "sq": np.array(1.4142135, np.float32),
              "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Add", ["x", "bias"], ["h"]), helper.make_node("Div", ["h", "sq"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["p"]),
             helper.make_node("Mul", ["h", "p"], ["q"]), helper.make_node("Mul", ["q", "half"], ["gl"]),
             helper.make_node("Add", ["gl", "res"], ["y"])]
    model = onnx_model(nodes, [("x", f), ("res", f)], [("y", f)], [numpy_helper.from_array(v, k) for k, v in consts.items()])
    fused = assert_one_kernel_at_bound(model)
    assert sum(1 for _, op in fused.graph.ops() if op.kind == "Elementwise") == 1  # the chain became one expression


def test_block_reduction_structure_lifts_partials_into_shared_memory():
    h = [1, 64, 2048]
    model = onnx_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", h)], [("y", h)])
    g = load(model)
    per_op = [candidates(op, g.tensors, H100).candidates for op in g.ops]
    block = next(ch for ch in common_structures(per_op) if ch[0].structure == "block")
    merged = merge_graphs("softmax", [c.graph for c in block], escaping_tensors(g, g.ops))
    optimized, log = optimize(merged)
    assert any(b.level == SHARED for b in optimized.buffers.values())
    assert any(s.rule == "sync-insertion" and "block scope, lifted to shared" in s.detail for s in log)
    feeds, _ = feeds_for(g)
    np.testing.assert_allclose(run(optimized, feeds).outputs["y"], run_reference(g, feeds)["y"], rtol=1e-5, atol=1e-6)


def test_swapping_moves_a_scale_past_the_reduction():
    # Rows of 400: one unit per row reduces cooperatively (short rows go one lane per row: relane).
    t = {"x": Tensor("x", (6, 400), "float32"), "s": Tensor("s", (6, 400), "float32"), "y": Tensor("y", (6, 1), "float32")}
    ops = [BasicOp("scale", "elementwise", ["x"], ["s"], {"expr": Input(0) * 0.25, "dtype": "float32"}, "scale"),
           BasicOp("sum", "reduce", ["s"], ["y"], {"op": "sum", "axes": (1,), "keepdims": True}, "sum")]
    g = BasicGraph(t, ops, ["x"], ["y"], "swap")
    _, graph, log = fused_as(g, ops, ["row", "unit"])
    assert any(s.rule == "swap" for s in log)
    x = rng.standard_normal((6, 400)).astype(np.float32)
    np.testing.assert_allclose(run(graph, {"x": x}).outputs["y"], (x * 0.25).sum(1, keepdims=True), rtol=1e-5)


def test_relane_computes_a_product_on_the_lanes_its_reduction_reads():
    """Short rows reduce one lane per row (vec = row length) while the scale is placed one
    element per lane: merged, the copy between them is a cross-lane transpose no shuffle
    expresses. Relane places the scale and its load as the reduction reads them: no sync left."""
    t = {"x": Tensor("x", (6, 40), "float32"), "s": Tensor("s", (6, 40), "float32"), "y": Tensor("y", (6, 1), "float32")}
    ops = [BasicOp("scale", "elementwise", ["x"], ["s"], {"expr": Input(0) * 0.25, "dtype": "float32"}, "scale"),
           BasicOp("sum", "reduce", ["s"], ["y"], {"op": "sum", "axes": (1,), "keepdims": True}, "sum")]
    _, graph, log = fused_as(BasicGraph(t, ops, ["x"], ["y"], "relane"), ops, ["row", "lane"])
    assert any(s.rule == "relane" for s in log)
    assert not any(isinstance(op, Sync) for _, op in graph.ops())
    scale = next(op for _, op in graph.ops() if isinstance(op, Elementwise))
    load = next(op for _, op in graph.ops() if op.writes()[0].buffer == scale.inputs[0].buffer)
    assert scale.vec == load.vec == 40
    x = rng.standard_normal((6, 40)).astype(np.float32)
    np.testing.assert_allclose(run(graph, {"x": x}).outputs["y"], (x * 0.25).sum(1, keepdims=True), rtol=1e-5)


# -- property test: random chains and DAGs of basic operators --------------------------------------
UNARY = ["exp", "relu", "neg", "tanh", "abs"]


@st.composite
def basic_graphs(draw):
    rows, cols = draw(st.integers(1, 9)), draw(st.integers(1, 70))
    tensors = {"x0": Tensor("x0", (rows, cols), "float32"), "x1": Tensor("x1", (rows, cols), "float32")}
    full = ["x0", "x1"]
    ops = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "rowreduce"]))
        a = draw(st.sampled_from(full))
        out = f"t{i}"
        if kind == "unary":
            expr = call(draw(st.sampled_from(UNARY)), Input(0))
            ops.append(BasicOp(out, "elementwise", [a], [out], {"expr": expr, "dtype": "float32"}, out))
        elif kind == "binary":
            b = draw(st.sampled_from(full))
            ops.append(BasicOp(out, "elementwise", [a, b], [out], {"expr": Input(0) * Input(1) + Input(0), "dtype": "float32"}, out))
        else:
            red = f"r{i}"
            op = draw(st.sampled_from(["sum", "max"]))
            tensors[red] = Tensor(red, (rows, 1), "float32")
            ops.append(BasicOp(red, "reduce", [a], [red], {"op": op, "axes": (1,), "keepdims": True}, red))
            ops.append(BasicOp(out, "elementwise", [a, red], [out], {"expr": Input(0) - Input(1), "dtype": "float32"}, out))
        tensors[out] = Tensor(out, (rows, cols), "float32")
        full.append(out)
    outputs = [full[-1]] + ([full[2]] if len(full) > 3 and draw(st.booleans()) else [])
    return BasicGraph(tensors, ops, ["x0", "x1"], list(dict.fromkeys(outputs)), "random")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=basic_graphs(), pick=st.integers(0, 1000), target=st.sampled_from(["h100", "mi250x"]))
def test_rewriting_preserves_outputs_and_never_adds_dram_traffic(graph, pick, target):
    tgt = get_target(target)
    per_op = [candidates(op, graph.tensors, tgt).candidates for op in graph.ops]
    choices = common_structures(per_op)
    assume(choices)
    chosen = choices[pick % len(choices)]
    merged = merge_graphs("random", [c.graph for c in chosen], escaping_tensors(graph, graph.ops))
    optimized, log = optimize(merged)
    validate(optimized)  # capacities and IR rules still hold
    feeds = {n: rng.standard_normal(graph.tensors[n].shape).astype(np.float32) for n in graph.inputs}
    before, after = run(merged, feeds), run(optimized, feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(after.outputs[name], before.outputs[name], rtol=1e-6, atol=1e-6)
    assert after.stats.dram_bytes() <= before.stats.dram_bytes()
    assert len(log) < 10_000  # the driver reached a fixed point


def test_shufflenet_fragment_is_one_kernel_at_the_bound():
    """Concat, channel shuffle (Reshape, Transpose, Reshape), Split: one kernel, each input read
    once, each output written once."""
    from gir.fusion.compose import compose, copy_candidates
    n, c, h, w = 1, 116, 28, 28
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)
    nodes = [helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
             helper.make_node("Reshape", ["cat", "s1"], ["r1"]),
             helper.make_node("Transpose", ["r1"], ["tr"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["tr", "s2"], ["r2"]),
             helper.make_node("Split", ["r2", "sp"], ["o1", "o2"], axis=1)]
    half = [n, c // 2, h, w]
    model = onnx_model(nodes, [("a", half), ("b", half)], [("o1", half), ("o2", half)],
                       [ints("s1", [n, 2, c // 2, h, w]), ints("s2", [n, c, h, w]), ints("sp", [c // 2, c // 2])])
    g = load(model)
    comp = compose(g)
    assert len(comp.absorbed) == len(g.ops) and sorted(comp.written) == ["o1", "o2"]
    kernels = copy_candidates(g, comp, H100, [])
    assert len(kernels) == 1
    optimized, _ = optimize(kernels[0][0].graph)
    feeds, _ = feeds_for(g)
    want, got = run_reference(g, feeds), run(optimized, feeds).outputs
    for name in ("o1", "o2"):
        np.testing.assert_array_equal(got[name].reshape(want[name].shape), want[name])
    traffic = level_bytes(optimized)
    assert traffic["read"] + traffic["write"] == compulsory_bytes(optimized) == 4 * 4 * np.prod(half)


def _chain(*ops_and_tensors):
    tensors = {name: Tensor(name, shape, "float32") for name, shape in ops_and_tensors[1]}
    return BasicGraph(tensors, ops_and_tensors[0], ["x"], [ops_and_tensors[0][-1].outputs[0]], "chain")


def test_swapping_past_a_sync_replicates_a_scalar_epilogue():
    """sum then 1/sum: the reciprocal moves past the unit sync and runs on every lane."""
    ops = [BasicOp("sum", "reduce", ["x"], ["s"], {"op": "sum", "axes": (1,), "keepdims": True}, "sum"),
           BasicOp("inv", "elementwise", ["s"], ["r"], {"expr": call("recip", Input(0)), "dtype": "float32"}, "inv"),
           BasicOp("scale", "elementwise", ["x", "r"], ["y"], {"expr": Input(0) * Input(1), "dtype": "float32"}, "scale")]
    g = _chain(ops, [("x", (5, 64)), ("s", (5, 1)), ("r", (5, 1)), ("y", (5, 64))])
    first_of_one_warp = next(ch for ch in common_structures([candidates(op, g.tensors, H100).candidates for op in ops])
                             if ch[0].params["units_per_block"] == 1)
    merged = merge_graphs("c", [c.graph for c in first_of_one_warp], {"y"})
    from gir.rewrite import swapping
    from gir.ir import Sync as SyncOp
    trial = merged.copy()
    inv = next(n for n, op in trial.ops() if op.kind == "Elementwise" and "recip" in str(op.expr))
    out = trial.op(inv).out.buffer
    trial.insert_after(inv, SyncOp(scope=1, slice=trial.op(inv).out))
    assert "moved after Sync" in swapping.apply(trial, inv)
    assert trial.op(next(n for n, op in trial.ops() if op.kind == "Elementwise" and "recip" in str(op.expr))).uniform
    x = rng.standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_allclose(run(trial, {"x": x}).outputs["y"], x / x.sum(1, keepdims=True), rtol=1e-5)
    assert out in trial.buffers


def test_swapping_past_a_register_move():
    from gir.ir import DRAM, REGISTER, U, Elementwise, GIRGraph, Move, ParallelPrimitive, Slice
    from gir.rewrite import swapping
    g = GIRGraph("m", ParallelPrimitive((2,), 1), H100)
    g.buffer("x", DRAM, (64,), role="input")
    g.buffer("y", DRAM, (64,), role="output")
    for name in ("a", "b", "c"):
        g.buffer(name, REGISTER, 32)
    g.add(Move(src=Slice.flat("x", 32 * U, 32), dst=Slice.flat("a", 0, 32)))
    e = g.add(Elementwise(expr=Input(0) * 2.0, inputs=(Slice.flat("a", 0, 32),), out=Slice.flat("b", 0, 32)))
    g.add(Move(src=Slice.flat("b", 0, 32), dst=Slice.flat("c", 0, 32)))
    g.add(Move(src=Slice.flat("c", 0, 32), dst=Slice.flat("y", 32 * U, 32)))
    assert "moved after Move" in swapping.apply(g, e)
    x = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(run(g, {"x": x}).outputs["y"], 2 * x)
