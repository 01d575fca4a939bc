"""The plan's graph keeps only the constants something reads: folding a weight's layouts into
the kernel that reads it must not leave the weight's other forms behind (GPT-2 decode held each
weight three times, 1.64 GB for 0.65 GB)."""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import gir
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir.target import get_target


def _gemv_model(k=256, n=512):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(np.ascontiguousarray(w.T), "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), w.nbytes + b.nbytes


def test_a_folded_weight_is_kept_once_and_the_result_is_right():
    model, weight_bytes = _gemv_model()
    p = plan(load(model), get_target("cpu"))
    consts = sum(t.value.nbytes for t in p.graph.tensors.values() if t.value is not None)
    assert consts <= weight_bytes * 1.01, f"{consts} bytes of constants for {weight_bytes} bytes of weights"
    assert p.partition.graph is p.graph
    x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = gir.Session(model, target="cpu").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
