"""Every candidate of every template, on hand-built basic operators with awkward shapes,
run in the reference interpreter and compared with numpy (the per-op ONNX check against
onnxruntime is in test_templates_onnx.py)."""
import numpy as np
import pytest

from gir.frontend.basic import BasicOp, Tensor
from gir.ir import Input, call, get_target, run
from gir.templates import TemplateError, candidates

TARGETS = ["h100", "mi250x", "cpu"]
rng = np.random.default_rng(7)


def T(name, shape, dtype="float32", value=None):
    return Tensor(name, tuple(shape), dtype, value)


def random_feed(t):
    if t.value is not None:
        return t.value
    if t.dtype.startswith("int"):
        return rng.integers(-3, 3, t.shape).astype(t.dtype)
    return rng.standard_normal(t.shape).astype(t.dtype)


def check_all(op, tensors, reference, target, rtol=1e-5, atol=1e-5):
    found = candidates(op, tensors, get_target(target))
    assert found.candidates, found.rejected
    feeds = {n: random_feed(tensors[n]) for n in op.inputs}
    want = reference(*[feeds[n] for n in op.inputs])
    for cand in found.candidates:
        got = run(cand.graph, feeds).outputs[op.outputs[0]].reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{op.name} {cand.label} on {target}")
    return found


def ew(name, expr, ins, out_shape, dtype="float32"):
    return BasicOp(name, "elementwise", [t.name for t in ins], ["y"], {"expr": expr, "dtype": dtype}, name)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("a,b", [((7, 33), (33,)), ((5, 1, 3), (1, 4, 1)), ((1,), (129,)), ((2, 3, 65), (2, 3, 65))])
def test_elementwise_broadcasting(target, a, b):
    out = tuple(np.broadcast_shapes(a, b))
    ts = {"a": T("a", a), "b": T("b", b), "y": T("y", out)}
    op = ew("add_mul", (Input(0) + Input(1)) * Input(0), [ts["a"], ts["b"]], out)
    check_all(op, ts, lambda x, y: (x + y) * x, target)


@pytest.mark.parametrize("target", ["h100", "mi250x"])
def test_elementwise_fp16_storage_computes_in_fp32(target):
    ts = {"a": T("a", (3, 70), "float16"), "y": T("y", (3, 70), "float16")}
    op = ew("gelu", Input(0) * 0.5 * (1 + call("erf", Input(0) / 1.4142135)), [ts["a"]], (3, 70), "float16")
    from math import erf
    ref = lambda x: (x.astype(np.float32) * 0.5 * (1 + np.vectorize(erf)(x.astype(np.float32) / 1.4142135))).astype(np.float16)
    check_all(op, ts, ref, target, rtol=1e-3, atol=1e-3)


REDUCE_CASES = [((7, 33), (1,)), ((6, 5, 4), (0, 2)), ((3, 2000), (1,)), ((4, 70000), (1,)), ((9,), (0,)),
                ((130, 3), (0,)), ((2, 1, 5), (1,)), ((4, 3, 8, 8), (2, 3)),
                ((3, 4096), (1,))]  # block reductions with 16-byte loads (vec 4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,axes", REDUCE_CASES)
@pytest.mark.parametrize("kind", ["sum", "max", "min", "prod"])
def test_reduce_every_structure(target, shape, axes, kind):
    out = tuple(d for i, d in enumerate(shape) if i not in axes)
    ts = {"x": T("x", shape), "y": T("y", out)}
    op = BasicOp("r", "reduce", ["x"], ["y"], {"op": kind, "axes": axes, "keepdims": False}, "r")
    fn = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[kind]
    scale = 1.0 if kind != "prod" else 1.0
    check_all(op, ts, lambda x: fn(x * scale, axis=axes), target, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("order", [(1, 0, 2), (2, 0, 1)])
def test_reduce_writes_its_result_transposed_by_order(target, order):
    """A planner-made `order` (P @ V's heads transposed back to tokens): every structure writes
    the permuted result directly, also where the innermost kept dimension moves."""
    shape = (3, 4, 40, 6)
    out = tuple((3, 4, 40)[i] for i in order)
    ts = {"x": T("x", shape), "y": T("y", out)}
    op = BasicOp("r", "reduce", ["x"], ["y"], {"op": "sum", "axes": (3,), "keepdims": False, "order": order}, "r")
    check_all(op, ts, lambda x: np.sum(x, axis=3).transpose(order), target, rtol=1e-4, atol=1e-4)


def test_reduce_offers_all_four_structures_for_long_rows():
    ts = {"x": T("x", (4, 70000)), "y": T("y", (4,))}
    op = BasicOp("r", "reduce", ["x"], ["y"], {"op": "sum", "axes": (1,), "keepdims": False}, "r")
    assert set(candidates(op, ts, get_target("h100")).structures) == {"block", "two_phase"}
    ts = {"x": T("x", (64, 2000)), "y": T("y", (64,))}
    assert set(candidates(op, ts, get_target("h100")).structures) == {"unit", "block"}
    ts = {"x": T("x", (512, 16)), "y": T("y", (512,))}
    assert set(candidates(op, ts, get_target("h100")).structures) == {"lane", "unit"}


def test_reduce_fp16_accumulates_in_fp32():
    x = np.full((2, 4096), 0.1, np.float16)
    ts = {"x": T("x", x.shape, "float16", x), "y": T("y", (2,), "float16")}
    op = BasicOp("r", "reduce", ["x"], ["y"], {"op": "sum", "axes": (1,), "keepdims": False}, "r")
    for cand in candidates(op, ts, get_target("h100")).candidates:
        got = run(cand.graph, {"x": x}).outputs["y"]
        np.testing.assert_allclose(got.astype(np.float32), 409.5, rtol=2e-3)  # fp16 accumulation would stall at 256


LAYOUTS = [  # (input shape, view offset, view shape, view strides, numpy reference)
    ((3, 40, 50), 0, (3, 50, 40), (2000, 1, 50), lambda x: x.transpose(0, 2, 1)),
    ((10,), 9, (4,), (-2,), lambda x: x[9::-2][:4]),
    ((5, 7), 0, (3, 5, 7), (0, 7, 1), lambda x: np.broadcast_to(x, (3, 5, 7))),
    ((2, 3, 4, 5), 0, (2, 5, 3, 4), (60, 1, 20, 5), lambda x: x.transpose(0, 3, 1, 2)),
    ((33, 70), 0, (70, 33), (1, 70), lambda x: x.T),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", range(len(LAYOUTS)))
def test_layout_views(target, case):
    shape, offset, vshape, vstrides, ref = LAYOUTS[case]
    ts = {"x": T("x", shape), "y": T("y", vshape)}
    op = BasicOp("l", "layout", ["x"], ["y"], {"offset": offset, "shape": vshape, "strides": vstrides}, "l")
    found = check_all(op, ts, lambda x: ref(x).copy(), target)
    if target == "h100" and case in (0, 4):
        assert "tile" in found.structures  # transposes get a shared-memory candidate


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shapes,axis", [(((2, 3, 5), (2, 7, 5)), 1), (((4, 1), (4, 3), (4, 2)), 1), (((3,), (100,)), 0)])
def test_concat(target, shapes, axis):
    names = [f"in{i}" for i in range(len(shapes))]
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    ts = {n: T(n, s) for n, s in zip(names, shapes)} | {"y": T("y", out)}
    op = BasicOp("c", "concat", names, ["y"], {"axis": axis}, "c")
    check_all(op, ts, lambda *xs: np.concatenate(xs, axis), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("shape,pads", [((2, 5, 6), ((0, 0), (1, 2), (3, 0))), ((7,), ((2, 3),)), ((1, 3, 4, 4), ((0, 0), (0, 0), (1, 1), (2, 2)))])
def test_pad(target, mode, shape, pads):
    out = tuple(n + a + b for n, (a, b) in zip(shape, pads))
    ts = {"x": T("x", shape), "y": T("y", out)}
    op = BasicOp("p", "pad", ["x"], ["y"], {"pads": pads, "mode": mode, "value": 1.5}, "p")
    kw = {"constant_values": 1.5} if mode == "constant" else {}
    check_all(op, ts, lambda x: np.pad(x, pads, mode=mode, **kw), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dshape,idx,axis", [((5, 6), [[0, -1, 2], [4, 4, 1]], 0), ((5, 6), [0, -1, 2, 5], 1),
                                            ((30000, 8), [3, 29999, 7], 0)])
def test_gather(target, dshape, idx, axis):
    idx = np.array(idx, np.int64)
    out = dshape[:axis] + idx.shape + dshape[axis + 1:]
    ts = {"d": T("d", dshape), "i": T("i", idx.shape, "int64", idx), "y": T("y", out)}
    op = BasicOp("g", "gather", ["d", "i"], ["y"], {"axis": axis}, "g")
    check_all(op, ts, lambda d, i: np.take(d, np.where(i < 0, i + dshape[axis], i), axis=axis), target)


def test_gather_index_out_of_range_is_an_error():
    from gir.ir import InterpreterError
    ts = {"d": T("d", (5, 6)), "i": T("i", (1,), "int64", np.array([5])), "y": T("y", (1, 6))}
    op = BasicOp("g", "gather", ["d", "i"], ["y"], {"axis": 0}, "node 'g' (Gather)")
    cand = candidates(op, ts, get_target("h100")).candidates[0]
    with pytest.raises(InterpreterError, match="index 5 outside"):
        run(cand.graph, {"d": np.zeros((5, 6), np.float32), "i": np.array([5])})


@pytest.mark.parametrize("target,dialect", [("h100", "cuda"), ("mi250x", "hip")])
@pytest.mark.parametrize("index", [5, -6, 10**6])
def test_gpu_kernels_report_an_out_of_range_gather_index(target, dialect, index):
    """The emitted CUDA/HIP kernel clamps the index (memory stays safe) and sets its flag
    parameter; the caller raises. An index in range leaves the flag alone."""
    from gir.backends.errors import IndexOutOfRange
    from gir.backends.harness.graph_runner import run_on_cpu_harness
    ts = {"d": T("d", (5, 6)), "i": T("i", (3,), "int64", np.array([0, 1, 2])), "y": T("y", (3, 6))}
    op = BasicOp("g", "gather", ["d", "i"], ["y"], {"axis": 0}, "g")
    d = np.arange(30, dtype=np.float32).reshape(5, 6)
    for cand in candidates(op, ts, get_target(target)).candidates:
        got = run_on_cpu_harness(cand.graph, {"d": d, "i": np.array([4, -5, 0])}, dialect)
        np.testing.assert_array_equal(got["y"], d[[4, 0, 0]])
        with pytest.raises(IndexOutOfRange, match="Gather index is outside"):
            run_on_cpu_harness(cand.graph, {"d": d, "i": np.array([0, index, 1])}, dialect)


def test_no_template_for_library_ops_names_the_node():
    ts = {"a": T("a", (2, 3)), "b": T("b", (3, 4)), "y": T("y", (2, 4))}
    op = BasicOp("mm", "matmul", ["a", "b"], ["y"], {}, "node '/mm' (MatMul, ai.onnx opset 17)")
    with pytest.raises(TemplateError, match=r"node '/mm' \(MatMul.*no GIR template"):
        candidates(op, ts, get_target("h100"))
