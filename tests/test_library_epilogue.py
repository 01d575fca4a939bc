"""Library-op epilogues (gir/fusion/epilogue.py): a bias add, activations and a residual add
after a library conv or matmul absorbed into the library call, on oneDNN (post-ops) and on the
numpy fallback, against onnxruntime; what must not be absorbed; and the forms recognised."""
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
from gir.frontend.basic import BasicOp, Tensor
from gir.frontend.reference import conv_reference
from gir.fusion.epilogue import ACTIVATIONS, _activation, _canon, activation_expr, supported
from gir.ir import get_target
from gir.ir.expr import Const, Input, call, evaluate
from gir.runtime import onednn
from gir.runtime.library import run_library_op
from test_cpu_library import CONVS, MATMULS, _run_dnnl  # the library tests' shapes and call

needs_onednn = pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN: {onednn.unavailable()}")

# the parameters each activation takes in the tests (ONNX's defaults where it has them)
PARAMS = {"relu": (0, 0), "leaky_relu": (0.1, 0), "sigmoid": (0, 0), "tanh": (0, 0), "silu": (1, 0),
          "gelu_erf": (0, 0), "gelu_tanh": (0, 0), "clip": (-0.5, 6.0), "hardsigmoid": (0.2, 0.5),
          "hardswish": (1 / 6, 0.5), "elu": (0.7, 0)}

def _t(name, shape, value=None):
    return Tensor(name, tuple(shape), "float32", value)


def _act(kind, y):
    a, b = PARAMS[kind]
    return np.asarray(evaluate(activation_expr(kind, a, b), [y], "float32"), np.float32)


def _numpy_formula(kind, y):
    """The activation written out independently of activation_expr (checks the formulas too)."""
    a, b = PARAMS[kind]
    erf = np.vectorize(math.erf)
    return {
        "relu": lambda: np.maximum(y, 0), "leaky_relu": lambda: np.where(y < 0, a * y, y),
        "sigmoid": lambda: 1 / (1 + np.exp(-y)), "tanh": lambda: np.tanh(y), "silu": lambda: y / (1 + np.exp(-y)),
        "gelu_erf": lambda: 0.5 * y * (1 + erf(y / np.sqrt(2))),
        "gelu_tanh": lambda: 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3))),
        "clip": lambda: np.clip(y, a, b), "hardsigmoid": lambda: np.clip(a * y + b, 0, 1),
        "hardswish": lambda: y * np.clip(a * y + b, 0, 1), "elu": lambda: np.where(y < 0, a * (np.exp(y) - 1), y),
    }[kind]().astype(np.float32)


@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_activation_formulas(kind):
    y = np.linspace(-8, 8, 1001, dtype=np.float32)
    np.testing.assert_allclose(_act(kind, y), _numpy_formula(kind, y), rtol=2e-6, atol=2e-6)


def _conv_case(case, steps):
    xs, ws, strides, pads, dilations, group, bias = CONVS[case]
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws, ws[:1]))
    y = conv_reference(x, w, b if bias else None, strides, pads, dilations, group).astype(np.float32)
    r = rng.standard_normal(y.shape).astype(np.float32)
    tensors = {"x": _t("x", xs), "w": _t("w", ws, w), "b": _t("b", ws[:1], b), "r": _t("r", y.shape), "y": _t("y", y.shape)}
    if "residual" in steps and not bias:  # a conv's third input is its bias: the planner adds zeros
        b[:] = 0
        bias = True
    inputs = ["x", "w"] + (["b"] if bias else [])
    epilogue, y = _steps(steps, inputs, y, r)
    op = BasicOp("conv", "conv", inputs, ["y"], {"strides": tuple(strides), "pads": tuple(pads),
                                                 "dilations": tuple(dilations), "group": group,
                                                 "epilogue": tuple(epilogue), "absorbed": (("test", ()),)}, "test")
    return op, tensors, {"x": x, "w": w, "b": b, "r": r}, y


def _steps(steps, inputs: list, y, r):
    """The op's epilogue steps (residual inputs appended to `inputs`) and y after them in numpy."""
    epilogue = []
    for kind in steps:
        if kind == "residual":
            inputs.append("r")
            epilogue.append(("residual", len(inputs) - 1, 0.0))
            y = y + r
        else:
            epilogue.append((kind, *map(float, PARAMS[kind])))
            y = _numpy_formula(kind, y)
    return epilogue, y


def _matmul_case(case, steps, bias=True):
    a_shape, b_shape, const = MATMULS[case]
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    y = np.matmul(a, b)
    bias = bias and len(b_shape) > 1
    c = rng.standard_normal(y.shape[-1:]).astype(np.float32)
    r = rng.standard_normal(y.shape).astype(np.float32)
    tensors = {"a": _t("a", a_shape), "b": _t("b", b_shape, b if const else None), "c": _t("c", c.shape, c),
               "r": _t("r", y.shape), "y": _t("y", y.shape)}
    inputs, attrs = ["a", "b"], {"absorbed": (("test", ()),)}
    if bias:
        inputs.append("c")
        attrs["bias"] = True
        y = y + c
    epilogue, y = _steps(steps, inputs, y, r)
    attrs["epilogue"] = tuple(epilogue)
    return BasicOp("mm", "matmul", inputs, ["y"], attrs, "test"), tensors, {"a": a, "b": b, "c": c, "r": r}, y, const


def _close(got, want):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


CHAINS = [(k,) for k in ACTIVATIONS] + [("residual",), ("residual", "relu"), ("relu", "residual"),
                                        ("gelu_erf", "residual", "tanh")]


@needs_onednn
@pytest.mark.parametrize("case", CONVS)
@pytest.mark.parametrize("chain", CHAINS, ids="-".join)
def test_conv_epilogue_on_onednn(case, chain):
    op, tensors, values, want = _conv_case(case, chain)
    layouts = (False, True) + ((onednn.MATMUL,) if onednn.pointwise(op, tensors) else ())
    for blocked in layouts:  # post-ops, and the epilogue as primitives of its own after the op
        for separate in (False, True):
            _close(_run_dnnl(op, tensors, values, ["w", "b"], choice=(blocked, 0, separate)), want)
    _close(_run_dnnl(op, tensors, values, ["w", "b"]), want)  # the timed choice


@pytest.mark.parametrize("case", CONVS)
@pytest.mark.parametrize("chain", CHAINS, ids="-".join)
def test_conv_epilogue_on_numpy(case, chain):
    op, tensors, values, want = _conv_case(case, chain)
    _close(run_library_op(op, tensors, [values[n] for n in op.inputs]), want)


@needs_onednn
@pytest.mark.parametrize("case", MATMULS)
@pytest.mark.parametrize("chain", CHAINS, ids="-".join)
def test_matmul_epilogue_on_onednn(case, chain):
    op, tensors, values, want, const = _matmul_case(case, chain)
    _close(_run_dnnl(op, tensors, values, (["b"] if const else []) + ["c"]), want)
    _close(_run_dnnl(op, tensors, values, (["b"] if const else []) + ["c"], choice=(False, 1)), want)
    _close(_run_dnnl(op, tensors, values, (["b"] if const else []) + ["c"], choice=(False, 0, True)), want)


@pytest.mark.parametrize("case", MATMULS)
@pytest.mark.parametrize("chain", CHAINS, ids="-".join)
def test_matmul_epilogue_on_numpy(case, chain):
    op, tensors, values, want, _ = _matmul_case(case, chain)
    _close(run_library_op(op, tensors, [values[n] for n in op.inputs]), want)


# --- forms the planner recognises -----------------------------------------------------------

x = Input(0)


def c(v):
    return Const(float(v))


FORMS = {  # expressions as the frontend or exporters write them -> (kind, alpha, beta)
    "relu": (call("relu", x), ("relu", 0, 0)),
    "clip_min0": (call("max", x, c(0)), ("relu", 0, 0)),
    "relu6": (call("min", call("max", x, c(0)), c(6)), ("clip", 0, 6)),
    "clip_min_after_max": (call("max", call("min", x, c(6)), c(-1)), ("clip", -1, 6)),
    "leaky": (call("where", call("lt", x, c(0)), call("mul", x, c(0.01)), x), ("leaky_relu", 0.01, 0)),
    "sigmoid": (call("sigmoid", x), ("sigmoid", 0, 0)),
    "tanh": (call("tanh", x), ("tanh", 0, 0)),
    "silu": (call("mul", x, call("sigmoid", x)), ("silu", 1, 0)),
    "silu_swapped": (call("mul", call("sigmoid", x), x), ("silu", 1, 0)),
    "gelu_onnx": (activation_expr("gelu_erf", 0, 0), ("gelu_erf", 0, 0)),
    "gelu_exporter": (call("mul", call("mul", x, call("add", call("erf", call("div", x, c(1.4142135381698608))), c(1))), c(0.5)),
                      ("gelu_erf", 0, 0)),
    "gelu_tanh_onnx": (activation_expr("gelu_tanh", 0, 0), ("gelu_tanh", 0, 0)),
    "gelu_tanh_pow": (call("mul", call("mul", c(0.5), x), call("add", c(1), call("tanh", call("mul", c(0.7978845608028654), call(
        "add", x, call("mul", c(0.044715), call("pow", x, c(3)))))))), ("gelu_tanh", 0, 0)),
    "hardsigmoid": (activation_expr("hardsigmoid", 0.2, 0.5), ("hardsigmoid", 0.2, 0.5)),
    "hardswish": (activation_expr("hardswish", 1 / 6, 0.5), ("hardswish", 1 / 6, 0.5)),
    "hardswish_relu6": (call("div", call("mul", x, call("min", call("max", call("add", x, c(3)), c(0)), c(6))), c(6)),
                        ("hardswish", 1 / 6, 0.5)),
    "elu": (call("where", call("lt", x, c(0)), call("mul", c(0.7), call("sub", call("exp", x), c(1))), x), ("elu", 0.7, 0)),
}
NOT_FORMS = {
    "double": call("mul", x, c(2)),
    "x_plus_relu": call("add", x, call("relu", x)),
    "gelu_wrong_constant": call("mul", call("mul", c(0.5), x), call("add", c(1), call("erf", call("mul", x, c(0.8))))),
    "silu_scaled": call("mul", c(2), call("mul", x, call("sigmoid", x))),
    "hardsigmoid_wrong_top": call("max", c(0), call("min", c(2), call("add", call("mul", x, c(0.2)), c(0.5)))),
    "sin": call("sin", x),
}


@pytest.mark.parametrize("name", FORMS)
def test_forms_are_recognised(name):
    expr, (kind, alpha, beta) = FORMS[name]
    got = _activation(_canon(expr))
    assert got is not None and got[0] == kind, got
    assert got[1] == pytest.approx(alpha, rel=1e-6) and got[2] == pytest.approx(beta, rel=1e-6)
    y = np.linspace(-7, 7, 301, dtype=np.float32)  # the recognised step computes what the expression does
    np.testing.assert_allclose(_act_of(got, y), np.asarray(evaluate(expr, [y], "float32")), rtol=1e-5, atol=1e-6)


def _act_of(step, y):
    return np.asarray(evaluate(activation_expr(*step), [y], "float32"))


@pytest.mark.parametrize("name", NOT_FORMS)
def test_other_expressions_are_not_recognised(name):
    assert _activation(_canon(NOT_FORMS[name])) is None


# --- whole models against onnxruntime -------------------------------------------------------

def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "epilogue", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _conv_model(act_nodes, final="z", xs=(1, 16, 20, 20), m=32, k=3, stride=1, group=1, extra_inputs=(), extra_outputs=(),
                inits=None, opset=17):
    rng = np.random.default_rng(2)
    inits = dict(inits or {})
    inits["W"] = (rng.standard_normal((m, xs[1] // group, k, k)) * 0.2).astype(np.float32)
    inits["B"] = rng.standard_normal(m).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[k // 2] * 4, strides=[stride] * 2, group=group)
    ys = (xs[0], m, (xs[2] + 2 * (k // 2) - k) // stride + 1, (xs[3] + 2 * (k // 2) - k) // stride + 1)
    outs = [_vi(final, ys)] + [_vi(n, ys if s is None else s) for n, s in extra_outputs]
    return _model([conv, *act_nodes], [_vi("x", xs), *[_vi(n, ys if s is None else s) for n, s in extra_inputs]], outs,
                  inits, opset), ys


def _check(model, expect_absorbed, engines=("native",)):
    """The model on the oneDNN path, the numpy path (and the interpreter) against onnxruntime;
    the library op's absorbed kinds as expected. Returns the oneDNN session."""
    rng = np.random.default_rng(3)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    sessions = []
    for library in (None, "numpy"):
        s = gir.Session(model, target="cpu", library=library)
        sessions.append(s)
        got = s.run(None, feeds)
        for g, w in zip(got, want):
            err = float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30))
            assert err < 1e-4, (library, err)
    if "interpreter" in engines:
        got = gir.Session(model, target="cpu", engine="interpreter").run(None, feeds)
        for g, w in zip(got, want):
            assert float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)) < 1e-4
    s = sessions[0]
    kinds = [what for op in s.plan.partition.library for what, _ in op.attrs.get("absorbed", ())]
    assert kinds == list(expect_absorbed), kinds
    if onednn.library() is not None:
        assert s.library_path.startswith("onednn"), s.library_path
        for op in s.plan.partition.library:  # an epilogue must not push oneDNN onto its reference kernels
            assert "ref:" not in s.engine.library_ops[op.name], s.engine.library_ops[op.name]
    assert sessions[1].library_path == "numpy"
    return s


ACT_NODES = {  # kind -> ONNX nodes from y to z (opset 17 unless said)
    "relu": [helper.make_node("Relu", ["y"], ["z"])],
    "leaky_relu": [helper.make_node("LeakyRelu", ["y"], ["z"], alpha=0.1)],
    "sigmoid": [helper.make_node("Sigmoid", ["y"], ["z"])],
    "tanh": [helper.make_node("Tanh", ["y"], ["z"])],
    "silu": [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["y", "s"], ["z"])],
    "gelu_erf": [helper.make_node("Div", ["y", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["y", "p"], ["q"]),
                 helper.make_node("Mul", ["q", "half"], ["z"])],
    "gelu_tanh": [helper.make_node("Pow", ["y", "three"], ["c3"]), helper.make_node("Mul", ["c3", "k"], ["c4"]),
                  helper.make_node("Add", ["y", "c4"], ["c5"]), helper.make_node("Mul", ["c5", "s2pi"], ["c6"]),
                  helper.make_node("Tanh", ["c6"], ["c7"]), helper.make_node("Add", ["c7", "one"], ["c8"]),
                  helper.make_node("Mul", ["y", "c8"], ["c9"]), helper.make_node("Mul", ["c9", "half"], ["z"])],
    "clip": [helper.make_node("Clip", ["y", "zero", "six"], ["z"])],
    "hardsigmoid": [helper.make_node("HardSigmoid", ["y"], ["z"], alpha=0.25, beta=0.4)],
    "hardswish": [helper.make_node("HardSwish", ["y"], ["z"])],
    "elu": [helper.make_node("Less", ["y", "zero"], ["neg"]), helper.make_node("Exp", ["y"], ["ex"]),
            helper.make_node("Sub", ["ex", "one"], ["em1"]), helper.make_node("Mul", ["em1", "alpha"], ["em"]),
            helper.make_node("Where", ["neg", "em", "y"], ["z"])],
}
SCALARS = {"sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5), "three": np.float32(3),
           "k": np.float32(0.044715), "s2pi": np.float32(np.sqrt(2 / np.pi)), "zero": np.float32(0),
           "six": np.float32(6), "alpha": np.float32(0.8)}


def _used_scalars(nodes):
    names = {t for n in nodes for t in n.input}
    return {k: np.array(v, np.float32) for k, v in SCALARS.items() if k in names}


@pytest.mark.parametrize("kind", ACT_NODES)
def test_conv_then_activation(kind):
    nodes = ACT_NODES[kind]
    model, _ = _conv_model(nodes, inits=_used_scalars(nodes))
    _check(model, [kind])


@pytest.mark.parametrize("shape", ["strided", "grouped", "batch2"])
def test_conv_shapes_then_silu(shape):
    kw = {"strided": {"stride": 2}, "grouped": {"group": 4}, "batch2": {"xs": (2, 16, 12, 12)}}[shape]
    model, _ = _conv_model(ACT_NODES["silu"], **kw)
    _check(model, ["silu"])


def test_conv_bias_add_then_relu_without_conv_bias():
    """An Add of a (C, 1, 1) constant after a conv without a bias becomes its bias."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((24, 8, 3, 3)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["y", "C"], ["yb"]), helper.make_node("Relu", ["yb"], ["z"])]
    model = _model(nodes, [_vi("x", (1, 8, 16, 16))], [_vi("z", (1, 24, 16, 16))],
                   {"W": w, "C": rng.standard_normal((24, 1, 1)).astype(np.float32)})
    s = _check(model, ["bias", "relu"], engines=("native", "interpreter"))
    (op,) = s.plan.partition.library
    assert len(op.inputs) == 3 and s.plan.graph.tensors[op.inputs[2]].shape == (24,)


def _bn_inits(rng, m):
    return {"g": rng.uniform(0.5, 1.5, m).astype(np.float32), "be": rng.standard_normal(m).astype(np.float32),
            "mu": rng.standard_normal(m).astype(np.float32), "var": rng.uniform(0.5, 2.0, m).astype(np.float32)}


@pytest.mark.parametrize("conv_bias", [True, False])
def test_conv_batchnorm_relu_residual_fold_into_the_conv(conv_bias):
    """An inference BatchNormalization after a conv (the exporter's form when it does not fold
    it) scales the conv's weights and bias per output channel; ReLU and a residual add follow
    as post-ops, and nothing is left for GIR. The conv's own weight tensor is left alone (it
    may be shared): the scaled one is a new constant."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    inits = {"W": w, **_bn_inits(rng, 16)}
    conv_in = ["x", "W"]
    if conv_bias:
        inits["B"] = rng.standard_normal(16).astype(np.float32)
        conv_in.append("B")
    nodes = [helper.make_node("Conv", conv_in, ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["y", "g", "be", "mu", "var"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["a"]), helper.make_node("Add", ["a", "r"], ["z"])]
    model = _model(nodes, [_vi("x", (1, 8, 12, 12)), _vi("r", (1, 16, 12, 12))], [_vi("z", (1, 16, 12, 12))], inits)
    s = _check(model, ["scale", "relu", "residual"], engines=("native", "interpreter"))
    assert not s.plan.kernels
    (op,) = s.plan.partition.library
    assert op.inputs[1] != "W" and np.array_equal(s.graph.tensors["W"].value, w)
    assert "scale (" in gir.fusion.epilogue.describe(op)


def test_matmul_then_per_column_scale_and_shift_folds_into_its_weight():
    """x @ W * a + b with a, b one constant per output column (a BatchNorm1d after a Linear)."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Mul", ["y", "a"], ["s"]),
             helper.make_node("Add", ["s", "b"], ["z"])]
    model = _model(nodes, [_vi("x", (2, 64, 48))], [_vi("z", (2, 64, 40))],
                   {"W": (rng.standard_normal((48, 40)) * 0.2).astype(np.float32),
                    "a": rng.uniform(0.5, 1.5, 40).astype(np.float32), "b": rng.standard_normal(40).astype(np.float32)})
    s = _check(model, ["scale", "bias"], engines=("native", "interpreter"))  # two nodes, two steps
    assert not s.plan.kernels


def test_batchnorm_after_a_conv_with_a_computed_weight_stays_in_gir():
    """A weight that is an input of the model cannot be scaled when the plan is made."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["y", "g", "be", "mu", "var"], ["z"])]
    model = _model(nodes, [_vi("x", (1, 8, 12, 12)), _vi("W", (16, 8, 3, 3))], [_vi("z", (1, 16, 12, 12))],
                   _bn_inits(rng, 16))
    s = _check(model, [])
    assert s.plan.kernels


def test_conv_residual_then_relu():
    nodes = [helper.make_node("Add", ["y", "r"], ["a"]), helper.make_node("Relu", ["a"], ["z"])]
    model, _ = _conv_model(nodes, extra_inputs=[("r", None)])
    s = _check(model, ["residual", "relu"], engines=("native", "interpreter"))
    assert not s.plan.kernels  # nothing left for GIR


@pytest.mark.parametrize("bias", [True, False])
def test_residual_of_the_convs_own_input(bias):
    """conv(x) + x: the residual is also the conv's first input; it gets a position of its own
    after the bias (a zero bias where the conv has none)."""
    rng = np.random.default_rng(11)
    inits = {"W": (rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32)}
    if bias:
        inits["B"] = rng.standard_normal(16).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W"] + (["B"] if bias else []), ["y"], pads=[1] * 4),
             helper.make_node("Add", ["y", "x"], ["a"]), helper.make_node("Tanh", ["a"], ["z"])]
    model = _model(nodes, [_vi("x", (2, 16, 12, 12))], [_vi("z", (2, 16, 12, 12))], inits)
    s = _check(model, ["residual", "tanh"], engines=("native", "interpreter"))
    (op,) = s.plan.partition.library
    assert op.inputs[0] == op.inputs[3] == "x" and op.attrs["epilogue"][0] == ("residual", 3, 0.0)


def test_matmul_residual_of_its_own_input():
    rng = np.random.default_rng(12)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Add", ["x", "y"], ["z"])]
    model = _model(nodes, [_vi("x", (3, 40, 64))], [_vi("z", (3, 40, 64))],
                   {"W": (rng.standard_normal((64, 64)) * 0.1).astype(np.float32)})
    _check(model, ["residual"])


def test_residual_from_another_conv():
    """ResNet's shortcut: Add(conv2(relu(conv1(x))), x) -> relu; conv1's relu and conv2's residual
    and relu are absorbed."""
    rng = np.random.default_rng(5)
    w1, w2 = ((rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("Conv", ["x", "W1"], ["y1"], pads=[1] * 4), helper.make_node("Relu", ["y1"], ["h"]),
             helper.make_node("Conv", ["h", "W2"], ["y2"], pads=[1] * 4), helper.make_node("Add", ["x", "y2"], ["a"]),
             helper.make_node("Relu", ["a"], ["z"])]
    model = _model(nodes, [_vi("x", (1, 16, 14, 14))], [_vi("z", (1, 16, 14, 14))], {"W1": w1, "W2": w2})
    _check(model, ["relu", "residual", "relu"])


def test_matmul_bias_then_gelu():
    """MatMul -> Add of a 1-D constant -> GELU (the exporters' erf chain): one library call."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Add", ["C", "y"], ["y1"])]
    act = [helper.make_node(n.op_type, [("y1" if t == "y" else t) for t in n.input], list(n.output), name=f"gelu{i}")
           for i, n in enumerate(ACT_NODES["gelu_erf"])]
    inits = {"W": (rng.standard_normal((64, 96)) * 0.1).astype(np.float32),
             "C": rng.standard_normal(96).astype(np.float32), **_used_scalars(act)}
    model = _model(nodes + act, [_vi("x", (2, 32, 64))], [_vi("z", (2, 32, 96))], inits)
    s = _check(model, ["bias", "gelu_erf"], engines=("native", "interpreter"))
    (op,) = s.plan.partition.library
    assert op.attrs["bias"] and op.attrs["epilogue"] == (("gelu_erf", 0.0, 0.0),)
    assert not s.plan.kernels


def test_matmul_onnx_gelu_op():
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Add", ["y", "C"], ["y1"]),
             helper.make_node("Gelu", ["y1"], ["z"], approximate="tanh")]
    inits = {"W": (rng.standard_normal((64, 80)) * 0.1).astype(np.float32), "C": rng.standard_normal(80).astype(np.float32)}
    model = _model(nodes, [_vi("x", (48, 64))], [_vi("z", (48, 80))], inits, opset=20)
    _check(model, ["bias", "gelu_tanh"])


def test_matmul_bias_residual():
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Add", ["y", "C"], ["y1"]),
             helper.make_node("Add", ["r", "y1"], ["z"])]
    inits = {"W": (rng.standard_normal((64, 64)) * 0.1).astype(np.float32), "C": rng.standard_normal(64).astype(np.float32)}
    model = _model(nodes, [_vi("x", (2, 40, 64)), _vi("r", (2, 40, 64))], [_vi("z", (2, 40, 64))], inits)
    _check(model, ["bias", "residual"])


def test_an_intermediate_with_a_second_reader_is_not_absorbed():
    """conv -> Relu, and the conv's output also summed: the Relu stays a GIR kernel."""
    nodes = [helper.make_node("Relu", ["y"], ["z"]), helper.make_node("ReduceSum", ["y"], ["m"], keepdims=0)]
    model, _ = _conv_model(nodes, extra_outputs=[("m", ())], opset=11)
    s = _check(model, [])
    assert s.plan.kernels


def test_a_chain_intermediate_with_a_second_reader_stops_the_epilogue():
    """bias -> Relu absorbed; the Relu's output is also read by a ReduceSum, so the Sigmoid
    after it is not."""
    nodes = [helper.make_node("Relu", ["y"], ["h"]), helper.make_node("Sigmoid", ["h"], ["z"]),
             helper.make_node("ReduceSum", ["h"], ["m"], keepdims=0)]
    model, _ = _conv_model(nodes, extra_outputs=[("m", ())], opset=11)
    _check(model, ["relu"])


def test_a_graph_output_intermediate_is_not_absorbed():
    """The conv's output is a graph output: the Relu after it stays in GIR; and where the Relu's
    output is one, the Sigmoid after it stays (the Relu is absorbed)."""
    model, ys = _conv_model([helper.make_node("Relu", ["y"], ["z"])], extra_outputs=[("y", None)])
    _check(model, [])
    model, ys = _conv_model([helper.make_node("Relu", ["y"], ["h"]), helper.make_node("Sigmoid", ["h"], ["z"])],
                            extra_outputs=[("h", None)])
    _check(model, ["relu"])


def test_a_per_channel_add_after_an_activation_is_not_a_bias():
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Relu", ["y"], ["h"]), helper.make_node("Add", ["h", "C"], ["z"])]
    model, _ = _conv_model(nodes, inits={"C": rng.standard_normal((32, 1, 1)).astype(np.float32)})
    _check(model, ["relu"])


def test_explain_lists_the_epilogue():
    model, _ = _conv_model(ACT_NODES["silu"])
    s = gir.Session(model, target="cpu")
    (d,) = [d for d in s.plan.partition.decisions if d.library]
    assert d.epilogue.startswith("silu (") and "epilogue: silu" in d.reason


def test_a_target_without_epilogues_plans_as_before():
    """The hip presets declare no epilogue kinds (hipBLAS has none), and the cuda presets none for
    a conv (cuBLASLt's are for its matmuls): their plans keep the activation in GIR."""
    from gir.frontend import load
    from gir.fusion.plan import plan
    model, _ = _conv_model(ACT_NODES["relu"], xs=(1, 64, 32, 32), m=64)
    p = plan(load(model), get_target("cuda:sm_90"))
    assert all(not op.attrs.get("absorbed") for op in p.partition.library) and p.kernels
    target = get_target("hip:gfx90a")
    assert supported(target)[0] == frozenset()
    p = plan(load(model), target)
    assert all(not op.attrs.get("absorbed") for op in p.partition.library) and p.kernels


def test_report_and_plan_json_carry_the_epilogue():
    from gir.compile_outputs import _epilogue
    from gir.report import _blocks
    nodes = [helper.make_node("Add", ["y", "r"], ["a"]), helper.make_node("Relu", ["a"], ["z"])]
    model, _ = _conv_model(nodes, extra_inputs=[("r", None)])
    s = gir.Session(model, target="cpu")
    (op,) = s.plan.partition.library
    assert _epilogue(op) == {"bias": False, "epilogue": [{"kind": "residual", "input": 3},
                                                         {"kind": "relu", "alpha": 0.0, "beta": 0.0}]}
    tables = [b for b in _blocks(s.plan) if b[0] == "table" and "epilogue" in b[1]]
    assert tables and tables[0][2][0][2].startswith("residual (") and "relu (" in tables[0][2][0][2]


def test_the_gpu_engine_refuses_an_epilogue_it_does_not_run(monkeypatch):
    """A GPU target made to declare an epilogue after a conv (the GPU library path runs them
    only after a matmul): the plan absorbs it, and the device engine (on the recording
    stand-in) refuses the plan in one line instead of dropping the ReLU."""
    import dataclasses

    from gir.backends import device_engine as device
    from gir.backends.errors import LibraryUnavailable
    from gir.backends.harness.recording import RecordingLauncher, harness_toolchain
    from gir.runtime import session as session_module
    launcher = RecordingLauncher(dialect="cuda")
    monkeypatch.setattr(device, "open_launcher", lambda b: launcher)
    monkeypatch.setattr(device, "_toolchain", harness_toolchain)
    real = session_module.get_target
    monkeypatch.setattr(session_module, "get_target", lambda name: dataclasses.replace(
        real(name), peak_flops=1.0, peak_matrix_flops=1.0,
        extra={"library_epilogues": {"kinds": frozenset({"relu"}), "dtypes": ("float32",)}}))
    model, _ = _conv_model(ACT_NODES["relu"])
    with pytest.raises(LibraryUnavailable, match="epilogue \\(relu\\)"):
        gir.Session(model, target="cuda:sm_90")


def test_the_cpu_target_repr_is_the_same_in_every_process():
    """Caches key sessions by repr(target): the declared kinds must print in one order (a
    frozenset printed in each process's hash order, and no session was ever read back)."""
    import os
    import subprocess
    import sys
    code = "from gir.ir import get_target; print(repr(get_target('cpu').extra))"
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3)}
    assert len(seen) == 1


def test_the_profiler_counts_a_bias_the_planner_made():
    from gir.backends.cpu.profile import profile
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Add", ["y", "C"], ["y1"]),
             helper.make_node("Relu", ["y1"], ["z"])]
    inits = {"W": (rng.standard_normal((64, 48)) * 0.1).astype(np.float32), "C": rng.standard_normal(48).astype(np.float32)}
    model = _model(nodes, [_vi("x", (32, 64))], [_vi("z", (32, 48))], inits)
    s = gir.Session(model, target="cpu")
    (op,) = s.plan.partition.library
    assert op.attrs["bias"] and op.inputs[2] not in s.graph.tensors  # made by the planner
    (row,) = [r for r in profile(s, {"x": rng.standard_normal((32, 64)).astype(np.float32)}, 2) if r.kind == "matmul"]
    assert row.dram_bytes == 4 * (32 * 64 + 64 * 48 + 48 + 32 * 48)
