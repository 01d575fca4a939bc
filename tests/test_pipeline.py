"""Whole models through the graph level: partition, movement composition, view folding,
grouping, merging, rewriting, structural reuse; every kernel run in the reference interpreter
and the model's outputs compared with onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from gir.frontend import load
from gir.fusion.partition import partition
from gir.fusion.plan import plan
from gir.ir import get_target
from gir.runtime import execute


def ort_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_tiny_model_through_the_plan_matches_onnxruntime(name):
    model = models.load_bundled(name)
    feeds = models.example_inputs(model, 0)
    graph = load(model)
    result = plan(graph, get_target("h100"), limit=2)
    got = execute(result, feeds, check_races=True)
    for out, want in zip(graph.outputs, ort_outputs(model, feeds)):
        np.testing.assert_allclose(got[out], want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    for sub in result.subgraphs:
        assert sub.gir_bytes > 0 and sub.bound_bytes > 0


@pytest.mark.parametrize("name", ["bert", "shufflenet_v2"])
def test_tiny_model_plan_on_amd_and_cpu_targets(name):
    model = models.load_bundled(name)
    feeds = models.example_inputs(model, 0)
    graph = load(model)
    want = ort_outputs(model, feeds)
    for target in ("mi250x", "cpu"):
        got = execute(plan(graph, get_target(target), limit=1), feeds)
        for out, w in zip(graph.outputs, want):
            np.testing.assert_allclose(got[out], w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())))


def test_repeated_layers_are_planned_once():
    graph = load(models.load_bundled("bert"))
    result = plan(graph, get_target("h100"), limit=1)
    assert sum(k.reused for k in result.kernels) >= 5


def _matmul_model(k: int):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [256, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])
    w = numpy_helper.from_array(np.ones((k, 256), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "mm", [a], [y], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_partition_follows_the_targets_ridge_point():
    """A matmul with inner dimension 16 has about 7 FLOP per byte: below the H100's fp32 ridge
    (about 20), above the local CPU's (about 4.8): GIR on one, the library on the other."""
    graph = load(_matmul_model(16))
    h100, cpu = get_target("h100"), get_target("cpu")
    assert cpu.ridge_point() < 7 < h100.ridge_point()
    on_gpu, on_cpu = partition(graph, h100), partition(graph, cpu)
    assert not on_gpu.library and on_gpu.decisions[0].reason.startswith("7.1 FLOP/B < float32 ridge")
    assert [op.name for op in on_cpu.library] == [graph.ops[0].name]
    x = np.random.default_rng(0).standard_normal((256, 16)).astype(np.float32)
    for target in (h100, cpu):
        got = execute(plan(graph, target, limit=1), {"a": x})["y"]
        np.testing.assert_allclose(got, x @ np.ones((16, 256), np.float32), rtol=1e-5)
