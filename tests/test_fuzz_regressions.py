"""Wrong answers the fuzzer (scripts/fuzz.py) found, each as the smallest model that showed it,
compared with onnxruntime on both CPU engines."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gir.runtime import Session

ort = pytest.importorskip("onnxruntime")
vi = helper.make_tensor_value_info


def model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def matches_onnxruntime(m, engine, rtol=1e-5, atol=1e-6):
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.uniform(-2, 2, [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in m.graph.input}
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = Session(m, target="cpu", engine=engine).run(None, feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("engine", ["native", "interpreter"])
@pytest.mark.parametrize("repeats", [[2, 3], [2, 1], [1, 3]])
def test_tensor_written_by_several_copies_is_read_after_all_of_them(engine, repeats):
    """valid-3-373: a Concat's parts are written by separate copy kernels; the Tile reading the
    concat, and the copy reading Neg's result, ran before those writers (the step order kept
    one writer per tensor), so the output held zeros where Neg's rows belonged."""
    c = numpy_helper.from_array(np.ones((13, 33), np.float32), "c")
    rep = numpy_helper.from_array(np.array(repeats, np.int64), "rep")
    m = model([helper.make_node("Neg", ["a"], ["n"]), helper.make_node("Concat", ["n", "c"], ["x"], axis=0),
               helper.make_node("Tile", ["x", "rep"], ["y"]), helper.make_node("Log", ["y"], ["z"])],
              [vi("a", TensorProto.FLOAT, [33, 33])],
              [vi("y", TensorProto.FLOAT, None), vi("z", TensorProto.FLOAT, None)], [c, rep])
    matches_onnxruntime(onnx.shape_inference.infer_shapes(m), engine)


def _layer_norm(shape, axis):
    scale = numpy_helper.from_array(np.full(shape[axis:], 1.5, np.float32), "s")
    bias = numpy_helper.from_array(np.full(shape[axis:], 0.25, np.float32), "b")
    return model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=axis)],
                 [vi("x", TensorProto.FLOAT, shape)], [vi("y", TensorProto.FLOAT, shape)], [scale, bias])


@pytest.mark.parametrize("engine", ["native", "interpreter"])
@pytest.mark.parametrize("shape,axis", [([1001], 0), ([512, 33], 0), ([4, 1000], 1)])
def test_long_reductions_are_accurate(engine, shape, axis):
    """valid-2-131: LayerNormalization over 1,001 elements was 3.2e-4 off onnxruntime on the
    native engine, which summed each row in one serial fp32 chain (now 16 partials, a tree)."""
    matches_onnxruntime(_layer_norm(shape, axis), engine, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("engine", ["native", "interpreter"])
def test_long_sum_matches_float64(engine):
    """A serial fp32 sum of 200,000 x 0.1 is 2e-4 relative off; several partials are not."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    m = model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
              [vi("x", TensorProto.FLOAT, [200000])], [vi("y", TensorProto.FLOAT, [])], [axes])
    x = np.full(200000, 0.1, np.float32)
    (y,) = Session(m, target="cpu", engine=engine).run(None, {"x": x})
    np.testing.assert_allclose(y, x.astype(np.float64).sum(), rtol=2e-5)


@pytest.mark.parametrize("engine", ["native", "interpreter"])
def test_tensor_read_by_a_copy_through_an_alias_is_written(engine):
    """valid-4-288: GatherND with constant indices became a copy reading the Abs result through
    a view (an alias); the fused kernel computing Abs did not count that copy as a reader, never
    wrote the result, and the native engine failed with KeyError: 'abs2' (exit 4)."""
    shape = numpy_helper.from_array(np.array([1, 4257], np.int64), "shape")
    idx = numpy_helper.from_array(np.zeros((3, 1), np.int64), "idx")
    m = model([helper.make_node("Abs", ["a"], ["abs2"]), helper.make_node("Reshape", ["abs2", "shape"], ["r"]),
               helper.make_node("Add", ["b", "abs2"], ["add"]), helper.make_node("GatherND", ["r", "idx"], ["g"])],
              [vi("a", TensorProto.FLOAT, [129, 33]), vi("b", TensorProto.FLOAT, [1, 33])],
              [vi("g", TensorProto.FLOAT, None), vi("add", TensorProto.FLOAT, None)], [shape, idx])
    matches_onnxruntime(onnx.shape_inference.infer_shapes(m), engine)


@pytest.mark.parametrize("engine", ["native", "interpreter"])
def test_a_pad_read_through_an_identity_by_a_gather_is_written(engine):
    """valid-14-106 (--gpu-targets run, every target alike): Pad -> Identity -> Gather, and an
    elementwise op reading the Identity. The elementwise op folds the pad into its reads, so the
    Pad was dropped as folded away; the Gather reads the pad's storage through the Identity,
    which the check did not follow, and read a tensor no step wrote (KeyError 'pad7')."""
    pads = numpy_helper.from_array(np.array([3, 0], np.int64), "pads")
    value = numpy_helper.from_array(np.array(0.25, np.float32), "value")
    idx = numpy_helper.from_array(np.array([[26, 13], [29, -30]], np.int64), "idx")
    m = model([helper.make_node("Pad", ["x", "pads", "value"], ["p"], mode="constant"),
               helper.make_node("Identity", ["p"], ["v"]),
               helper.make_node("Gather", ["v", "idx"], ["g"], axis=0),
               helper.make_node("GreaterOrEqual", ["v", "y"], ["ge"]),
               helper.make_node("Where", ["ge", "v", "value"], ["w"])],
              [vi("x", TensorProto.FLOAT, [33]), vi("y", TensorProto.FLOAT, [36])],
              [vi("g", TensorProto.FLOAT, [2, 2]), vi("w", TensorProto.FLOAT, [36])], [pads, value, idx])
    matches_onnxruntime(m, engine)
