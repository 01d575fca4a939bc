"""bfloat16 end to end: Cast round trips (NaN, inf, ties to even, subnormals, overflow), elementwise
ops and reductions on bf16 tensors, through the reference interpreter, the native CPU engine,
the CUDA and HIP engines on the CPU harness and the OpenCL backend on PoCL, against numpy with
ml_dtypes. Values are computed in fp32 and rounded once when stored; reductions and library
GEMMs accumulate in fp32. Also: eight halves per 128-bit access, the bf16 ridge point, the
partition's fallback when lowering a conv fails."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import gir
from gir.backends.errors import ToolchainMissingError
from gir.backends.harness.recording import RecordingLauncher, harness_toolchain
from gir.frontend import load, run_reference
from gir.ir.dtypes import accumulator, is_float, itemsize, np_dtype
from gir.backends import device_engine as device
from gir.runtime.session import SessionError

BF16 = np.dtype(ml_dtypes.bfloat16)

# float32 values whose bf16 rounding is easy to get wrong
SPECIAL = np.array([
    1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20,  # ties to even; just above a tie
    3.4028235e38, -3.4028235e38, 3.3961776e38,  # rounds to inf; the largest finite bf16
    np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0,
    1e-40, 3e-39, 9.2e-41, 2 ** -133,  # subnormal floats keep their top bits
    65504.0, 1e10, -7.0e-3, 0.1, 1 / 3,
], np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    """bf16 bit patterns, every NaN as one canonical quiet NaN of its sign."""
    u = np.asarray(a).view(np.uint16).copy()
    nan = np.isnan(np.asarray(a).astype(np.float32))
    u[nan] = (u[nan] & 0x8000) | 0x7fc0
    return u


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "bf16", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def cast_model(n: int):
    """float32 -> bf16 -> (bf16 out, float32 out): both Cast directions."""
    return _model([helper.make_node("Cast", ["x"], ["b"], to=T.BFLOAT16),
                   helper.make_node("Cast", ["b"], ["f"], to=T.FLOAT),
                   helper.make_node("Identity", ["b"], ["y"])],
                  [helper.make_tensor_value_info("x", T.FLOAT, [n])],
                  [helper.make_tensor_value_info("y", T.BFLOAT16, [n]), helper.make_tensor_value_info("f", T.FLOAT, [n])])


def ops_model(rows: int = 8, cols: int = 200):
    """bf16 input and initializer; elementwise ops (each rounded to bf16), a sum and a max over
    rows, a mean over everything; bf16 and float32 outputs."""
    c = numpy_helper.from_array(np.linspace(-1.5, 1.5, cols).astype(BF16), "c")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    return _model([
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Exp", ["m"], ["e"]),
        helper.make_node("Add", ["e", "x"], ["y"]),
        helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=1),
        helper.make_node("ReduceMax", ["x", "axes"], ["mx"], keepdims=0),
        helper.make_node("ReduceMean", ["y"], ["mean"], keepdims=0),
        helper.make_node("Cast", ["s"], ["s32"], to=T.FLOAT),
    ], [helper.make_tensor_value_info("x", T.BFLOAT16, [rows, cols])],
        [helper.make_tensor_value_info("y", T.BFLOAT16, [rows, cols]),
         helper.make_tensor_value_info("s", T.BFLOAT16, [rows, 1]),
         helper.make_tensor_value_info("mx", T.BFLOAT16, [rows]),
         helper.make_tensor_value_info("mean", T.BFLOAT16, []),
         helper.make_tensor_value_info("s32", T.FLOAT, [rows, 1])], [c, axes])


def ops_reference(x: np.ndarray, cols: int = 200):
    """numpy with ml_dtypes: each op in fp32 rounded to bf16; reductions accumulated in fp32 (float64 here)."""
    c = np.linspace(-1.5, 1.5, cols).astype(BF16)
    f = lambda a: a.astype(np.float32)  # noqa: E731
    m = (f(x) * f(c)).astype(BF16)
    e = np.exp(f(m)).astype(BF16)
    y = (f(e) + f(x)).astype(BF16)
    s = f(y).astype(np.float64).sum(1, keepdims=True)
    return {"y": y, "s": s.astype(np.float32).astype(BF16), "mx": f(x).max(1).astype(BF16),
            "mean": np.asarray(f(y).astype(np.float64).mean()).astype(np.float32).astype(BF16)}


def on_harness(monkeypatch, backend: str) -> RecordingLauncher:
    """GPU sessions get the recording stand-in: emitted CUDA/HIP source runs on the CPU harness."""
    launcher = RecordingLauncher(dialect=backend)
    monkeypatch.setattr(device, "open_launcher", lambda b: launcher)
    monkeypatch.setattr(device, "_toolchain", harness_toolchain)
    return launcher


ENGINES = ["interpreter", "native", "cuda", "hip"]


def session(model, engine: str, monkeypatch):
    if engine in ("cuda", "hip"):
        on_harness(monkeypatch, engine)
        return gir.Session(model, target="h100" if engine == "cuda" else "mi250x", limit=1)
    return gir.Session(model, target="cpu", engine=engine)


def test_bf16_is_a_dtype():
    assert np_dtype("bfloat16") == BF16 and itemsize("bfloat16") == 2
    assert is_float("bfloat16") and accumulator("bfloat16") == "float32"


@pytest.mark.parametrize("engine", ENGINES)
def test_cast_round_trip_rounds_to_nearest_even(engine, monkeypatch):
    x = np.concatenate([SPECIAL, np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 1e3])
    y, f = session(cast_model(x.size), engine, monkeypatch).run(None, {"x": x})
    assert y.dtype == BF16 and f.dtype == np.float32
    np.testing.assert_array_equal(bits(y), bits(x.astype(BF16)))
    np.testing.assert_array_equal(bits(f.astype(BF16)), bits(x.astype(BF16)))
    np.testing.assert_array_equal(np.signbit(f), np.signbit(x))  # -0.0 and -nan keep their sign
    assert np.isnan(f[np.isnan(x)]).all()


def test_ties_round_to_even():
    """1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: it goes to the even 1.0; 1 + 3 * 2^-8 up."""
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8], np.float32)
    (y, _f) = gir.Session(cast_model(2), target="cpu").run(None, {"x": x})
    assert y.astype(np.float32).tolist() == [1.0, 1 + 2 ** -6]


@pytest.mark.parametrize("engine", ENGINES)
def test_elementwise_and_reductions_in_bf16(engine, monkeypatch):
    x = (np.random.default_rng(1).standard_normal((8, 200)) * 2).astype(BF16)
    got = dict(zip(["y", "s", "mx", "mean", "s32"], session(ops_model(), engine, monkeypatch).run(None, {"x": x})))
    want = ops_reference(x)
    np.testing.assert_array_equal(bits(got["y"]), bits(want["y"]))  # rounded once per op, exactly
    np.testing.assert_array_equal(bits(got["mx"]), bits(want["mx"]))
    assert got["s"].dtype == got["mean"].dtype == BF16 and got["s32"].dtype == np.float32
    np.testing.assert_array_equal(got["s32"], got["s"].astype(np.float32))
    # fp32 accumulation, rounded once to bf16: at most one bf16 ulp (2^-7 relative) from the exact
    # sum rounded (a bf16 accumulator would drift by many ulps over 200 terms)
    for name in ("s", "mean"):
        np.testing.assert_allclose(got[name].astype(np.float32), want[name].astype(np.float32), rtol=2.0 ** -7, atol=0)


def test_bf16_constant_and_reference_agree():
    """The frontend's numpy reference (which folds constants) and the compiled CPU engine agree
    bit for bit; a bf16 Constant node folds into a bf16 tensor."""
    const = helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([0.3, -2.5], BF16)))
    model = _model([const, helper.make_node("Mul", ["x", "k"], ["y"])],
                   [helper.make_tensor_value_info("x", T.BFLOAT16, [4, 2])],
                   [helper.make_tensor_value_info("y", T.BFLOAT16, [4, 2])])
    x = np.arange(8, dtype=np.float32).reshape(4, 2).astype(BF16)
    ref = run_reference(load(model), {"x": x})["y"]
    got = gir.Session(model, target="cpu").run(None, {"x": x})[0]
    want = (x.astype(np.float32) * np.array([0.3, -2.5], BF16).astype(np.float32)).astype(BF16)
    np.testing.assert_array_equal(bits(ref), bits(want))
    np.testing.assert_array_equal(bits(got), bits(want))


def test_session_checks_bf16_feeds():
    s = gir.Session(ops_model(), target="cpu")
    assert s.get_inputs()[0].type == "tensor(bfloat16)"
    with pytest.raises(SessionError):
        s.run(None, {"x": np.zeros((8, 200), np.float32)})


@pytest.mark.parametrize("backend,arch", [("cuda", "sm_90"), ("hip", "gfx90a")])
def test_bf16_kernels_compile(backend, arch):
    """The emitted bf16 source compiles with NVRTC (cuda_bf16.h) and hiprtc (16-bit storage and the
    prelude's conversions: no hip bf16 header)."""
    from gir.fusion.plan import plan
    from gir.ir.target import get_target
    graph = load(ops_model())
    p = plan(graph, get_target("h100" if backend == "cuda" else "mi250x"), limit=1)
    if backend == "cuda":
        from gir.backends.cuda import compile as build
    else:
        from gir.backends.hip import compile as build
    try:
        built = [build(k.graph) for k in p.kernels]
    except ToolchainMissingError as e:
        pytest.skip(str(e))
    assert built and all(b.binary for b in built)


def test_bf16_gemms_use_the_matrix_peak():
    """The partition's ridge point: bf16 GEMMs run on the matrix units, as fp16 ones do."""
    from gir.ir.target import get_target
    h100 = get_target("h100")
    assert h100.ridge_point("bfloat16") == h100.ridge_point("float16") > h100.ridge_point("float32")


@pytest.mark.parametrize("backend,target", [("cuda", "h100"), ("hip", "mi250x")])
@pytest.mark.parametrize("elem", [T.FLOAT16, T.BFLOAT16])
def test_eight_halves_per_128_bit_access(elem, backend, target):
    """fp16/bf16 pointwise ops offer vec=8: one 16-byte load or store per lane moves eight halves
    (uint4, two per 32-bit word, the first in the low bits), exact on the harness; NVRTC's PTX has
    the v4 accesses."""
    import dataclasses

    from gir.backends.harness.graph_runner import emitter_for, run_on_cpu_harness
    from gir.backends.kernels import emit_graph
    from gir.ir.target import get_target
    from gir.ir.vector_access import wide_share
    from gir.rewrite.driver import optimize
    from gir.templates import candidates
    half = helper.tensor_dtype_to_np_dtype(elem)
    model = _model([helper.make_node("Add", ["x", "z"], ["y"])],
                   [helper.make_tensor_value_info(n, elem, [64, 1024]) for n in ("x", "z")],
                   [helper.make_tensor_value_info("y", elem, [64, 1024])])
    graph = load(model)
    t = get_target(target)
    cand = next(c for c in candidates(graph.ops[0], graph.tensors, t).candidates if c.params.get("vec") == 8)
    cand = dataclasses.replace(cand, graph=optimize(cand.graph)[0])
    assert wide_share(cand.graph) == 1.0
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal(64 * 1024).astype(np.float32).astype(half) for n in ("x", "z")}
    got = run_on_cpu_harness(cand.graph, feeds, backend)["y"]
    want = (feeds["x"].astype(np.float32) + feeds["z"].astype(np.float32)).astype(half)
    np.testing.assert_array_equal(np.asarray(got).reshape(-1).view(np.uint16), want.view(np.uint16))
    source, _ = emit_graph(emitter_for(backend, t), cand.graph)
    assert source.count("const uint4 v = ") == 2 and source.count("*(uint4*)") == 1
    try:
        if backend == "cuda":
            from gir.backends.cuda.compiler import compile_cuda
            ptx = compile_cuda(source, "sm_90").ptx
            ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
            assert ptx.count("ld.global.nc.v4") == 2 and ptx.count("st.global.v4") == 1
        else:
            from gir.backends.hip.compiler import compile_hip
            compile_hip(source, "gfx90a")
    except ToolchainMissingError as e:
        pytest.skip(str(e))


def _opencl_bf16_errors() -> list[int]:
    """In a spawned worker (PoCL and hiprtc abort in one process): a bf16 model's fused kernels
    on the OpenCL backend (PoCL, on the CPU); mismatched bf16 elements per output."""
    from gir.backends import opencl
    from gir.fusion.plan import plan
    from gir.ir import get_target
    x = (np.random.default_rng(1).standard_normal((8, 200)) * 2).astype(BF16)
    graph = load(ops_model())
    p = plan(graph, get_target("opencl"), limit=1)
    env = {n: t.value.reshape(-1) for n, t in graph.tensors.items() if t.value is not None} | {"x": x.reshape(-1)}
    for k in p.kernels:
        outs = opencl.run(k.graph, {n: v for n, v in env.items() if n in k.graph.buffers})
        env.update({n: np.asarray(v).reshape(-1) for n, v in outs.items()})
    want = ops_reference(x)
    return [int((bits(env[n].reshape(want[n].shape)) != bits(want[n])).sum()) for n in ("y", "mx")]


def test_bf16_on_opencl():
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    pytest.importorskip("pyopencl")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(_opencl_bf16_errors).result() == [0, 0]


@pytest.mark.parametrize("backend,target", [("cuda", "h100"), ("hip", "mi250x")])
def test_bf16_library_gemm_on_the_device_engine(backend, target, monkeypatch):
    """A bf16 MatMul left to the GPU library (cuBLASLt CUDA_R_16BF / hipBLAS R_16B, fp32 compute):
    on the recording stand-in, GEMMs run by cuBLAS's rules in numpy, fp32 accumulation rounded once."""
    import dataclasses

    from gir.runtime import session as session_module
    launcher = on_harness(monkeypatch, backend)
    real = session_module.get_target
    monkeypatch.setattr(session_module, "get_target", lambda name: dataclasses.replace(
        real(name), peak_flops=1.0, peak_matrix_flops=1.0))  # ridge ~0: the MatMul is a library call
    w = (np.random.default_rng(4).standard_normal((128, 96)) / 8).astype(BF16)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                   [helper.make_tensor_value_info("x", T.BFLOAT16, [64, 128])],
                   [helper.make_tensor_value_info("y", T.BFLOAT16, [64, 96])], [numpy_helper.from_array(w, "w")])
    x = np.random.default_rng(5).standard_normal((64, 128)).astype(BF16)
    (y,) = gir.Session(model, target=target, limit=1).run(None, {"x": x})
    assert launcher.counts()["gemm"] > 0
    want = np.maximum((x.astype(np.float32) @ w.astype(np.float32)).astype(BF16).astype(np.float32), 0).astype(BF16)
    assert y.dtype == BF16
    np.testing.assert_allclose(y.astype(np.float32), want.astype(np.float32), rtol=2.0 ** -7, atol=1e-6)


def test_a_conv_whose_lowered_form_is_too_large_stays_in_the_library(monkeypatch):
    """At the half types' ridge (the matrix peak) a conv can fall just below it; where its lowered
    window tensor exceeds the planner's tensor limit, the partition keeps it a library call."""
    from gir.fusion.partition import partition
    from gir.ir.target import get_target
    w = numpy_helper.from_array(np.ones((16, 16, 3, 3), BF16), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                   [helper.make_tensor_value_info("x", T.BFLOAT16, [1, 16, 32, 32])],
                   [helper.make_tensor_value_info("y", T.BFLOAT16, [1, 16, 32, 32])], [w])
    model.opset_import[0].version = 22  # Conv takes bf16 from opset 22
    graph = load(model)
    assert partition(graph, get_target("h100")).library == []  # below the ridge: lowered into GIR
    monkeypatch.setenv("GIR_MAX_TENSOR_ELEMENTS", "100000")  # the window tensor has 16*32*32*16*9 elements
    part = partition(graph, get_target("h100"))
    assert [op.kind for op in part.library] == ["conv"]
    assert "lowering it fails" in part.decisions[0].reason and "GIR_MAX_TENSOR_ELEMENTS" in part.decisions[0].reason
