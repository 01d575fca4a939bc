"""Issue 21's set-A ops (GatherND, ArgMax/ArgMin, CumSum, Trilu, Mod, Range, Dropout, Cast and
CastLike between the integer, bool and float types) on odd shapes: gir.Session on the CPU
(the emitted C, run natively) against onnxruntime, and the same model planned for cuda:sm_90,
run by the reference interpreter and built by NVRTC, as `gir compile --target cuda:sm_90` does."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
from gir.build import build_steps
from gir.frontend import load
from gir.frontend.errors import FrontendError, UnsupportedOpError
from gir.fusion.plan import plan
from gir.ir.target import get_target
from gir.runtime import execute

RNG = np.random.default_rng(21)


def _model(nodes, feeds, outputs=("y",), inits=None, opset=18):
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    outs = [helper.make_tensor_value_info(o, 0, None) for o in outputs]
    graph = helper.make_graph(nodes, "m", inputs, outs,
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def _check(nodes, feeds, outputs=("y",), inits=None, opset=18, want=None, compile_cuda=False):
    """Native CPU session and the cuda:sm_90 plan (interpreted) against onnxruntime (or `want`)."""
    model = _model(nodes, feeds, outputs, inits, opset)
    if want is None:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(list(outputs), feeds)
    got = gir.Session(model, target="cpu").run(list(outputs), feeds)
    for g, w in zip(got, want):
        _same(g, w)
    p = plan(load(model), get_target("cuda:sm_90"))
    env = execute(p, feeds)
    for name, w in zip(outputs, want):
        _same(env[name], w)
    if compile_cuda:
        assert build_steps(p), "no kernel was built"
    return p


def _node(op, ins, outs=("y",), **attrs):
    return helper.make_node(op, list(ins), list(outs), **attrs)


def _floats(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---- GatherND -------------------------------------------------------------------------------

@pytest.mark.parametrize("data,indices,batch_dims", [
    ((5, 7, 3), (4, 2), 0),          # tuples of 2 into a 3-d tensor: rows of 3
    ((4, 5, 6), (2,), 0),            # one tuple, rank-1 indices: a scalar row number
    ((2, 3, 5, 4), (2, 6, 1), 1),    # per batch, one coordinate
    ((3, 4, 5), (3, 2, 2), 1),       # per batch, full tuples: elements
    ((2, 3, 5, 7), (2, 3, 4, 1), 2),  # two batch dims
])
def test_gathernd_runtime_indices_with_negatives(data, indices, batch_dims):
    x = _floats(*data)
    dims = np.asarray(data[batch_dims:batch_dims + indices[-1]])
    idx = RNG.integers(-dims, dims, size=indices).astype(np.int64)
    _check([_node("GatherND", ["x", "i"], batch_dims=batch_dims)], {"x": x, "i": idx}, compile_cuda=batch_dims == 1)


def test_gathernd_constant_indices_fold_to_a_constant_gather():
    """What torch's dynamo exporter writes for x[:, [0, -1]]-like indexing: constant index tuples."""
    x = _floats(3, 6, 5)
    idx = np.array([[[0, -1], [2, 3]], [[1, 0], [-3, 5]]], np.int64)  # (2, 2, 2) tuples into (3, 6)
    p = _check([_node("GatherND", ["x", "i"])], {"x": x}, inits={"i": idx})
    gathers = [op for op in p.graph.ops if op.kind == "gather"]
    assert len(gathers) == 1 and p.graph.tensors[gathers[0].inputs[1]].value is not None


def test_gathernd_constant_regular_indices_are_a_strided_view():
    """torch's dynamo export of BERT's mask expansion: GatherND with constant tuples that pick
    x[:, None, None, :] (and a reversed, strided pick): a view or a layout, no gather."""
    x = _floats(2, 8)
    ii, jj = np.meshgrid(np.arange(2), np.arange(8), indexing="ij")
    expand = np.stack([ii, jj], -1).reshape(2, 1, 1, 8, 2).astype(np.int64)
    reverse = np.stack([ii[:, ::-2], jj[:, ::-2] - 8], -1).astype(np.int64)  # negative indices too
    for idx in (expand, reverse):
        p = _check([_node("GatherND", ["x", "i"])], {"x": x}, inits={"i": idx})
        assert {op.kind for op in p.graph.ops} <= {"view", "layout"}  # the expand is only a reshape


def test_gathernd_constant_index_out_of_range_is_a_clean_error():
    model = _model([_node("GatherND", ["x", "i"])], {"x": _floats(3, 4)}, inits={"i": np.array([[1, 4]], np.int64)})
    with pytest.raises(FrontendError, match="GatherND.*out of range"):
        load(model)


# ---- ArgMax / ArgMin ------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(1, 0, 0), (-1, 1, 1), (0, 1, 0), (2, 0, 1)])
def test_argmax_argmin_with_ties(op, axis, keepdims, last):
    x = RNG.integers(-3, 4, size=(3, 5, 7)).astype(np.float32)  # few values: many ties
    _check([_node(op, ["x"], axis=axis, keepdims=keepdims, select_last_index=last)], {"x": x})


def test_argmax_int32_input():
    x = RNG.integers(-50, 50, size=(6, 9)).astype(np.int32)
    _check([_node("ArgMax", ["x"], axis=1, keepdims=0)], {"x": x}, compile_cuda=True)


# ---- CumSum ---------------------------------------------------------------------------------

@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [1, -1])
def test_cumsum_every_direction(axis, exclusive, reverse):
    x = _floats(3, 5, 4)
    _check([_node("CumSum", ["x", "a"], exclusive=exclusive, reverse=reverse)], {"x": x},
           inits={"a": np.array(axis, np.int64)})


@pytest.mark.parametrize("shape,axis,exclusive,reverse", [((3, 200, 5), 1, 0, 0), ((3, 200, 5), 1, 1, 1),
                                                         ((2, 2100), -1, 1, 0)])
def test_cumsum_long_axis_goes_by_blocks(shape, axis, exclusive, reverse):
    """Past SCAN_DIRECT the axis is cut into zero-padded blocks (2100: a recursive second level)."""
    x = RNG.integers(-9, 10, size=shape).astype(np.int64)
    p = _check([_node("CumSum", ["x", "a"], exclusive=exclusive, reverse=reverse)], {"x": x},
               inits={"a": np.array(axis, np.int64)})
    assert any(op.kind == "pad" for op in p.graph.ops)


def test_cumsum_int32_over_the_first_axis():
    x = RNG.integers(-9, 10, size=(7, 3)).astype(np.int32)
    _check([_node("CumSum", ["x", "a"])], {"x": x}, inits={"a": np.array([0], np.int32)}, compile_cuda=True)


def test_cumsum_axis_must_be_constant():
    model = _model([_node("CumSum", ["x", "a"])], {"x": _floats(3, 4), "a": np.array(0, np.int64)})
    with pytest.raises(FrontendError, match="must be a constant"):
        load(model)


# ---- Trilu ----------------------------------------------------------------------------------

@pytest.mark.parametrize("upper,k", [(1, 0), (1, 2), (0, -1), (0, 7), (1, -9)])
def test_trilu_batched(upper, k):
    x = _floats(2, 3, 5, 4)
    _check([_node("Trilu", ["x", "k"], upper=upper)], {"x": x}, inits={"k": np.array(k, np.int64)})


@pytest.mark.parametrize("upper,k", [(1, -2), (0, 3)])
def test_trilu_runtime_k(upper, k):
    x = _floats(3, 4, 6)
    _check([_node("Trilu", ["x", "k"], upper=upper)], {"x": x, "k": np.array(k, np.int64)})


def test_trilu_default_k_on_int64():
    x = RNG.integers(-9, 10, size=(3, 6)).astype(np.int64)
    _check([_node("Trilu", ["x"], upper=0)], {"x": x}, compile_cuda=True)


# ---- Mod ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_mod_python_and_c_semantics(dtype, fmod):
    a = RNG.integers(-40, 40, size=(3, 5)).astype(dtype)
    b = RNG.integers(-7, 8, size=(5,)).astype(dtype)
    b[b == 0] = 3
    _check([_node("Mod", ["a", "b"], fmod=fmod)], {"a": a, "b": b}, compile_cuda=dtype is np.int32 and fmod == 0)


def test_uint8_mod():
    a = RNG.integers(0, 255, size=(4, 5)).astype(np.uint8)
    b = RNG.integers(1, 20, size=(4, 5)).astype(np.uint8)
    _check([_node("Mod", ["a", "b"])], {"a": a, "b": b})


def test_float_fmod():
    a, b = _floats(4, 6) * 10, _floats(6) * 3
    _check([_node("Mod", ["a", "b"], fmod=1)], {"a": a, "b": b})


def test_float_mod_fmod0_is_numpy_mod_with_inf_and_nan():
    """onnx's reference (np.mod); onnxruntime refuses fmod=0 on floats."""
    a = np.array([[5.5, -5.5, 5.5, -5.5, 3.0, -1.0, np.inf, 2.0, 0.0]], np.float32)
    b = np.array([[2.0, 2.0, -2.0, -2.0, 0.0, np.inf, 1.0, np.nan, -3.0]], np.float32)
    _check([_node("Mod", ["a", "b"])], {"a": a, "b": b}, want=[np.mod(a, b)])


# ---- Range ----------------------------------------------------------------------------------

def test_range_of_constants_is_folded():
    inits = {"s": np.array(1.5, np.float32), "l": np.array(-4.0, np.float32), "d": np.array(-0.75, np.float32)}
    x = _floats(8)
    p = _check([_node("Range", ["s", "l", "d"], ["r"]), _node("Add", ["x", "r"])], {"x": x}, inits=inits)
    assert all(op.kind == "elementwise" for op in p.graph.ops)


def test_range_of_runtime_values_is_refused_as_unsupported():
    feeds = {"s": np.array(0, np.int64), "l": np.array(5, np.int64), "d": np.array(1, np.int64)}
    model = _model([_node("Range", ["s", "l", "d"])], feeds)
    with pytest.raises(UnsupportedOpError, match="Range.*run-time data"):
        load(model)


# ---- Dropout --------------------------------------------------------------------------------

def test_dropout_in_inference_is_identity_with_an_all_true_mask():
    x = _floats(3, 7)
    _check([_node("Dropout", ["x", "r", "t"], ["y", "mask"]), ],
           {"x": x}, outputs=("y", "mask"), inits={"r": np.array(0.3, np.float32), "t": np.array(False)})


def test_dropout_in_training_mode_is_refused():
    model = _model([_node("Dropout", ["x", "r", "t"])], {"x": _floats(3)},
                   inits={"r": np.array(0.3, np.float32), "t": np.array(True)})
    with pytest.raises(UnsupportedOpError, match="training_mode"):
        load(model)


# ---- Cast / CastLike ------------------------------------------------------------------------

ONNX = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE,
        np.int64: TensorProto.INT64, np.int32: TensorProto.INT32, np.int8: TensorProto.INT8,
        np.uint8: TensorProto.UINT8, np.bool_: TensorProto.BOOL}
# float -> integer truncates toward zero; values are kept inside the target's range, where ONNX
# defines the result (outside it the spec leaves it undefined, and CUDA saturates where x86 wraps)
FLOAT_SOURCE = np.array([[-100.75, -3.5, -0.99, -0.0, 0.0, 0.4, 1.5, 2.99, 100.7, 127.0]], np.float32)


@pytest.mark.parametrize("to", [np.int8, np.int32, np.int64, np.bool_, np.float16])
def test_cast_float_to_integer_truncates_and_to_bool_is_nonzero(to):
    x = np.concatenate([FLOAT_SOURCE, FLOAT_SOURCE[:, ::-1] * 0.5])
    _check([_node("Cast", ["x"], to=ONNX[to])], {"x": x}, compile_cuda=to is np.int8)


def test_cast_float_to_uint8_nonnegative():
    x = np.abs(FLOAT_SOURCE) * 1.9
    _check([_node("Cast", ["x"], to=TensorProto.UINT8)], {"x": x})


def test_cast_nan_and_inf_to_bool_are_true():
    x = np.array([np.nan, -np.inf, np.inf, -0.0, 1e-30], np.float32)
    _check([_node("Cast", ["x"], to=TensorProto.BOOL)], {"x": x})


@pytest.mark.parametrize("src,to", [(np.bool_, np.float32), (np.bool_, np.int64), (np.int64, np.int8),
                                    (np.int32, np.uint8), (np.uint8, np.int8), (np.int32, np.float16),
                                    (np.int8, np.float64), (np.int64, np.bool_), (np.float16, np.int32)])
def test_cast_between_integer_bool_and_float(src, to):
    """Integer narrowing keeps the low bits (ONNX: discard higher bits and reinterpret)."""
    raw = RNG.integers(-300, 300, size=(4, 5))
    x = (raw % 2 == 0) if src is np.bool_ else raw.astype(src)
    _check([_node("Cast", ["x"], to=ONNX[to])], {"x": x})


def test_castlike_takes_the_type_of_its_second_input():
    x = _floats(3, 4) * 20
    like = np.zeros((1,), np.int32)
    _check([_node("CastLike", ["x", "like"])], {"x": x, "like": like})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_argmax_argmin_skip_nan_as_onnxruntime_does(op, last):
    """NaN never wins. (onnxruntime scans from index 0, so a NaN there is kept: the one case
    where GIR, which skips every NaN, differs; ONNX leaves NaN unspecified.)"""
    x = np.array([[1, np.nan, 3, np.nan, -1], [5, 2, np.nan, 7, 7], [2, np.nan, -np.inf, 4, np.inf]], np.float32)
    _check([_node(op, ["x"], axis=1, keepdims=0, select_last_index=last)], {"x": x})


def test_argmax_of_an_all_nan_row_is_an_index_in_range():
    x = np.array([[np.nan] * 4, [1, np.nan, 3, np.nan]], np.float32)
    _check([_node("ArgMax", ["x"], axis=1, keepdims=0)], {"x": x})  # onnxruntime: [0, 2]
    model = _model([_node("ArgMin", ["x"], axis=1, keepdims=0, select_last_index=1)], {"x": x})
    got = gir.Session(model, target="cpu").run(None, {"x": x})[0]
    assert 0 <= got[0] < 4 and got[1] == 0


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_mod_and_div_of_min_by_minus_one_do_not_trap(dtype):
    """x86 idiv raises SIGFPE on MIN / -1 and MIN % -1 (the whole process died); numpy wraps
    the quotient and gives remainder 0. A zero divisor gives 0, as numpy does."""
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    a = np.array([lo, 7, -7, hi, 5, lo], dtype)
    b = np.array([-1, -1, 2, -1, 0, 3], dtype)
    for op, attrs, want in (("Mod", {"fmod": 1}, [0, 0, -1, 0, 0, np.fmod(lo, 3)]),
                            ("Mod", {"fmod": 0}, [0, 0, 1, 0, 0, np.mod(lo, 3)]),
                            ("Div", {}, [lo, -7, -3, -hi, 0, -(-lo // 3)])):
        _check([_node(op, ["a", "b"], **attrs)], {"a": a, "b": b}, want=[np.array(want, dtype)],
               compile_cuda=op == "Div")


def test_gathernd_component_out_of_range_is_not_another_row():
    """(0, 5) into a (3, 4) table would be flat row 5 = element (1, 1); it must be reported as
    out of range (the interpreter raises), not read."""
    model = _model([_node("GatherND", ["x", "i"])], {"x": _floats(3, 4), "i": np.array([[0, 5]], np.int64)})
    p = plan(load(model), get_target("cuda:sm_90"))
    with pytest.raises(Exception, match="(?i)out of range|index"):
        execute(p, {"x": _floats(3, 4), "i": np.array([[0, 5]], np.int64)})


def test_cumsum_float16_adds_in_float32():
    """onnxruntime rounds each fp16 step; GIR adds in fp32 and rounds once: both within an
    ulp of the exact sums, GIR at most half of one."""
    x = RNG.standard_normal((3, 70)).astype(np.float16)
    model = _model([_node("CumSum", ["x", "a"])], {"x": x}, inits={"a": np.array(1, np.int64)})
    exact = np.cumsum(x.astype(np.float64), axis=1)
    got = gir.Session(model, target="cpu").run(None, {"x": x})[0]
    assert got.dtype == np.float16
    assert np.all(np.abs(got - exact) <= np.spacing(np.abs(exact).astype(np.float16)) / 2 + 1e-7)
    env = execute(plan(load(model), get_target("cuda:sm_90")), {"x": x})
    np.testing.assert_array_equal(env["y"], got)


def test_emitted_cuda_runs_right_on_the_cpu_harness(monkeypatch):
    """The CUDA source of every kernel (not only the plan) computes the right numbers: the GPU
    engine with each kernel run on the CPU harness (as in test_session), one model holding
    every set-A op, against onnxruntime."""
    from types import SimpleNamespace

    from test_session import HarnessLauncher

    from gir.backends.cuda.emitter import CudaEmitter
    from gir.backends import device_engine as device

    launcher = HarnessLauncher()
    monkeypatch.setattr(device, "open_launcher", lambda backend: launcher)
    monkeypatch.setattr(device, "_toolchain", lambda backend: (
        CudaEmitter, lambda source, arch: SimpleNamespace(source=source, resources={}), None))
    nodes = [_node("GatherND", ["x", "i"], ["g"], batch_dims=1),                 # (2, 5, 7)
             _node("CumSum", ["g", "one"], ["c"], exclusive=1),                   # (2, 5, 7)
             _node("Trilu", ["c"], ["t"], upper=0),
             _node("ArgMax", ["t"], ["am"], axis=-1, keepdims=0, select_last_index=1),  # (2, 5)
             _node("Cast", ["t"], ["ti"], to=TensorProto.INT32),
             _node("Mod", ["ti", "three"], ["y"])]
    feeds = {"x": RNG.integers(-5, 6, size=(2, 4, 7)).astype(np.float32),
             "i": RNG.integers(-4, 4, size=(2, 5, 1)).astype(np.int64)}
    inits = {"one": np.array(1, np.int64), "three": np.array(-3, np.int32)}
    model = _model(nodes, feeds, ("y", "am"), inits)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = gir.Session(model, target="h100", limit=1).run(None, feeds)
    for g, w in zip(got, want):
        _same(g, w)
    assert launcher.launches > 0


def test_dropout_before_opset_7_needs_is_test():
    x = _floats(2, 3)
    model = _model([_node("Dropout", ["x"])], {"x": x}, opset=6)
    with pytest.raises(UnsupportedOpError, match="is_test=0"):
        load(model)
    model = _model([_node("Dropout", ["x"], is_test=1)], {"x": x}, opset=6)
    np.testing.assert_array_equal(gir.Session(model, target="cpu").run(None, {"x": x})[0], x)
