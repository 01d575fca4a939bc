"""Planning scale (issue 22, item 2): long elementwise chains plan in time linear in their
length, deep expressions never reach Python's recursion limit, and no Elementwise gOperator
carries more than MAX_OPS operations (C compilers are superlinear in a basic block's length)."""
import pickle
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import gir
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import Elementwise
from gir.ir.expr import MAX_OPS, Const, Input, call, count_ops, depth, evaluate, inputs_of, split, substitute
from gir.ir.target import get_target
from gir.runtime import execute


def chain_model(n: int, op: str = "Relu", shape=(4, 33)):
    """n nodes in a line; Add reads the chain and the graph input x at every step."""
    nodes, prev = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node(op, [prev, "x"] if op == "Add" else [prev], [out], name=f"n{i}"))
        prev = out
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _elementwise_ops(p):
    return [op for k in p.kernels for _, op in k.graph.ops() if isinstance(op, Elementwise)]


@pytest.mark.parametrize("op", ["Relu", "Add"])
def test_chain_of_300_runs_on_cpu_and_matches_onnxruntime(op):
    model = chain_model(300, op)
    x = np.random.default_rng(3).standard_normal((4, 33)).astype(np.float32)
    got = gir.Session(model, target="cpu").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, _ort(model, {"x": x}), rtol=1e-5, atol=1e-5)


def test_chain_of_1000_is_one_kernel_of_bounded_expressions_on_sm90():
    p = plan(load(chain_model(1000, "Add")), get_target("cuda:sm_90"))
    assert len(p.kernels) == 1  # the intermediates stay in registers
    ew = _elementwise_ops(p)
    assert len(ew) >= 1000 // MAX_OPS and all(count_ops(e.expr) <= MAX_OPS for e in ew)
    x = np.random.default_rng(4).standard_normal((4, 33)).astype(np.float32)
    want = x.copy()
    for _ in range(1000):
        want = want + x  # float32, in the chain's order
    np.testing.assert_array_equal(execute(p, {"x": x})["y"], want)


def test_short_runs_are_left_to_the_rewrite():
    """A run shorter than LONG_RUN keeps its ops (commute and recompute see models as before)."""
    from gir.fusion.chains import LONG_RUN, compose_elementwise_runs
    from gir.fusion.partition import partition
    for n, composed in ((LONG_RUN - 1, False), (LONG_RUN, True)):
        part = partition(load(chain_model(n)), get_target("cpu"))
        g, subs = compose_elementwise_runs(part.graph, part.subgraphs)
        assert (len(g.ops) == 1) == composed and sum(map(len, subs)) == len(g.ops)


def test_deep_expressions_never_recurse():
    deep = 20 * sys.getrecursionlimit()
    e = Input(0)
    for _ in range(deep):
        e = call("relu", call("add", e, Input(1)))
    assert depth(e) == count_ops(e) == 2 * deep and inputs_of(e) == {0, 1}
    again = pickle.loads(pickle.dumps(e))
    assert again == e and hash(again) == hash(e) and str(again) == str(e) and repr(e).startswith("Call(op='relu'")
    assert substitute(e, {1: Const(0.0)}) != e
    x, b = np.array([-3.0, 2.0], np.float32), np.array([0.5, -0.25], np.float32)
    want = x
    for _ in range(deep):
        want = np.maximum(want + b, np.float32(0))
    np.testing.assert_array_equal(evaluate(e, [x, b]), want)


def test_split_pieces_are_bounded_and_compute_the_same():
    e = Input(0)
    for i in range(1000):
        e = call("add", call("mul", e, Const(0.5)), Input(1)) if i % 2 else call("max", e, Input(1))
    pieces = split(e, ["float32", "float32"], "float32")
    assert len(pieces) > 1 and all(count_ops(p) <= MAX_OPS for p, _ in pieces)
    rng = np.random.default_rng(5)
    values = [rng.standard_normal(16).astype(np.float32) for _ in range(2)]
    want = evaluate(e, values)
    for p, operands in pieces:
        values.append(evaluate(p, [values[j] for j in operands]))
    np.testing.assert_array_equal(values[-1], want)


def _softmax_ladder(n: int, shape=(4, 33)):
    """n Softmax ops in a line, each followed by Add(previous, Relu(previous)): ops that no
    chain composes (each value has two readers), so one greedy group would hold all 4n."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes += [helper.make_node("Softmax", [prev], [f"s{i}"], axis=-1),
                  helper.make_node("Relu", [f"s{i}"], [f"r{i}"]),
                  helper.make_node("Add", [f"s{i}", f"r{i}"], ["y" if i == n - 1 else f"a{i}"])]
        prev = f"a{i}"
    g = helper.make_graph(nodes, "ladder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


@pytest.mark.parametrize("cap", [6, 24])
def test_groups_are_cut_at_the_group_size_limit(monkeypatch, cap):
    """Rewriting a group is quadratic in its size: the greedy grouping closes a group at
    $GIR_MAX_GROUP_OPS basic ops, names the cut in the excess, and the numbers stay right."""
    monkeypatch.setenv("GIR_MAX_GROUP_OPS", str(cap))
    m = _softmax_ladder(8)
    g = load(m)
    p = plan(g, get_target("cpu"), limit=1)
    assert all(len(k.ops) <= cap for k in p.kernels)
    assert len(p.kernels) >= len(g.ops) // cap
    reasons = {e.reason for s in p.subgraphs for e in s.excess}
    assert any("group size limit" in r for r in reasons), reasons
    x = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32)
    (y,) = gir.Session(m, target="cpu").run(None, {"x": x})
    np.testing.assert_allclose(y, _ort(m, {"x": x}), rtol=1e-5, atol=1e-6)
