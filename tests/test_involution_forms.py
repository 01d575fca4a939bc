"""Exporter forms plan as well as hand-built ones: RedNet as torch exports it (nn.Unfold ->
Pad + Gather with constant window indices + Transpose, models/exported/involution/)
against the zoo's hand-built Slice + Concat form of the same network (models/rednet50.py tiny)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
import models
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import get_target

EXPORTED = models.__path__[0] + "/exported/involution/rednet_"
FORMS = ("torchscript", "dynamo")


def test_constant_window_gather_is_a_strided_view():
    """Gather(x, [[0,1,2],[2,3,4]]) along axis 1: windows of a strided view, not an index gather;
    irregular indices stay a gather. Both match numpy."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 3])
    rng = np.random.default_rng(0)
    data = rng.standard_normal((2, 6, 3)).astype(np.float32)
    for ids, kind in [(np.array([[0, 1, 2], [2, 3, 4]]), "layout"), (np.array([[0, -1], [3, 1]]), "gather")]:
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, *ids.shape, 3])
        graph = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)], "g", [x], [y],
                                  [numpy_helper.from_array(ids.astype(np.int64), "i")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
        g = load(model)
        assert [op.kind for op in g.ops if op.outputs == ["y"]] == [kind]
        (got,) = gir.Session(g, target="cpu").run(None, {"x": data})
        np.testing.assert_array_equal(got, np.take(data, ids, axis=1))


@pytest.mark.parametrize("form", FORMS)
def test_exported_involution_matches_torch(form):
    ref = np.load(EXPORTED + form + ".npz")
    (got,) = gir.Session(EXPORTED + form + ".onnx", target="cpu").run(None, {"input": ref["input"]})
    err = np.abs(got - ref["logits"]).max() / np.abs(ref["logits"]).max()
    assert err < 1e-4, err


def dram_bytes(graph) -> int:
    return sum(s.gir_bytes for s in plan(graph, get_target("cuda:sm_90"), limit=2).subgraphs)


@pytest.fixture(scope="module")
def hand_built_bytes():
    return dram_bytes(load(models.rednet50.build(tiny=True)))


@pytest.mark.parametrize("form", FORMS)
def test_exported_involution_dram_within_1_2x_of_hand_built(form, hand_built_bytes):
    exported = load(EXPORTED + form + ".onnx")
    assert "gather" not in {op.kind for op in exported.ops}  # every window gather became a view
    got = dram_bytes(exported)
    assert got <= 1.2 * hand_built_bytes, (got, hand_built_bytes)
