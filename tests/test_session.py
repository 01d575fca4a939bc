"""gir.Session, onnxruntime-style: every zoo model (tiny) on the CPU target through the native
engine (emitted C + OpenMP) with intermediates in a shared arena; the interpreter engine agrees;
feeds validated with clear errors; the GPU engine's logic on the CPU harness, and on a real GPU
where there is one."""
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
import models
from gir.backends.cuda.emitter import CudaEmitter
from gir.backends.errors import NoDeviceError
from gir.backends.harness.recording import RecordingLauncher
from gir.frontend.basic import BasicOp
from gir.backends import device_engine as device
from gir.runtime import SessionError


def ort_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_matches(got, want, rel=1e-4):
    """Relative to the largest reference magnitude, elementwise."""
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rel, atol=rel * max(1.0, float(np.abs(w).max())) / 10)


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_native_session_matches_onnxruntime(name):
    model = models.load_bundled(name)
    feeds = models.example_inputs(model, 0)
    session = gir.Session(str(models.bundled_path(name)), target="cpu", limit=1)
    assert_matches(session.run(None, feeds), ort_outputs(model, feeds))
    assert session.memory.peak_bytes <= session.memory.unshared_bytes
    assert [a.name for a in session.get_inputs()] == [i.name for i in model.graph.input
                                                       if i.name not in {t.name for t in model.graph.initializer}]


def test_native_and_interpreter_engines_agree():
    """gpt2 has what the native engine must get right: kernels writing disjoint parts of one
    tensor and an output that is a view of an intermediate."""
    model = models.load_bundled("gpt2")
    feeds = models.example_inputs(model, 0)
    native = gir.Session(model, target="cpu", limit=1)
    interpreter = gir.Session(model, target="cpu", engine="interpreter", limit=1)
    assert any(o in native.plan.aliases for o in native.graph.outputs)
    for a, b in zip(native.run(None, feeds), interpreter.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(b).max())))


def test_reused_memory_gives_right_numbers_and_outputs_outlive_the_next_run():
    model = models.load_bundled("bert")
    session = gir.Session(model, target="cpu", limit=1)
    assert session.memory.peak_bytes < session.memory.unshared_bytes  # intermediates share memory
    first, second = models.example_inputs(model, 0), models.example_inputs(model, 1)
    kept = session.run(None, first)
    session.run(None, second)
    assert_matches(kept, ort_outputs(model, first))


def test_feeds_are_validated_by_name_shape_and_dtype():
    session = gir.Session(models.load_bundled("shufflenet_v2"), target="cpu", limit=1)
    (arg,) = session.get_inputs()
    good = np.zeros(arg.shape, np.float32)
    with pytest.raises(SessionError, match=r"no input named 'x'; inputs are input"):
        session.run(None, {"x": good})
    with pytest.raises(SessionError, match=r"input 'input' has shape \[1\], expected"):
        session.run(None, {"input": np.zeros(1, np.float32)})
    with pytest.raises(SessionError, match=r"has dtype float64, expected float32"):
        session.run(None, {"input": good.astype(np.float64)})
    with pytest.raises(SessionError, match=r"no output named 'nope'"):
        session.run(["nope"], {"input": good})
    with pytest.raises(SessionError, match=r"missing input 'input'"):
        session.run(None, {})
    with pytest.raises(SessionError, match=r"shufflenet_v2_tiny: unknown engine 'jit'"):
        gir.Session(models.load_bundled("shufflenet_v2"), engine="jit")


def _mlp_model():
    """Two matmuls heavy enough for the library on an H100 (FLOP/B above its ridge), fused
    memory-intensive ops between them, and an output that is a view of an intermediate."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32) / 16, "w1"),
             numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32) / 16, "w2"),
             numpy_helper.from_array(rng.standard_normal(512).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([128, 8, 64], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Softmax", ["a"], ["s"], axis=-1), helper.make_node("MatMul", ["s", "w2"], ["h2"]),
             helper.make_node("Add", ["h2", "b"], ["a2"]), helper.make_node("Tanh", ["a2"], ["y"]),
             helper.make_node("Reshape", ["a", "shape"], ["z"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 512]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [128, 8, 64])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


class HarnessLauncher(RecordingLauncher):
    """The recording stand-in of a GPU (device memory in host arrays, kernels on the CPU
    harness, GEMMs in numpy with cuBLAS's conventions); `launches` counts kernel launches."""

    @property
    def launches(self) -> int:
        return self.counts()["launch"]


def test_gpu_engine_on_the_cpu_harness(monkeypatch):
    """The CUDA engine's arena, launches and host library calls, with the CUDA source each
    kernel gets run on the CPU harness instead of NVRTC and a GPU."""
    launcher = HarnessLauncher()
    monkeypatch.setattr(device, "open_launcher", lambda backend: launcher)
    monkeypatch.setattr(device, "_toolchain", lambda backend: (
        CudaEmitter, lambda source, arch: SimpleNamespace(source=source, resources={}), None))
    model = _mlp_model()
    session = gir.Session(model, target="h100", limit=1)
    assert any(isinstance(step, BasicOp) and step.kind == "matmul" for step in session.plan.steps)
    x = np.random.default_rng(1).standard_normal((128, 512)).astype(np.float32)
    assert_matches(session.run(None, {"x": x}), ort_outputs(model, {"x": x}))
    assert launcher.launches > 0 and launcher.counts()["gemm"] > 0
    mark = launcher.mark()
    session.run(None, {"x": x})
    assert launcher.counts(mark)["alloc"] == 0  # everything a run touches was placed at creation


def _computed_gather():
    """Rows of a [5, 4] table gathered by ids + 1: indices computed on the device, which only the
    kernel's flag can check (graph-input indices are checked on the host before a run)."""
    table = numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(5, 4), "table")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [helper.make_node("Add", ["ids", "one"], ["shifted"], name="shift"),
             helper.make_node("Gather", ["table", "shifted"], ["y"], name="lookup", axis=0)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], [table, one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_gpu_engine_reports_a_computed_out_of_range_index(monkeypatch):
    """The CUDA kernel clamps the index and sets its flag parameter; the engine reads the flags
    after the run and raises naming the node, then runs again cleanly."""
    from gir.runtime.indices import GatherIndexError
    launcher = HarnessLauncher()
    monkeypatch.setattr(device, "open_launcher", lambda backend: launcher)
    sources = []
    monkeypatch.setattr(device, "_toolchain", lambda backend: (
        CudaEmitter, lambda source, arch: sources.append(source) or SimpleNamespace(source=source, resources={}), None))
    session = gir.Session(_computed_gather(), target="h100", limit=1)
    assert "int* gir_oob" in sources[0] and "*gir_oob = 1;" in sources[0]
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    ok = np.array([[0, 1, 2], [-2, -6, 3]], np.int64)
    (y,) = session.run(None, {"ids": ok})
    np.testing.assert_array_equal(y, table[ok + 1])
    for bad in (4, -7, 10**6):
        ids = ok.copy()
        ids[1, 2] = bad
        with pytest.raises(GatherIndexError, match="m: .*node 'lookup' \\(Gather"):
            session.run(None, {"ids": ids})
        (y,) = session.run(None, {"ids": ok})  # the flag was cleared
        np.testing.assert_array_equal(y, table[ok + 1])


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["h100", "mi250x"])
def test_gpu_session_matches_onnxruntime(target):
    model = models.load_bundled("bert")
    try:
        session = gir.Session(model, target=target, limit=1)
    except NoDeviceError as e:
        assert len(str(e).splitlines()) == 1
        pytest.skip(str(e))
    feeds = models.example_inputs(model, 0)
    assert_matches(session.run(None, feeds), ort_outputs(model, feeds))
