"""Found by the fuzzer (scripts/fuzz.py, seed 1 case 257): on the cpu target a Gather's source
needs block scope, which the cpu carries only in DRAM; sync insertion "lifted" the DRAM buffer
into a new DRAM buffer, again and again, until the driver's 10,000-step cap (about 60 s of
planning for a [33, 3, 1] input). Now nothing is lifted when no faster level carries the scope."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import gir.fusion.plan as plan_module
from gir.runtime import Session


def test_gather_of_a_reduce_on_cpu_rewrites_to_a_fixed_point_quickly(tmp_path, monkeypatch):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [33, 3, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    nodes = [helper.make_node("ReduceL2", ["x", "axes"], ["r"], keepdims=0),
             helper.make_node("Gather", ["r", "idx"], ["y"], axis=0)]
    inits = [numpy_helper.from_array(np.array([0, 2], np.int64), "axes"),
             numpy_helper.from_array(np.array([-3, -1, 0], np.int64), "idx")]
    path = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                                opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    steps = []
    optimize = plan_module.optimize

    def counting(graph, *args, **kwargs):
        out, log = optimize(graph, *args, **kwargs)
        steps.append(len(log))
        return out, log
    monkeypatch.setattr(plan_module, "optimize", counting)
    session = Session(str(path), target="cpu", engine="interpreter", limit=1)
    assert steps and max(steps) < 100, steps  # was 10,000 (the cap)
    v = np.random.default_rng(0).uniform(-1, 1, (33, 3, 1)).astype(np.float32)
    (got,) = session.run(None, {"x": v})
    np.testing.assert_allclose(got, np.sqrt((v.astype(np.float64) ** 2).sum(axis=(0, 2)))[[-3, -1, 0]], rtol=1e-5)
