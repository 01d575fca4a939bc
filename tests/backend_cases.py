"""The graphs every backend is checked on, shared by test_emitters.py and the conformance
suite (tests/conformance): the basic-operator cases of test_templates.py, seeded inputs, fused
Softmax / LayerNormalization / GELU chains after merging and rewriting, and the tolerance
every emitted kernel is held to against the reference interpreter."""
from __future__ import annotations

import zlib

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import test_templates as tt
from gir.frontend import load
from gir.frontend.basic import BasicOp
from gir.fusion.group import common_structures, escaping_tensors, fuse
from gir.fusion.merge import merge_graphs
from gir.ir import DEVICE, Input, Sync, call
from gir.rewrite import optimize
from gir.templates import candidates


def _params(fn, names: str):
    return next(m.args[1] for m in fn.pytestmark if m.name == "parametrize" and m.args[0] == names)


PAD_MODES = _params(tt.test_pad, "mode")
PAD_SHAPES = _params(tt.test_pad, "shape,pads")


def template_cases() -> dict[str, tuple[BasicOp, dict]]:
    """name -> (basic operator, its tensors): every kind, dtype and shape test_templates covers."""
    cases = {}
    for a, b in _params(tt.test_elementwise_broadcasting, "a,b"):
        out = tuple(np.broadcast_shapes(a, b))
        ts = {"a": tt.T("a", a), "b": tt.T("b", b), "y": tt.T("y", out)}
        cases[f"elementwise-{a}-{b}"] = (tt.ew("add_mul", (Input(0) + Input(1)) * Input(0), [ts["a"], ts["b"]], out), ts)
    ts = {"a": tt.T("a", (3, 70), "float16"), "y": tt.T("y", (3, 70), "float16")}
    gelu = Input(0) * 0.5 * (1 + call("erf", Input(0) / 1.4142135))
    cases["elementwise-fp16-gelu"] = (tt.ew("gelu", gelu, [ts["a"]], (3, 70), "float16"), ts)
    kinds = ["sum", "max", "min", "prod"]
    for i, (shape, axes) in enumerate(tt.REDUCE_CASES):
        for kind in (kinds[i % 4], kinds[(i + 1) % 4]):  # every kind twice over the shapes
            out = tuple(d for j, d in enumerate(shape) if j not in axes)
            ts = {"x": tt.T("x", shape), "y": tt.T("y", out)}
            cases[f"reduce-{kind}-{shape}-{axes}"] = (
                BasicOp("r", "reduce", ["x"], ["y"], {"op": kind, "axes": axes, "keepdims": False}, "r"), ts)
    x = np.full((2, 4096), 0.1, np.float16)
    ts = {"x": tt.T("x", x.shape, "float16", x), "y": tt.T("y", (2,), "float16")}
    cases["reduce-fp16-accumulates-in-fp32"] = (BasicOp("r", "reduce", ["x"], ["y"], {"op": "sum", "axes": (1,), "keepdims": False}, "r"), ts)
    for i, (shape, offset, vshape, vstrides, _) in enumerate(tt.LAYOUTS):
        ts = {"x": tt.T("x", shape), "y": tt.T("y", vshape)}
        cases[f"layout-{i}"] = (BasicOp("l", "layout", ["x"], ["y"], {"offset": offset, "shape": vshape, "strides": vstrides}, "l"), ts)
    for shapes, axis in _params(tt.test_concat, "shapes,axis"):
        names = [f"in{i}" for i in range(len(shapes))]
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
        ts = {n: tt.T(n, s) for n, s in zip(names, shapes)} | {"y": tt.T("y", out)}
        cases[f"concat-{shapes}"] = (BasicOp("c", "concat", names, ["y"], {"axis": axis}, "c"), ts)
    for mode in PAD_MODES:
        for shape, pads in PAD_SHAPES:
            out = tuple(n + a + b for n, (a, b) in zip(shape, pads))
            ts = {"x": tt.T("x", shape), "y": tt.T("y", out)}
            cases[f"pad-{mode}-{shape}"] = (BasicOp("p", "pad", ["x"], ["y"], {"pads": pads, "mode": mode, "value": 1.5}, "p"), ts)
    for dshape, idx, axis in _params(tt.test_gather, "dshape,idx,axis"):
        idx = np.array(idx, np.int64)
        out = dshape[:axis] + idx.shape + dshape[axis + 1:]
        ts = {"d": tt.T("d", dshape), "i": tt.T("i", idx.shape, "int64", idx), "y": tt.T("y", out)}
        cases[f"gather-{dshape}-{axis}"] = (BasicOp("g", "gather", ["d", "i"], ["y"], {"axis": axis}, "g"), ts)
    return cases


def seeded_feeds(op, ts, seed: str) -> dict:
    """test_templates.random_feed's values, from a generator per case: any selection of tests
    sees the same inputs."""
    rng = np.random.default_rng(zlib.crc32(seed.encode()))

    def feed(t):
        if t.value is not None:
            return t.value
        if t.dtype.startswith("int"):
            return rng.integers(-3, 3, t.shape).astype(t.dtype)
        return rng.standard_normal(t.shape).astype(t.dtype)
    return {n: feed(ts[n]) for n in op.inputs}


def compare(got: dict, want: dict, label: str) -> None:
    for name, w in want.items():
        g = got[name].reshape(w.shape)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=f"{label}: {name}")
            continue
        tol = 2e-3 if w.dtype == np.float16 else 1e-4
        scale = max(1.0, float(np.nanmax(np.abs(w.astype(np.float64)), initial=0)))  # long sums drift with size
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol * scale,
                                   err_msg=f"{label}: {name}")


# -- fused chains -----------------------------------------------------------------------------------
CHAINS = ("softmax", "layernorm", "gelu")


def onnx_model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def basic_graph(model: str, shape: tuple):
    rng = np.random.default_rng(11)
    f = shape[-1]
    if model == "softmax":
        return load(onnx_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", shape)], [("y", shape)]))
    if model == "layernorm":
        inits = [numpy_helper.from_array(rng.standard_normal(f).astype(np.float32), n) for n in ("g", "b")]
        node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)
        return load(onnx_model([node], [("x", shape)], [("y", shape)], inits))
    consts = {"bias": rng.standard_normal(f).astype(np.float32), "sq": np.array(1.4142135, np.float32),
              "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Add", ["x", "bias"], ["h"]), helper.make_node("Div", ["h", "sq"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["p"]),
             helper.make_node("Mul", ["h", "p"], ["q"]), helper.make_node("Mul", ["q", "half"], ["y"])]
    return load(onnx_model(nodes, [("x", shape)], [("y", shape)], [numpy_helper.from_array(v, k) for k, v in consts.items()]))


def fused_graph(model: str, shape: tuple, target, structure: str | None):
    """The chain fused for `target` (a Target): fuse()'s choice, or, among the merged-and-
    rewritten graphs of the common structures named `structure`, the one with the most kernels
    (the emitter must carry registers across them)."""
    g = basic_graph(model, shape)
    if structure is None:
        graph = fuse(g, g.ops, target).graph
    else:
        per_op = [candidates(op, g.tensors, target).candidates for op in g.ops]
        graphs = [optimize(merge_graphs(model, [c.graph for c in ch], escaping_tensors(g, g.ops)))[0]
                  for ch in common_structures(per_op) if ch[0].structure == structure]
        if not graphs:
            raise LookupError(f"{model}: no common {structure!r} structure on {target.name}")
        graph = max(graphs, key=lambda x: sum(isinstance(op, Sync) and op.scope == DEVICE for _, op in x.ops()))
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal(g.tensors[n].shape).astype(np.float32) for n in g.inputs}
    return graph, feeds | {n: t.value for n, t in g.tensors.items() if t.value is not None}


def attention_model(seq: int, heads: int, dim: int, seed: int = 12):
    """Self-attention over token-major q, k, v (BERT's layout): heads split, scaled QK^T plus a
    mask, softmax, P @ V, heads merged back."""
    import onnx
    rng = np.random.default_rng(seed)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, seq, heads * dim]) for n in ("xq", "xk", "xv")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(np.array([1, seq, heads, dim]), "split_heads"),
             numpy_helper.from_array(np.array([1, seq, heads * dim]), "merge_heads"),
             numpy_helper.from_array(np.array(dim ** 0.5, np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal((1, 1, 1, seq)).astype(np.float32), "mask")]
    nodes = [helper.make_node("Reshape", [f"x{n}", "split_heads"], [f"{n}4"]) for n in "qkv"]
    nodes += [helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qt", "kt"], ["scores"]), helper.make_node("Div", ["scores", "scale"], ["scaled"]),
              helper.make_node("Add", ["scaled", "mask"], ["masked"]), helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["ctx"]), helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merge_heads"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "attention", inputs, [y], inits),
                              opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def planned_attention(target) -> tuple:
    """The largest kernel of the attention model planned for `target` (a Target; on the GPUs the
    whole attention in one kernel: scores and probabilities in registers and shared memory)."""
    from gir.fusion.plan import plan
    g = load(attention_model(seq=64, heads=2, dim=32))
    kernel = max(plan(g, target, limit=2).kernels, key=lambda k: len(k.ops))
    rng = np.random.default_rng(5)
    feeds = {b.name: g.tensors[b.name].value if g.tensors[b.name].value is not None
             else rng.standard_normal(b.shape).astype(np.float32)
             for b in kernel.graph.buffers.values() if b.role in ("input", "const")}
    return kernel.graph, feeds
