"""Library ops (conv, matmul) of the native CPU engine on oneDNN and on the numpy fallback,
against the numpy oracle and onnxruntime; and the Session saying which path it uses."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
from gir.frontend.basic import BasicOp, Tensor
from gir.frontend.reference import conv_reference
from gir.runtime import onednn
from gir.runtime.library import run_library_op

needs_onednn = pytest.mark.skipif(onednn.library() is None, reason=f"oneDNN: {onednn.unavailable()}")

CONVS = {  # x shape, w shape, strides, pads (begin..., end...), dilations, group, bias
    "dense": ((2, 5, 9, 8), (7, 5, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1, True),
    "dense_no_bias": ((1, 4, 6, 6), (8, 4, 3, 3), [1, 1], [0, 0, 0, 0], [1, 1], 1, False),
    "pointwise": ((1, 16, 7, 5), (24, 16, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1, True),
    "pointwise_batched_no_bias": ((2, 12, 6, 9), (20, 12, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1, False),
    "grouped_strided_dilated": ((2, 6, 9, 11), (4, 3, 3, 2), [2, 1], [1, 0, 2, 1], [1, 2], 2, True),
    "depthwise": ((1, 8, 7, 7), (8, 1, 5, 5), [1, 1], [2, 2, 2, 2], [1, 1], 8, True),
    "depthwise_strided": ((1, 16, 12, 12), (16, 1, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 16, True),
    "depthwise_multiplier": ((1, 6, 8, 8), (12, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 6, False),
    "asymmetric_pads": ((1, 3, 10, 9), (4, 3, 3, 3), [2, 2], [0, 1, 2, 0], [1, 1], 1, True),
    "1d": ((1, 3, 10), (5, 3, 3), [2], [1, 1], [2], 1, True),
    "3d": ((1, 4, 5, 6, 7), (6, 2, 2, 3, 2), [1, 2, 1], [0, 1, 0, 1, 0, 1], [1, 1, 2], 2, True),
}

MATMULS = {  # A shape, B shape, B constant
    "2d": ((5, 7), (7, 3), True),
    "2d_runtime_b": ((5, 7), (7, 3), False),
    "batched": ((4, 5, 7), (4, 7, 3), False),
    "batched_const_b": ((2, 3, 5, 7), (2, 3, 7, 6), True),
    "broadcast_b": ((2, 3, 5, 7), (7, 6), True),
    "broadcast_both": ((2, 1, 5, 7), (3, 7, 6), False),
    "vector_a": ((7,), (2, 7, 3), False),
    "vector_b": ((3, 5, 7), (7,), True),
}


def _tensor(name, shape, value=None):
    return Tensor(name, tuple(shape), "float32", value)


def _conv_case(case):
    xs, ws, strides, pads, dilations, group, bias = CONVS[case]
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws, ws[:1]))
    want = conv_reference(x, w, b if bias else None, strides, pads, dilations, group)
    tensors = {"x": _tensor("x", xs), "w": _tensor("w", ws, w), "b": _tensor("b", ws[:1], b),
               "y": _tensor("y", want.shape)}
    op = BasicOp("conv", "conv", ["x", "w"] + (["b"] if bias else []), ["y"],
                 {"strides": tuple(strides), "pads": tuple(pads), "dilations": tuple(dilations), "group": group}, "test")
    return op, tensors, {"x": x, "w": w, "b": b}, want


def _run_dnnl(op, tensors, values, constants, **kw):
    made = onednn.prepare(op, tensors, {n: values[n].reshape(-1) for n in constants}, **kw)
    assert not isinstance(made, str), made
    y = np.full(tensors[op.outputs[0]].shape, np.nan, np.float32)
    made.call(*[0 if t is None else values[t].ctypes.data for t in made.operands], y.ctypes.data)
    return y


def _close(got, want):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


POINTWISE = ("pointwise", "pointwise_batched_no_bias")  # the cases a conv's matmul layout takes


@needs_onednn
@pytest.mark.parametrize("case,blocked", [(c, b) for c in CONVS for b in (False, True)]
                         + [(c, onednn.MATMUL) for c in POINTWISE])
@pytest.mark.parametrize("threads", [0, 1])
def test_conv_on_onednn(case, blocked, threads):
    op, tensors, values, want = _conv_case(case)
    _close(_run_dnnl(op, tensors, values, ["w"], choice=(blocked, threads)), want)


def test_only_a_plain_1x1_conv_runs_as_a_matmul():
    """Stride 1, no padding, one group, every kernel extent 1 (1-d and 2-d alike); a pointwise
    conv offers the matmul among its layouts, and oneDNN runs it on a real kernel, not ref."""
    assert {c for c in CONVS if onednn.pointwise(*_conv_case(c)[:2])} == set(POINTWISE)
    op, tensors, _, _ = _conv_case("pointwise")
    for change in ({"strides": (2, 1)}, {"pads": (0, 1, 0, 0)}, {"group": 2}):
        assert not onednn.pointwise(BasicOp("c", "conv", op.inputs, op.outputs, op.attrs | change, "t"), tensors)
    if onednn.library() is not None:
        made = onednn.prepare(op, tensors, {"w": tensors["w"].value.reshape(-1)}, choice=(onednn.MATMUL, 0))
        assert not isinstance(made, str) and not made.impl.startswith("ref"), made
        assert made.choice == (onednn.MATMUL, 0) and made.operands[:2] == ["w", "x"]


@needs_onednn
def test_a_small_conv_is_timed_on_one_thread_and_the_pool_is_left_as_it_was():
    """Below TIME_ONE_THREAD_BELOW multiply-adds both thread counts are made and timed; a run
    of a one-thread primitive restores the pool's size for the kernels after it."""
    op, tensors, values, want = _conv_case("grouped_strided_dilated")
    assert onednn._macs(op, tensors) < onednn.TIME_ONE_THREAD_BELOW
    lib = onednn.library()
    pool = lib.gir_dnnl_pool()
    made = onednn.prepare(op, tensors, {"w": values["w"].reshape(-1)})
    assert made.choice in {(b, n) for b in (False, True) for n in ((0, 1) if pool > 1 else (0,))}
    _close(_run_dnnl(op, tensors, values, ["w"], choice=(True, 1)), want)
    assert lib.gir_dnnl_pool() == pool


@needs_onednn
def test_a_choice_that_forks_the_pool_is_timed_with_the_pool_asleep(monkeypatch):
    """A small op that follows one-thread work finds the pool asleep: its pool choice is timed
    after letting the pool sleep before each run; its one-thread choice, and any choice of an
    op that follows a forking kernel, back to back."""
    op, tensors, values, _ = _conv_case("grouped_strided_dilated")
    made = {n: onednn.prepare(op, tensors, {"w": values["w"].reshape(-1)}, choice=(False, n)) for n in (0, 1)}
    real = onednn.library()

    class TwoThreads:  # the pool of a machine with two cores or more, whatever this one has
        def __getattr__(self, name):
            return getattr(real, name)

        def gir_dnnl_pool(self):
            return 2
    monkeypatch.setattr(onednn, "library", lambda: TwoThreads())
    sleeps = []
    monkeypatch.setattr(onednn, "_let_pool_sleep", lambda: sleeps.append(1))
    onednn.timed(made[1], op, tensors, repeat=2, asleep=True)
    onednn.timed(made[0], op, tensors, repeat=2, asleep=False)
    assert sleeps == []
    onednn.timed(made[0], op, tensors, repeat=2, asleep=True)
    assert len(sleeps) == 3  # before the warm-up and before each timed run


@needs_onednn
@pytest.mark.parametrize("side,asleep", [(16, True), (256, False)])
def test_a_library_op_after_a_kernel_knows_whether_the_kernel_forked(monkeypatch, side, asleep):
    """A conv after a channel softmax kernel: over 16x16 the kernel moves 16 KB and runs on one
    thread, so the conv finds the pool asleep; over 256x256 it moves 4 MB, forks, and leaves
    the pool awake. The first call of a run follows the caller's own work: asleep."""
    seen = {}
    real = onednn.prepare

    def recording(op, tensors, constants, choice=None, pool_asleep=False):
        seen[op.name] = pool_asleep
        return real(op, tensors, constants, choice, pool_asleep)
    monkeypatch.setattr(onednn, "prepare", recording)
    shape = (1, 8, side, side)
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1], name="first"),
             helper.make_node("Softmax", ["c1"], ["s"], axis=1, name="between"),  # a kernel, no epilogue
             helper.make_node("Conv", ["s", "w"], ["c2"], pads=[1, 1, 1, 1], name="second")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("c2", TensorProto.FLOAT, shape)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    session = gir.Session(model, target="cpu", plan_cache=None)
    assert [getattr(st, "kind", "kernel") for st in session.plan.steps] == ["conv", "kernel", "conv"]
    assert seen == {"first": True, "second": asleep}, seen


@needs_onednn
def test_a_large_conv_gets_the_faster_layout():
    CONVS["large"] = ((1, 32, 64, 64), (32, 32, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1, True)
    try:
        op, tensors, values, want = _conv_case("large")
    finally:
        del CONVS["large"]
    assert onednn._macs(op, tensors) > onednn.TIME_ONE_THREAD_BELOW
    made = onednn.prepare(op, tensors, {"w": values["w"].reshape(-1)})
    assert made.choice in ((False, 0), (True, 0))  # both layouts timed, too large for one thread
    _close(_run_dnnl(op, tensors, values, ["w"], choice=made.choice), want)


@needs_onednn
def test_conv_with_computed_weights_on_onednn():
    op, tensors, values, want = _conv_case("grouped_strided_dilated")
    tensors["w"] = _tensor("w", tensors["w"].shape)  # not a constant: read in place at each run
    _close(_run_dnnl(op, tensors, values, []), want)


@pytest.mark.parametrize("case", CONVS)
def test_conv_on_numpy(case):
    op, tensors, values, want = _conv_case(case)
    _close(run_library_op(op, tensors, [values[n] for n in op.inputs]), want)


def _matmul_case(case):
    a_shape, b_shape, const = MATMULS[case]
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    want = np.matmul(a, b)
    tensors = {"a": _tensor("a", a_shape), "b": _tensor("b", b_shape, b if const else None),
               "c": _tensor("c", want.shape)}
    return BasicOp("mm", "matmul", ["a", "b"], ["c"], {}, "test"), tensors, {"a": a, "b": b}, want, const


@needs_onednn
@pytest.mark.parametrize("case", MATMULS)
def test_matmul_on_onednn(case):
    op, tensors, values, want, const = _matmul_case(case)
    _close(_run_dnnl(op, tensors, values, ["b"] if const else []), want)


@pytest.mark.parametrize("case", MATMULS)
def test_matmul_on_numpy(case):
    op, tensors, values, want, _ = _matmul_case(case)
    _close(run_library_op(op, tensors, [values[n] for n in op.inputs]), want)


def test_onednn_declines_what_it_does_not_run():
    t = {"a": Tensor("a", (4, 8), "float16"), "b": Tensor("b", (8, 4), "float16"), "c": Tensor("c", (4, 4), "float16")}
    why = onednn.prepare(BasicOp("mm", "matmul", ["a", "b"], ["c"], {}, "test"), t, {})
    assert isinstance(why, str)


# Whole models: big enough that the CPU partition sends the conv/matmul to the library.

def _model(nodes, inputs, inits, out_shape):
    graph = helper.make_graph(nodes, "lib", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _models():
    rng = np.random.default_rng(2)

    def r(*s):
        return rng.standard_normal(s).astype(np.float32) * 0.1

    yield "conv_relu_add", _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Conv", ["r", "dw", "db"], ["d"], pads=[1, 1, 1, 1], group=32, strides=[2, 2]),
         helper.make_node("Conv", ["d", "pw"], ["p"]),
         helper.make_node("Add", ["p", "p"], ["y"])],
        [("x", [1, 16, 24, 24])],
        {"w": r(32, 16, 3, 3), "b": r(32), "dw": r(32, 1, 3, 3), "db": r(32), "pw": r(48, 32, 1, 1)}, [1, 48, 12, 12])
    yield "gemm_variants", _model(
        [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, alpha=0.5, beta=2.0),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Gemm", ["r", "w2"], ["g"], transA=1),
         helper.make_node("MatMul", ["g", "w3"], ["y"])],
        [("x", [64, 96])], {"w1": r(128, 96), "b1": r(128), "w2": r(64, 80), "w3": r(80, 72)}, [128, 72])
    yield "batched_matmul", _model(
        [helper.make_node("MatMul", ["x", "x2"], ["m"]),
         helper.make_node("MatMul", ["m", "w"], ["y"])],
        [("x", [2, 3, 48, 64]), ("x2", [3, 64, 48])], {"w": r(48, 80)}, [2, 3, 48, 80])


@pytest.mark.parametrize("library", [None, "numpy"])
@pytest.mark.parametrize("name,model", list(_models()), ids=[n for n, _ in _models()])
def test_session_matches_onnxruntime(name, model, library):
    rng = np.random.default_rng(3)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    session = gir.Session(model, target="cpu", library=library)
    ops = session.engine.library_ops
    assert ops, f"{name}: no library op in the plan"
    if library == "numpy" or onednn.library() is None:
        assert session.library_path == "numpy" and all(v.startswith("numpy") for v in ops.values())
    else:
        assert session.library_path.startswith("onednn") and all(v.startswith("onednn") for v in ops.values()), ops
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = session.run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_session_reports_its_path(monkeypatch):
    _, model = next(_models())
    assert gir.Session(model, target="cpu", library="numpy").library_path == "numpy"
    monkeypatch.setenv(onednn.ENV, "numpy")
    session = gir.Session(model, target="cpu")
    assert session.library_path == "numpy" and onednn.ENV in session.engine.library_note
    monkeypatch.delenv(onednn.ENV)
    monkeypatch.setattr(onednn, "_load", lambda: None)  # the wheel missing: numpy runs every library op
    assert gir.Session(model, target="cpu").library_path == "numpy"
    with pytest.raises(gir.runtime.session.SessionError, match="unknown library"):
        gir.Session(model, target="cpu", library="mkl")


@needs_onednn
def test_session_on_onednn_says_so():
    _, model = next(_models())
    session = gir.Session(model, target="cpu")
    assert session.library_path == f"onednn {onednn.version()}"


def test_gir_run_prints_the_path(tmp_path, capsys):
    from gir.cli import main
    _, model = next(_models())
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert main(["run", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"library ops: {gir.Session(model, target='cpu').library_path}" in err


@needs_onednn
def test_a_session_read_back_keeps_its_conv_layouts(tmp_path, monkeypatch):
    from gir.cache import Store, gir_version
    from gir.ir import get_target
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    _, model = next(_models())

    def store():
        return Store("plan", gir_version(), repr(get_target("cpu")), 2)
    first = gir.Session(model, target="cpu", plan_cache=store())
    again = gir.Session(model, target="cpu", plan_cache=store())
    assert again.cached and first.engine.layouts and again.engine.layouts == first.engine.layouts


@pytest.mark.parametrize("given, want", [({}, "window"), ({"OMP_WAIT_POLICY": "PASSIVE"}, None),
                                         ({"GOMP_SPINCOUNT": "5"}, "5")])
def test_openmp_threads_spin_briefly_unless_the_caller_chose(given, want):
    """Loading the CPU backend sets GOMP_SPINCOUNT, before libgomp reads it and before the
    engine loads oneDNN or a kernel library, to a spin of SPIN_WINDOW_S on this CPU, only where
    the caller set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT (gir/backends/cpu/spin.py)."""
    import os
    import subprocess
    import sys
    from gir.backends.cpu import spin
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | given
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import os, gir.backends.cpu.compiler; print(os.environ.get('GOMP_SPINCOUNT')); "
            "print('libgomp' in open('/proc/self/maps').read())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    count, gomp_loaded = out.split()
    assert gomp_loaded == "False"
    if want == "window":
        pause = spin.pause_seconds()
        assert pause and 0.5 < int(count) * pause / spin.SPIN_WINDOW_S < 2  # the window within timing noise
    else:
        assert count == str(want)


def test_the_spin_count_follows_the_window_and_falls_back_without_a_timer(monkeypatch):
    from gir.backends.cpu import spin
    monkeypatch.setattr(spin, "pause_seconds", lambda: 10e-9)
    assert spin.spin_count(20e-6) == 2000 and spin.spin_count(40e-6) == 4000
    monkeypatch.setattr(spin, "pause_seconds", lambda: None)
    assert spin.spin_count() == spin.FALLBACK_SPINS


def _conv_chain(tail_readers: str):
    """conv -> ReLU -> conv -> ReLU over 32 channels at 24x24; `tail_readers`: what else reads the
    first ReLU's output: "" nothing, "output" it is also a graph output, "add" the second conv's
    result adds it (a second reader)."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array((rng.standard_normal((32, c, 3, 3)) * 0.1).astype(np.float32), f"w{i}")
             for i, c in ((1, 16), (2, 32))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["y"])]
    shape = [1, 32, 24, 24]
    outputs = [helper.make_tensor_value_info("z" if tail_readers == "add" else "y", TensorProto.FLOAT, shape)]
    if tail_readers == "output":
        outputs.append(helper.make_tensor_value_info("r1", TensorProto.FLOAT, shape))
    if tail_readers == "add":
        nodes.append(helper.make_node("Add", ["y", "r1"], ["z"]))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 24, 24])],
                          outputs, inits)
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


@needs_onednn
@pytest.mark.parametrize("tail_readers", ["", "output", "add"])
def test_a_blocked_conv_hands_its_output_to_the_next_in_its_own_layout(monkeypatch, tail_readers):
    """Two blocked convs in a row: the first leaves its output in the blocked layout and the
    second reads it there (no reorder to NCHW and back), only where nothing else reads it.
    The timing of choices is made to prefer the blocked, fused ones, so the test does not
    depend on which the machine finds faster."""
    monkeypatch.setattr(onednn, "timed", lambda made, op, tensors, repeat=2, asleep=False: 0.0 if made.blocked and not made.separate else 1.0)
    model = _conv_chain(tail_readers)
    x = np.random.default_rng(10).standard_normal((1, 16, 24, 24)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    s = gir.Session(model, target="cpu", plan_cache=None)
    assert all("(blocked)" in v for v in s.engine.library_ops.values()), s.engine.library_ops
    for _ in range(2):  # the hand-off buffer is reused across runs
        got = s.run([o.name for o in model.graph.output], {"x": x})
        for g_, w in zip(got, want):
            np.testing.assert_allclose(g_, w, rtol=1e-4, atol=1e-5)
    names = [(a, b) for a, b, _ in s.engine.handoffs]
    assert names == ([] if tail_readers else [("Conv_0", "Conv_2")]), s.engine.handoffs
