"""Library-matmul epilogues in cuBLASLt on the GPU runtime: the cuda presets declare bias, residual
and ReLU in cuBLASLt's order (blas.CUBLASLT_EPILOGUES), the planner absorbs only chains in that
order, the device engine turns them into the Gemm's bias pointer, C (apart from D, beta = 1) and
activation, and the recording stand-in executes them with cuBLAS's column-major conventions
(bias per row of D), so a layout mistake fails here. hip presets absorb nothing (hipBLAS has no
epilogues). The gpu-marked tests check the same on a real GPU, and GELU_BIAS against the tanh
formula (not declared by any target until that passes)."""
import dataclasses
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
import models
from gir.backends import device_engine as device
from gir.backends.blas import CUBLASLT_EPILOGUES, LT_EPILOGUE, Gemm, reference_gemm, row_major_matmul
from gir.backends.errors import LibraryUnavailable, NoDeviceError
from gir.backends.harness.recording import RecordingLauncher
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import get_target
from gir.runtime import session as session_module
from test_device_runtime import assert_matches, check_one_run, on_standin, ort_outputs


def _model(order: str, dtype=TensorProto.FLOAT, shape=(2, 8, 16), n=24):
    """MatMul(x, W) then the adds and Relu in `order` ("brR": bias, residual r, Relu)."""
    rng = np.random.default_rng(0)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array((rng.standard_normal((shape[-1], n)) * 0.3).astype(np_dtype), "W"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np_dtype), "C")]
    nodes, cur = [helper.make_node("MatMul", ["x", "W"], ["y0"], name="mm")], "y0"
    for i, step in enumerate(order):
        out = "z" if i == len(order) - 1 else f"y{i + 1}"
        node = {"b": ("Add", [cur, "C"]), "r": ("Add", ["r", cur]), "R": ("Relu", [cur])}[step]
        nodes.append(helper.make_node(node[0], node[1], [out], name=f"{step}{i}"))
        cur = out
    out_shape = (*shape[:-1], n)
    inputs = [helper.make_tensor_value_info("x", dtype, list(shape)), helper.make_tensor_value_info("r", dtype, list(out_shape))]
    graph = helper.make_graph(nodes, "mm_epilogue", inputs, [helper.make_tensor_value_info("z", dtype, list(out_shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _feeds(model, dtype=np.float32, seed=1):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(dtype)
            for i in model.graph.input}


def _absorbed(session):
    return [what for op in session.plan.partition.library for what, _ in op.attrs.get("absorbed", ())]


def _gemms(session):
    return [op[1] for op in session.engine.graph if op[0] == "gemm"]


def test_the_cuda_presets_declare_cublaslt_epilogues_and_hip_none():
    for name in ("cuda:sm_80", "cuda:sm_90"):
        assert get_target(name).extra["library_epilogues"] == CUBLASLT_EPILOGUES
    assert not get_target("hip:gfx90a").extra.get("library_epilogues")


def test_bert_matmul_biases_run_in_cublaslt(monkeypatch):
    """Every dense layer's bias (and the residual after the output projections) is in its
    cuBLASLt call; those adds are gone from the GIR side; a run moves only feeds and outputs."""
    launcher = on_standin(monkeypatch, True)
    model = models.load_bundled("bert")
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    library = session.plan.partition.library
    biased = [op for op in library if op.attrs.get("bias")]
    assert len(biased) >= 6 and all(op.kind == "matmul" for op in biased)
    assert "residual" in _absorbed(session)
    names = {n for op in library for _, absorbed in op.attrs.get("absorbed", ()) for n in absorbed}
    assert names and not names & {op.name for op in session.plan.graph.ops if op.kind != "matmul"}
    gemms = _gemms(session)
    assert sum(g.bias != 0 for g in gemms) >= len(biased)
    assert all(g.beta == 1.0 and g.c_in not in (0, g.c) for g in gemms if g.c_in)
    for seed in (0, 1):
        feeds = models.example_inputs(model, seed)
        assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


def test_bias_residual_relu_are_one_cublaslt_call(monkeypatch):
    launcher = on_standin(monkeypatch, True)
    model = _model("brR")
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    assert _absorbed(session) == ["bias", "residual", "relu"]
    assert not session.plan.kernels  # nothing left for GIR
    (g,) = _gemms(session)
    assert g.bias and g.c_in and g.c_in != g.c and g.beta == 1.0 and g.activation == "relu"
    assert g.epilogue == LT_EPILOGUE[("relu", True)] == 6
    feeds = _feeds(model)
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


def test_relu_before_the_residual_is_absorbed_up_to_cublaslts_order(monkeypatch):
    """bias, Relu, then the residual: cuBLASLt would add C before the ReLU, so the residual add
    stays a GIR kernel; the CPU (oneDNN post-ops run in any order) still takes all three."""
    launcher = on_standin(monkeypatch, True)
    model = _model("bRr")
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    assert _absorbed(session) == ["bias", "relu"]
    assert session.plan.kernels
    (g,) = _gemms(session)
    assert g.bias and not g.c_in and g.beta == 0.0 and g.activation == "relu"
    feeds = _feeds(model)
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))
    cpu = plan(load(model), dataclasses.replace(get_target("cpu"), peak_flops=1.0, peak_matrix_flops=1.0))
    assert [w for op in cpu.partition.library for w, _ in op.attrs.get("absorbed", ())] == ["bias", "relu", "residual"]


def test_a_residual_before_the_bias_is_absorbed_alone(monkeypatch):
    """r + y, then the bias: bias must come first in cuBLASLt's order, so only the residual is."""
    launcher = on_standin(monkeypatch, True)
    model = _model("rbR")
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    assert _absorbed(session) == ["residual"]
    feeds = _feeds(model)
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


def test_fp16_bias_in_the_output_dtype(monkeypatch):
    launcher = on_standin(monkeypatch, True)
    model = _model("brR", dtype=TensorProto.FLOAT16)
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    assert _absorbed(session) == ["bias", "residual", "relu"]
    (op,) = session.plan.partition.library
    assert session.plan.graph.tensors[op.inputs[2]].dtype == "float16"
    feeds = _feeds(model, np.float16)
    (got,), (want,) = check_one_run(session, launcher, feeds), ort_outputs(model, feeds)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3,
                               atol=2e-3 * max(1.0, float(np.abs(want).max())))


def test_bf16_bias_residual_relu_in_one_call(monkeypatch):
    """bf16 (declared after the H200 run of the gpu test below): one Gemm carries bias, residual
    and ReLU, and the stand-in's result is the float64 one rounded to bf16 within 2 ulps."""
    launcher = on_standin(monkeypatch, True)
    model = _model("brR", dtype=TensorProto.BFLOAT16)
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    assert _absorbed(session) == ["bias", "residual", "relu"]
    (g,) = _gemms(session)
    assert g.dtype == "bfloat16" and g.bias and g.c_in and g.activation == "relu"
    bf16 = helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)
    feeds = _feeds(model, bf16)
    (got,) = check_one_run(session, launcher, feeds)
    w, c = (numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer)
    want = np.maximum(feeds["x"].astype(np.float64) @ w + c + feeds["r"].astype(np.float64), 0)
    err = np.abs(got.astype(np.float64) - want) / np.maximum(1.0, np.abs(want))
    assert got.dtype == bf16 and err.max() <= 2 * 2.0 ** -7


def test_the_hip_target_absorbs_nothing(monkeypatch):
    launcher = on_standin(monkeypatch, True, backend="hip")
    model = _model("brR")
    session = gir.Session(model, target="hip:gfx90a", limit=1)
    assert _absorbed(session) == [] and session.plan.kernels
    assert all(not g.bias and not g.c_in and not g.activation for g in _gemms(session))
    feeds = _feeds(model)
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


def test_hipblas_refuses_an_epilogue_in_one_line(monkeypatch):
    """A hip target made to declare cuBLASLt's epilogues: the plan absorbs them, and the device
    engine refuses it for the hip launcher (no epilogues), not for a global list."""
    on_standin(monkeypatch, True, backend="hip")
    real = session_module.get_target
    monkeypatch.setattr(session_module, "get_target", lambda name: dataclasses.replace(
        real(name), peak_flops=1.0, peak_matrix_flops=1.0, extra={"library_epilogues": CUBLASLT_EPILOGUES}))
    with pytest.raises(LibraryUnavailable, match="epilogue \\(bias, residual, relu\\)") as err:
        gir.Session(_model("brR"), target="hip:gfx90a", limit=1)
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("a_shape,b_shape", [((5, 16), (16, 24)), ((2, 3, 16), (16, 24)), ((2, 3, 16), (2, 16, 24)),
                                             ((2, 1, 3, 16), (1, 2, 16, 24)), ((16,), (16, 24))])
@pytest.mark.parametrize("act", ["", "relu", "gelu_tanh"])
def test_the_standin_runs_the_epilogue_with_cublas_layouts(a_shape, b_shape, act):
    """Bias along the row-major result's last axis is one value per row of the column-major D,
    C read from its own buffer (at each call's offset), D written; numpy as the reference."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    want = np.matmul(a, b)
    bias, r = rng.standard_normal(want.shape[-1]).astype(np.float32), rng.standard_normal(want.shape).astype(np.float32)
    launcher = RecordingLauncher()
    bufs = [launcher.alloc(x.nbytes) for x in (a, b, want, bias, r)]
    for buf, x in zip(bufs, (a, b, None, bias, r)):
        if x is not None:
            launcher.upload(buf, x)
    for g in row_major_matmul("float32", bufs[0].ptr, a.shape, bufs[1].ptr, b.shape, bufs[2].ptr, 4, beta=1.0,
                              c_in=bufs[4].ptr, bias=bufs[3].ptr, activation=act):
        assert g.m == want.shape[-1]  # the bias lands on D's rows
        launcher.gemm(g)
    want = want + r + bias
    want = {"": want, "relu": np.maximum(want, 0),
            "gelu_tanh": 0.5 * want * (1 + np.tanh(np.sqrt(2 / np.pi) * (want + 0.044715 * want ** 3)))}[act]
    np.testing.assert_allclose(launcher.view(bufs[2]).view(np.float32).reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(launcher.view(bufs[4]).view(np.float32).reshape(r.shape), r)  # C is only read


def test_a_bias_on_the_wrong_side_gives_other_numbers():
    """The same call with the bias taken per column of D (as a row-major bias per row would be)
    differs: the stand-in catches a swapped side."""
    mem = np.zeros(4096, np.float32)
    base = mem.ctypes.data

    def typed_at(ptr, count, dtype):
        off = (ptr - base) // 4
        return mem[off:off + count]
    rng = np.random.default_rng(3)
    a, b, bias = rng.standard_normal((4, 6)), rng.standard_normal((6, 4)), rng.standard_normal(4)
    mem[:24], mem[256:280], mem[512:516] = a.ravel(), b.ravel(), bias
    (g,) = row_major_matmul("float32", base, a.shape, base + 1024, b.shape, base + 4096, 4, bias=base + 2048)
    reference_gemm(g, typed_at)
    got = mem[1024:1040].reshape(4, 4)
    np.testing.assert_allclose(got, a @ b + bias[None, :], rtol=1e-5)
    assert not np.allclose(got, a @ b + bias[:, None])


def test_no_cublaslt_epilogue_for_an_unknown_activation():
    with pytest.raises(ValueError, match="no cuBLASLt epilogue"):
        reference_gemm(Gemm("float32", False, False, 1, 1, 1, 8, 1, 0, 8, 1, 0, 8, 1, 0, activation="silu"),
                       lambda *a: None)


def _two_layers():
    """Two matmuls of one shape (one cuBLASLt descriptor) with different biases, each followed
    by its residual and ReLU; the model and its numpy reference."""
    rng = np.random.default_rng(4)
    w1, w2 = ((rng.standard_normal((64, 64)) * 0.2).astype(np.float32) for _ in range(2))
    c1, c2 = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["y"]), helper.make_node("Add", ["y", "C1"], ["yb"]),
             helper.make_node("Add", ["yb", "r"], ["yr"]), helper.make_node("Relu", ["yr"], ["h"]),
             helper.make_node("MatMul", ["h", "W2"], ["u"]), helper.make_node("Add", ["u", "C2"], ["ub"]),
             helper.make_node("Add", ["ub", "h"], ["ur"]), helper.make_node("Relu", ["ur"], ["z"])]
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 32, 64])  # noqa: E731
    inits = [numpy_helper.from_array(v, k) for k, v in {"W1": w1, "W2": w2, "C1": c1, "C2": c2}.items()]
    model = helper.make_model(helper.make_graph(nodes, "m", [vi("x"), vi("r")], [vi("z")], inits),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)

    def reference(feeds):
        h = np.maximum(feeds["x"] @ w1 + c1 + feeds["r"], 0)
        return np.maximum(h @ w2 + c2 + h, 0)
    return model, reference


def _check_two_layers(session, run):
    assert _absorbed(session) == ["bias", "residual", "relu"] * 2 and not session.plan.kernels
    model, reference = _two_layers()
    for seed in (0, 1):
        feeds = _feeds(model, seed=seed)
        (got,), want = run(feeds), reference(feeds)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_two_layers_of_one_shape_keep_their_own_bias(monkeypatch):
    launcher = on_standin(monkeypatch, True)
    session = gir.Session(_two_layers()[0], target="cuda:sm_90", limit=1)
    g1, g2 = _gemms(session)
    assert g1.shape_key == g2.shape_key and g1.bias != g2.bias
    _check_two_layers(session, lambda feeds: check_one_run(session, launcher, feeds))


@pytest.mark.gpu
def test_real_gpu_bias_residual_relu_in_cublaslt(monkeypatch):
    """On a GPU: the two layers above (one descriptor, the bias pointer set per call), replayed
    from the captured graph, against numpy."""
    real = session_module.get_target
    monkeypatch.setattr(session_module, "get_target", lambda name: dataclasses.replace(
        real(name), peak_flops=1.0, peak_matrix_flops=1.0))
    try:
        session = gir.Session(_two_layers()[0], target="cuda:sm_90", limit=1)
    except NoDeviceError as e:
        assert len(str(e).splitlines()) == 1
        pytest.skip(str(e))
    _check_two_layers(session, lambda feeds: session.run(None, feeds))


def _cuda_launcher_or_skip():
    """The CUDA launcher with cuBLASLt, or a skip naming why (one line)."""
    try:
        launcher = device.open_launcher("cuda")
        launcher.check_library()
    except NoDeviceError as e:
        assert len(str(e).splitlines()) == 1
        pytest.skip(str(e))
    return launcher


@pytest.mark.gpu
def test_real_gpu_gelu_bias_is_the_tanh_form():
    """cuBLASLt's GELU_BIAS on one GEMM, against the tanh and erf forms of GELU (they differ by
    up to 4.7e-4): it must be nearer the tanh form before a target may declare gelu_tanh."""
    launcher = _cuda_launcher_or_skip()
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((96, 64)).astype(np.float32), (rng.standard_normal((64, 80)) * 0.3).astype(np.float32)
    bias = rng.standard_normal(80).astype(np.float32)
    bufs = [launcher.alloc(x.nbytes) for x in (a, b, np.empty((96, 80), np.float32), bias)]
    for buf, x in ((bufs[0], a), (bufs[1], b), (bufs[3], bias)):
        launcher.upload(buf, x)
    (g,) = row_major_matmul("float32", bufs[0].ptr, a.shape, bufs[1].ptr, b.shape, bufs[2].ptr, 4, bias=bufs[3].ptr,
                            activation="gelu_tanh")
    assert g.epilogue == 36
    launcher.prepare_gemm(g)
    launcher.gemm(g)
    launcher.sync()
    got = np.empty((96, 80), np.float32)
    launcher.download(bufs[2], got)
    y = (a.astype(np.float64) @ b + bias).astype(np.float64)
    tanh_form = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    erf_form = 0.5 * y * (1 + np.vectorize(math.erf)(y / np.sqrt(2)))
    to_tanh, to_erf = float(np.abs(got - tanh_form).max()), float(np.abs(got - erf_form).max())
    print(f"GELU_BIAS: max |cuBLASLt - tanh form| = {to_tanh:.3g}, max |cuBLASLt - erf form| = {to_erf:.3g}")
    assert to_tanh < to_erf and to_tanh <= 1e-3 * max(1.0, float(np.abs(y).max()))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_real_gpu_half_bias_residual_relu_in_one_cublaslt_call(dtype):
    """bias + residual (C apart from D) + ReLU in one half-precision cuBLASLt call, the bias in
    the output's dtype, fp32 accumulation: within a few half-ulps of the float64 result rounded
    once. What decides whether a target may declare the epilogue kinds for this dtype."""
    launcher = _cuda_launcher_or_skip()
    half = np.dtype(dtype)
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((3, 40, 64)), rng.standard_normal((64, 72)) * 0.2
    bias, res = rng.standard_normal(72), rng.standard_normal((3, 40, 72))
    a, b, bias, res = (x.astype(half) for x in (a, b, bias, res))
    out = np.zeros((3, 40, 72), half)
    bufs = [launcher.alloc(x.nbytes) for x in (a, b, bias, res, out)]
    for buf, x in zip(bufs, (a, b, bias, res, out)):
        launcher.upload(buf, x)
    calls = row_major_matmul(dtype, bufs[0].ptr, a.shape, bufs[1].ptr, b.shape, bufs[4].ptr, half.itemsize, beta=1.0,
                             c_in=bufs[3].ptr, bias=bufs[2].ptr, activation="relu")
    for g in calls:
        launcher.prepare_gemm(g)
        launcher.gemm(g)
    launcher.sync()
    launcher.download(bufs[4], out)
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64) + res.astype(np.float64), 0)
    err = np.abs(out.astype(np.float64) - want) / np.maximum(1.0, np.abs(want))
    eps = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    print(f"{dtype} bias+residual+relu epilogue: max error {err.max():.3g} ({err.max() / eps:.2f} ulp at 1.0)")
    assert err.max() <= 4 * eps
