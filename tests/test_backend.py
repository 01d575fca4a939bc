"""gir.backend, onnx's backend interface over the whole pipeline (CPU target, native engine):
run_node, and prepare once for many runs. onnx's own runner drives the module through every
node test in tests/test_onnx_backend_pipeline.py."""
import numpy as np
from onnx import helper

import gir.backend
from gir.backend import make_backend, session_compiler


def test_run_node_infers_the_output_type():
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    (y,) = gir.backend.run_node(helper.make_node("Softmax", ["x"], ["y"], axis=0), [x])
    e = np.exp(x - x.max(axis=0))
    np.testing.assert_allclose(y, e / e.sum(axis=0), rtol=1e-5)


def test_run_node_binds_shape_inputs_as_constants():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    (y,) = gir.backend.run_node(node, [x, np.array([2, 6], np.int64)], outputs_info=[(np.float32, (2, 6))])
    np.testing.assert_array_equal(y, x.reshape(2, 6))


def test_prepare_compiles_once_for_every_run():
    compiled = []
    Counting = make_backend(lambda graph: compiled.append(graph.model_name) or session_compiler()(graph))
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "relu", [helper.make_tensor_value_info("x", 1, [4, 8])],
                              [helper.make_tensor_value_info("y", 1, [4, 8])])
    rep = Counting.prepare(helper.make_model(graph, ir_version=10))
    rng = np.random.default_rng(1)
    for _ in range(2):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, 0))
    assert compiled == ["relu"]
    assert gir.backend.supports_device("CPU") and not gir.backend.supports_device("CUDA")

