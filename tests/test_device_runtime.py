"""The GPU runtime stays on the device (gir/backends/device_engine.py), checked without a GPU through
the recording stand-in (gir/backends/harness/recording.py): kernels run on the CPU harness,
GEMMs in numpy with cuBLAS's column-major conventions, every copy, launch, GEMM and sync
recorded. A run must copy exactly the feeds in and the outputs out, wait once, and move no
weight; the numbers must match onnxruntime."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
import models
from gir.backends.blas import Gemm, check_gemm, reference_gemm, row_major_matmul
from gir.backends.errors import LibraryUnavailable, NoDeviceError
from gir.backends.harness.recording import CaptureError, RecordingLauncher, harness_toolchain
from gir.frontend.basic import BasicOp
from gir.backends import device_engine as device
from gir.runtime import session as session_module

REL = 1e-4


def ort_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_matches(got, want, rel=REL):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
        np.testing.assert_allclose(g, w, rtol=rel, atol=rel * scale / 10)


def on_standin(monkeypatch, library_everywhere: bool, backend: str = "cuda", **kw) -> RecordingLauncher:
    """Sessions on GPU targets get the stand-in. `library_everywhere` lowers the target's ridge
    point to ~0, so every matmul and conv of a tiny model is a library call (at the real
    H100 ridge, a tiny model has none)."""
    launcher = RecordingLauncher(dialect=backend, **kw)
    monkeypatch.setattr(device, "open_launcher", lambda b: launcher)
    monkeypatch.setattr(device, "_toolchain", harness_toolchain)
    if library_everywhere:
        real = session_module.get_target
        monkeypatch.setattr(session_module, "get_target", lambda name: dataclasses.replace(
            real(name), peak_flops=1.0, peak_matrix_flops=1.0))
    return launcher


def weight_buffers(session) -> set[int]:
    return {b.ptr for b in session.engine.constants.values()}


def check_one_run(session, launcher, feeds):
    """One run's recorded traffic; returns the outputs."""
    mark = launcher.mark()
    outputs = session.run(None, feeds)
    events = launcher.since(mark)
    counts = launcher.counts(mark)
    h2d = [e for e in events if e[0] == "h2d"]
    d2h = [e for e in events if e[0] == "d2h"]
    # host to device: exactly the feeds, into the inputs' resident buffers
    assert sorted(bytes(e[3]) for e in h2d) == sorted(np.ascontiguousarray(feeds[n]).tobytes() for n in session.graph.inputs)
    assert {e[1] for e in h2d} == {session.engine.inputs[n].ptr for n in session.graph.inputs}
    # device to host: exactly the outputs
    assert sorted(bytes(e[3]) for e in d2h) == sorted(o.tobytes() for o in outputs)
    assert counts["sync"] == 1 and events[-1] == ("sync", "stream")
    assert not {e[1] for e in h2d} & weight_buffers(session)  # no weight moves after creation
    assert counts["alloc"] == counts["free"] == 0
    return outputs


@pytest.mark.parametrize("library_everywhere", [False, True], ids=["h100-ridge", "all-library"])
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_a_run_moves_only_feeds_and_outputs(monkeypatch, name, library_everywhere):
    launcher = on_standin(monkeypatch, library_everywhere)
    model = models.load_bundled(name)
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    library = [s for s in session.plan.steps if isinstance(s, BasicOp)]
    assert bool(library) == library_everywhere
    created = launcher.counts()
    uploaded = sum(e[2] for e in launcher.events if e[0] == "h2d")
    assert uploaded >= sum(t.value.nbytes for t in session.graph.tensors.values() if t.value is not None)
    assert created["capture"] == 1 and created["launch"] == 0 and created["gemm"] == 0  # captured, not run
    for seed in (0, 1):
        feeds = models.example_inputs(model, seed)
        assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))
    (graph,) = [e[1] for e in launcher.events if e[0] == "replay"][:1]
    assert sum(op[0] == "gemm" for op in graph) >= len(library)


def test_the_hip_engine_is_the_same_logic(monkeypatch):
    """hip:gfx90a (64-lane wavefronts on the harness, hipBLAS's calls = cuBLAS's), no capture."""
    launcher = on_standin(monkeypatch, True, backend="hip", capture=False)
    model = models.load_bundled("bert")
    session = gir.Session(model, target="hip:gfx90a", limit=1)
    feeds = models.example_inputs(model, 0)
    mark = launcher.mark()
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))
    assert launcher.counts(mark)["gemm"] >= sum(isinstance(s, BasicOp) for s in session.plan.steps) > 0


def test_without_graph_capture_the_plan_is_launched_the_same(monkeypatch):
    launcher = on_standin(monkeypatch, True, capture=False)
    model = models.load_bundled("bert")
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    feeds = models.example_inputs(model, 0)
    mark = launcher.mark()
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))
    counts = launcher.counts(mark)
    assert counts["replay"] == 0 and counts["launch"] > 0 and counts["gemm"] > 0


def test_a_capture_that_fails_launches_call_by_call(monkeypatch):
    launcher = on_standin(monkeypatch, True)
    plain = launcher.gemm

    def gemm(g):
        if launcher._capturing is not None:
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED during capture")
        plain(g)
    monkeypatch.setattr(launcher, "gemm", gemm)
    model = models.load_bundled("gpt2")
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    assert session.engine.graph is None and "capture failed" in session.engine.library_note
    feeds = models.example_inputs(model, 0)
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


def _conv_model():
    """Grouped, strided, padded, dilated convs with and without bias, a 1x1 conv (no im2col),
    a depthwise conv and a matmul with broadcast batch dims."""
    rng = np.random.default_rng(3)
    inits = {"w1": rng.standard_normal((8, 2, 3, 3)), "b1": rng.standard_normal(8),
             "w2": rng.standard_normal((6, 8, 1, 1)), "b2": rng.standard_normal(6),
             "w3": rng.standard_normal((6, 1, 3, 3)), "w4": rng.standard_normal((4, 6, 2, 3)),
             "m": rng.standard_normal((1, 3, 7))}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], group=2, strides=[2, 1], pads=[1, 2, 1, 0],
                              dilations=[1, 2]),
             helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"]),
             helper.make_node("Conv", ["c2", "w3"], ["c3"], group=6, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c3", "w4"], ["c4"], strides=[1, 2]),
             helper.make_node("MatMul", ["c4", "m"], ["y"])]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 9, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 4, 7])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("how", ["no-conv-library", "GIR_DEVICE_CONV=im2col"])
def test_convolutions_as_im2col_and_gemm(monkeypatch, how):
    if how == "no-conv-library":
        launcher = on_standin(monkeypatch, True, conv_library=False)
    else:
        launcher = on_standin(monkeypatch, True)
        monkeypatch.setenv("GIR_DEVICE_CONV", "im2col")
    model = _conv_model()
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    kinds = [s.kind for s in session.plan.steps if isinstance(s, BasicOp)]
    assert kinds.count("conv") == 4 and "matmul" in kinds
    graph = session.engine.graph
    im2col = [op for op in graph if op[0] == "launch" and op[1].startswith("gir_im2col")]
    assert len(im2col) == 3  # the 1x1 conv reads its input directly
    assert not any(op[0] == "conv" for op in graph)
    assert "convolutions: im2col + " in session.engine.library_path
    feeds = {"x": np.random.default_rng(4).standard_normal((2, 4, 9, 10)).astype(np.float32)}
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


@pytest.mark.parametrize("conv_bias", [True, False], ids=["bias-fused", "bias-by-gemm"])
def test_convolutions_in_the_conv_library(monkeypatch, conv_bias):
    """Each conv is one library call on resident pointers (cuDNN's convention, executed by the
    stand-in); a library that cannot fuse the bias gets it added by a rank-1 GEMM after."""
    launcher = on_standin(monkeypatch, True, conv_bias=conv_bias)
    model = _conv_model()
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    graph = session.engine.graph
    convs = [op[1] for op in graph if op[0] == "conv"]
    assert len(convs) == 4 and not any(op[0] == "launch" and op[1].startswith("gir_im2col") for op in graph)
    assert sorted(c.groups for c in convs) == [1, 1, 2, 6]
    assert sum(bool(c.bias) for c in convs) == (2 if conv_bias else 0)
    gemms = [op[1] for op in graph if op[0] == "gemm"]
    bias_gemms = [g for g in gemms if g.beta == 1.0]  # rank-1: bias x ones, added to y
    assert len(gemms) - len(bias_gemms) == 1 and bool(bias_gemms) != conv_bias
    assert "convolutions: recording stand-in" in session.engine.library_path
    assert session.engine.col is None  # no im2col buffer
    for seed in (4, 5):
        feeds = {"x": np.random.default_rng(seed).standard_normal((2, 4, 9, 10)).astype(np.float32)}
        assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


def test_a_conv_the_library_refuses_runs_as_im2col(monkeypatch):
    launcher = on_standin(monkeypatch, True, conv_refuses=lambda c: max(c.dilations) > 1)
    model = _conv_model()
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    graph = session.engine.graph
    assert [op[0] for op in graph].count("conv") == 3
    assert sum(op[0] == "launch" and op[1].startswith("gir_im2col") for op in graph) == 1
    assert "(1 as im2col + " in session.engine.library_path
    feeds = {"x": np.random.default_rng(6).standard_normal((2, 4, 9, 10)).astype(np.float32)}
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


def _single_conv(x_shape, w_shape, dtype=np.float32, bias=True, **attrs):
    rng = np.random.default_rng(len(x_shape) + sum(w_shape))
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(dtype), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(dtype), "b"))
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    nsp = len(x_shape) - 2
    pads, strides = attrs.get("pads", [0] * 2 * nsp), attrs.get("strides", [1] * nsp)
    dilations = attrs.get("dilations", [1] * nsp)
    y_shape = [x_shape[0], w_shape[0]] + [(x_shape[2 + d] + pads[d] + pads[nsp + d] - dilations[d] * (w_shape[2 + d] - 1)
                                           - 1) // strides[d] + 1 for d in range(nsp)]
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", elem, x_shape)],
                              [helper.make_tensor_value_info("y", elem, y_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


CONV_CASES = {
    "1d-asymmetric": ((2, 6, 17), (4, 3, 4), dict(group=2, pads=[2, 1], strides=[2], dilations=[2])),
    "2d-depthwise-s2": ((1, 8, 11, 9), (8, 1, 5, 5), dict(group=8, pads=[2, 2, 2, 2], strides=[2, 2])),
    "2d-dilated": ((1, 3, 12, 10), (5, 3, 3, 2), dict(pads=[0, 1, 2, 0], dilations=[2, 3])),
    "3d": ((1, 4, 5, 6, 7), (6, 2, 2, 3, 3), dict(group=2, pads=[1, 0, 1, 0, 1, 2], strides=[1, 2, 1])),
    # 576-term sums: TF32 products (10-bit mantissas) would miss the fp32 bound of the gpu test
    "2d-wide": ((1, 64, 14, 14), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1])),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_reference_conv_is_onnx_conv(case, dtype):
    """dnn.reference_conv (what the stand-in runs for cuDNN) against onnxruntime's Conv: ranks
    1-3, groups, strides, dilations, pads that differ before and after."""
    from gir.backends.dnn import conv_call, reference_conv
    x_shape, w_shape, attrs = CONV_CASES[case]
    model = _single_conv(x_shape, w_shape, dtype, **attrs)
    x = np.random.default_rng(9).standard_normal(x_shape).astype(dtype)
    (want,) = ort_outputs(model, {"x": x})
    nsp = len(x_shape) - 2
    full = {"strides": attrs.get("strides", [1] * nsp), "dilations": attrs.get("dilations", [1] * nsp),
            "pads": attrs.get("pads", [0] * 2 * nsp)}
    w, b = (numpy_helper.to_array(t) for t in model.graph.initializer)
    y = np.full(want.shape, np.nan, dtype)
    memory = {a.ctypes.data: a for a in (x, w, b, y)}

    def typed_at(ptr, count, dt):
        assert memory[ptr].dtype == dt and memory[ptr].size == count
        return memory[ptr].reshape(-1)
    reference_conv(conv_call(np.dtype(dtype).name, x.ctypes.data, x.shape, w.ctypes.data, w.shape,
                             y.ctypes.data, y.shape, full, b.ctypes.data), typed_at)
    tol = 1e-4 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(y.astype(np.float32), want.astype(np.float32), rtol=tol,
                               atol=tol * float(np.abs(want).max()))


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_library_conv_shapes_through_the_session(monkeypatch, case):
    launcher = on_standin(monkeypatch, True)
    x_shape, w_shape, attrs = CONV_CASES[case]
    model = _single_conv(x_shape, w_shape, **attrs)
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    assert [op[0] for op in session.engine.graph].count("conv") == 1
    feeds = {"x": np.random.default_rng(2).standard_normal(x_shape).astype(np.float32)}
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


def test_the_standin_executes_gemms_as_cublas_defines_them():
    """Column-major, ld >= rows, strided batches: a call with its operands swapped or a row
    stride given as ld gives other numbers, or is refused as cuBLAS refuses it."""
    mem = np.zeros(1 << 16, np.float32)
    base = mem.ctypes.data

    def typed_at(ptr, count, dtype):
        off = (ptr - base) // 4
        assert 0 <= off and off + count <= mem.size
        return mem[off:off + count]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    pa, pb, pc = base, base + 4096, base + 8192
    mem[:a.size], mem[1024:1024 + b.size] = a.ravel(), b.ravel()
    (g,) = row_major_matmul("float32", pa, a.shape, pb, b.shape, pc, 4)
    assert (g.m, g.n, g.k, g.a, g.lda, g.b, g.ldb, g.ldc) == (5, 6, 4, pb, 5, pa, 4, 5)  # B shared: one 6 x 4 A
    reference_gemm(g, typed_at)
    np.testing.assert_allclose(mem[2048:2048 + 30].reshape(2, 3, 5), a @ b, rtol=1e-5)
    swapped = dataclasses.replace(g, a=g.b, b=g.a, lda=g.ldb, ldb=g.lda)
    with pytest.raises(ValueError, match="lda=4 < 5"):
        check_gemm(swapped)
    mem[2048:2048 + 30] = 0
    reference_gemm(dataclasses.replace(g, transa=True, lda=4), typed_at)  # B read as if stored transposed
    assert not np.allclose(mem[2048:2048 + 30].reshape(2, 3, 5), a @ b)
    with pytest.raises(ValueError, match="float32|int64"):
        check_gemm(Gemm("int64", False, False, 1, 1, 1, pa, 1, 0, pb, 1, 0, pc, 1, 0))


@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 3, 4), (2, 4, 5)),
                                             ((2, 1, 3, 4), (1, 3, 4, 5)), ((3, 4), (2, 2, 4, 5)),
                                             ((2, 3, 3, 4), (3, 4, 5)), ((1, 3, 4), (2, 1, 4, 5))])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_row_major_matmul_as_gemm_calls(a_shape, b_shape, dtype):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)
    want = np.matmul(a.astype(np.float32), b.astype(np.float32))
    launcher = RecordingLauncher()
    bufs = [launcher.alloc(x.nbytes) for x in (a, b, want.astype(dtype))]
    launcher.upload(bufs[0], a)
    launcher.upload(bufs[1], b)
    for g in row_major_matmul(dtype, bufs[0].ptr, a.shape, bufs[1].ptr, b.shape, bufs[2].ptr, a.itemsize):
        launcher.gemm(g)
    got = launcher.view(bufs[2]).view(dtype).reshape(want.shape)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2 if dtype == "float16" else 1e-5, atol=1e-2)


def test_stream_capture_refuses_copies_and_waits():
    launcher = RecordingLauncher()
    buf = launcher.alloc(16)
    launcher.begin_capture()
    with pytest.raises(CaptureError):
        launcher.copy_in(buf, np.zeros(4, np.float32))
    with pytest.raises(CaptureError):
        launcher.sync()


def test_gather_flags_are_read_back_only_for_device_computed_indices(monkeypatch):
    """BERT's embedding gathers index with a graph input (checked on the host): no flag read
    back. A gather of computed indices reads its flag in the run's one wait."""
    launcher = on_standin(monkeypatch, False)
    session = gir.Session(models.load_bundled("bert"), target="cuda:sm_90", limit=1)
    assert session.engine.flags is not None and session.engine.read_flags == 0
    table = numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(5, 4), "table")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [helper.make_node("Add", ["ids", "one"], ["shifted"]),
             helper.make_node("Gather", ["table", "shifted"], ["y"], name="lookup", axis=0)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], [table, one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    assert session.engine.read_flags == 1
    mark = launcher.mark()
    ids = np.array([[0, 1, 2], [-2, -6, 3]], np.int64)
    (y,) = session.run(None, {"ids": ids})
    np.testing.assert_array_equal(y, np.arange(20, dtype=np.float32).reshape(5, 4)[ids + 1])
    counts = launcher.counts(mark)
    assert counts["d2h"] == 2 and counts["sync"] == 1  # the output and the flag, one wait


def test_hip_without_hipblas_is_one_line_at_session_creation(monkeypatch):
    """Debian's ROCm 5.2 has no hipBLAS: a plan with library ops stops with one line naming it;
    a plan without runs."""
    from gir.backends.hip.launcher import check_hipblas
    try:
        check_hipblas()
    except LibraryUnavailable as e:
        message = str(e)
    else:
        pytest.skip("hipBLAS is installed here")
    assert len(message.splitlines()) == 1 and "hipBLAS" in message
    launcher = on_standin(monkeypatch, True, backend="hip")
    monkeypatch.setattr(launcher, "check_library", check_hipblas)
    with pytest.raises(LibraryUnavailable, match="hipBLAS") as err:
        gir.Session(models.load_bundled("bert"), target="hip:gfx90a", limit=1)
    assert len(str(err.value).splitlines()) == 1
    assert launcher.counts()["launch"] == 0  # nothing ran on the host instead


def test_missing_extra_is_one_line_naming_it(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nvmath" else real(name, *a))
    with pytest.raises(LibraryUnavailable) as err:
        gir.Session(models.load_bundled("bert"), target="cuda:sm_90", limit=1)
    assert isinstance(err.value, NoDeviceError)
    assert len(str(err.value).splitlines()) == 1 and "gir[cuda]" in str(err.value)


def test_gir_run_on_a_gpu_target_without_one_exits_3_with_one_line(capsys):
    """Here (no GPU, no gir[cuda] extra) `gir run --target cuda:sm_90` ends with exit 3."""
    from gir.cli import main
    try:
        device.open_launcher("cuda")
    except NoDeviceError:
        pass
    else:
        pytest.skip("this machine has a CUDA GPU and the extra")
    code = main(["run", str(models.bundled_path("bert")), "--target", "cuda:sm_90", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 3 and len(err.splitlines()) == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("library_everywhere", [False, True], ids=["h100-ridge", "all-library"])
@pytest.mark.parametrize("name", sorted(set(models.MODELS) - {"bert", "gpt2"}))
def test_zoo_model_on_the_standin(monkeypatch, name, library_everywhere):
    launcher = on_standin(monkeypatch, library_everywhere)
    model = models.load_bundled(name)
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    assert any(isinstance(s, BasicOp) for s in session.plan.steps) or not library_everywhere
    feeds = models.example_inputs(model, 0)
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["cuda:sm_90", "hip:gfx90a"])
def test_real_gpu_runs_library_ops_on_the_device(monkeypatch, target):
    """On a GPU: bert and the conv model with every matmul and conv in cuBLASLt / hipBLAS,
    twice (the second run replays the captured graph), against onnxruntime."""
    real = session_module.get_target
    monkeypatch.setattr(session_module, "get_target", lambda name: dataclasses.replace(
        real(name), peak_flops=1.0, peak_matrix_flops=1.0))
    for model in (models.load_bundled("bert"), _conv_model()):
        try:
            session = gir.Session(model, target=target, limit=1)
        except NoDeviceError as e:
            assert len(str(e).splitlines()) == 1
            pytest.skip(str(e))
        for seed in (0, 1):
            feeds = models.example_inputs(model, seed)
            assert_matches(session.run(None, feeds), ort_outputs(model, feeds))


@pytest.mark.parametrize("target", ["cuda:sm_90", "hip:gfx90a"])
def test_the_module_with_its_im2col_kernels_compiles(monkeypatch, target):
    """The engine's one module (the plan's kernels and the generated im2col kernels) through the
    real NVRTC / hiprtc and the resource checks, then run on the stand-in."""
    backend = target.split(":")[0]
    launcher = on_standin(monkeypatch, True, backend=backend, conv_library=False)
    emitter, _, _ = harness_toolchain(backend)
    from gir.backends.cuda.compiler import compile_cuda
    from gir.backends.hip.compiler import compile_hip
    compiled = []

    def compile_and_keep(source, arch):
        binary = (compile_cuda if backend == "cuda" else compile_hip)(source, arch)
        compiled.append(binary)
        return SimpleNamespace(source=source, resources=binary.resources)
    monkeypatch.setattr(device, "_toolchain", lambda b: (emitter, compile_and_keep, None))
    model = _conv_model()
    session = gir.Session(model, target=target, limit=1)
    assert sum(name.startswith("gir_im2col") for name in compiled[0].resources) == 3
    feeds = {"x": np.random.default_rng(5).standard_normal((2, 4, 9, 10)).astype(np.float32)}
    assert_matches(check_one_run(session, launcher, feeds), ort_outputs(model, feeds))


def _edge_model():
    """fp16 matmul and conv (fp16 GEMMs accumulate in fp32), an output that is an input, one
    that is a weight, and a batched matmul of two inputs (broadcast: separate calls)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float16), "w"),
             numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float16), "cw"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float16), "cb"),
             numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "k")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Conv", ["img", "cw", "cb"], ["z"], pads=[1, 1, 1, 1]),
             helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("Identity", ["k"], ["kk"]),
             helper.make_node("MatMul", ["a", "b"], ["c"])]
    f16, f32 = TensorProto.FLOAT16, TensorProto.FLOAT
    inputs = [("x", f16, [8, 16]), ("img", f16, [1, 3, 6, 6]), ("a", f32, [2, 1, 5, 64]), ("b", f32, [3, 64, 7])]
    outputs = [("y", f16, [8, 32]), ("z", f16, [1, 4, 6, 6]), ("xi", f16, [8, 16]), ("kk", f32, [3]),
               ("c", f32, [2, 3, 5, 7])]
    graph = helper.make_graph(nodes, "edges", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_fp16_and_outputs_that_are_inputs_or_weights(monkeypatch):
    launcher = on_standin(monkeypatch, True)
    model = _edge_model()
    session = gir.Session(model, target="cuda:sm_90", limit=1)
    rng = np.random.default_rng(1)
    feeds = {n.name: rng.standard_normal([d.dim_value for d in n.type.tensor_type.shape.dim]).astype(
        np.float16 if n.type.tensor_type.elem_type == TensorProto.FLOAT16 else np.float32) for n in model.graph.input}
    got, want = check_one_run(session, launcher, feeds), ort_outputs(model, feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-3,
                                   atol=2e-3 * max(1.0, float(np.abs(w.astype(np.float32)).max())))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_real_gpu_convolutions_in_cudnn(monkeypatch, dtype):
    """On an NVIDIA GPU: each CONV_CASES shape as a library conv, in cuDNN where the frontend is
    installed (a refused bias fusion or shape is allowed, and is printed), twice (the second
    run replays the graph), against onnxruntime; then the same through im2col + cuBLASLt. fp32
    within 1e-5 of the largest output: fp32 arithmetic, not TF32."""
    import importlib.util
    real = session_module.get_target
    monkeypatch.setattr(session_module, "get_target", lambda name: dataclasses.replace(
        real(name), peak_flops=1.0, peak_matrix_flops=1.0))
    tol = 1e-5 if dtype == np.float32 else 3e-3  # fp32: no TF32 (cuDNN's default engines were 1e-4 off)
    for path in ("library", "im2col"):
        monkeypatch.setenv("GIR_DEVICE_CONV", path)
        for case, (x_shape, w_shape, attrs) in sorted(CONV_CASES.items()):
            model = _single_conv(x_shape, w_shape, dtype, **attrs)
            try:
                session = gir.Session(model, target="cuda:sm_90", limit=1)
            except NoDeviceError as e:
                pytest.skip(str(e))
            engine = session.engine
            print(case, np.dtype(dtype).name, path, "|", engine.library_path, "|", engine.launcher.conv_refusals)
            if path == "library" and importlib.util.find_spec("cudnn"):
                assert "cudnn" in engine.library_path, engine.library_path
            for seed in (0, 1):
                feeds = {"x": np.random.default_rng(seed).standard_normal(x_shape).astype(dtype)}
                (got,), (want,) = session.run(None, feeds), ort_outputs(model, feeds)
                np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol,
                                           atol=tol * float(np.abs(want).max()), err_msg=f"{case} {path}")


def test_the_cudnn_frontend_is_imported_without_torch(tmp_path, monkeypatch):
    """The frontend package imports torch when it can; GIR keeps torch out of that import (an
    import that costs seconds, and failed inside a cached Session on an H200), unless the
    program has already imported torch itself."""
    import sys
    if "torch" in sys.modules:
        pytest.skip("torch is already imported in this process")
    for package, body in (("torch", "raise AssertionError('torch was imported')\n"),
                          ("cudnn", "try:\n    import torch\nexcept ImportError:\n    torch = None\n")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cudnn", raising=False)
    from gir.backends.cuda.conv_library import _cudnn_frontend
    try:
        module = _cudnn_frontend()
        assert module.__file__.startswith(str(tmp_path)) and module.torch is None
        assert "torch" not in sys.modules  # and `import torch` works again afterwards
        with pytest.raises(AssertionError, match="torch was imported"):
            import torch  # noqa: F401
    finally:
        sys.modules.pop("cudnn", None)
        sys.modules.pop("torch", None)
