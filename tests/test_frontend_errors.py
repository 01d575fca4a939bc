"""The frontend's refusals: each is one line that names the file or model and the node or
tensor at fault."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from gir.frontend import FrontendError, UnsupportedOpError, load


def model_of(nodes, inputs, outputs, inits=(), opsets=(("", 17),), name="m"):
    graph = h.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    return h.make_model(graph, opset_imports=[h.make_opsetid(d, v) for d, v in opsets], ir_version=10)


def vi(name, elem=T.FLOAT, shape=(2, 3)):
    return h.make_tensor_value_info(name, elem, shape)


def relu_model():
    w = numpy_helper.from_array(np.arange(600, dtype=np.float32).reshape(200, 3), "w")
    return model_of([h.make_node("MatMul", ["w", "x"], ["y"])], [vi("x", shape=(3, 4))], [vi("y", shape=(200, 4))],
                    inits=[w])


def error_of(*args, exc=FrontendError, **kw) -> str:
    with pytest.raises(exc) as info:
        load(*args, **kw)
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


def test_missing_file(tmp_path):
    path = tmp_path / "nope.onnx"
    msg = error_of(str(path))
    assert msg == f"{path}: no such file"


def test_not_onnx_bytes(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_bytes(b"this is a text file, not a protobuf\n" * 4)
    msg = error_of(path)
    assert msg.startswith(f"{path}: not ")


def test_truncated_model(tmp_path):
    data = relu_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    msg = error_of(path)
    assert msg.startswith(f"{path}: ") and ("truncated" in msg or "invalid" in msg)


def test_directory_is_not_a_model(tmp_path):
    assert "directory" in error_of(tmp_path)


def test_checker_failure_names_file(tmp_path):
    bad = model_of([h.make_node("Relu", ["nowhere"], ["y"])], [vi("x")], [vi("y")])
    path = tmp_path / "bad.onnx"
    path.write_bytes(bad.SerializeToString())
    msg = error_of(path)
    assert msg.startswith(f"{path}: invalid ONNX model (onnx.checker): ") and "nowhere" in msg


def test_valid_file_loads(tmp_path):
    path = tmp_path / "ok.onnx"
    onnx.save(relu_model(), path)
    g = load(path)
    assert g.model_name == "ok" and [op.kind for op in g.ops] == ["matmul"]


def test_unsupported_nodes_listed_together():
    nodes = [
        h.make_node("TopK", ["x", "k"], ["v", "i"], name="topk_1"),
        h.make_node("Relu", ["x"], ["r"], name="fine"),
        h.make_node("FancyOp", ["r"], ["f"], name="custom", domain="com.example"),
        h.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], name="ln"),
    ]
    k = numpy_helper.from_array(np.array([1], np.int64), "k")
    s = numpy_helper.from_array(np.ones(3, np.float32), "s")
    model = model_of(nodes, [vi("x")], [vi("v"), vi("f"), vi("y")], inits=[k, s],
                     opsets=(("", 17), ("com.example", 2)), name="net")
    with pytest.raises(UnsupportedOpError) as info:
        load(model)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("model 'net': 3 unsupported nodes: ")
    assert "node 'topk_1' (TopK, ai.onnx opset 17)" in msg
    assert "node 'custom' (FancyOp, com.example opset 2)" in msg
    assert "node 'ln' (LayerNormalization, ai.onnx opset 17): only output 0 (Y) is supported" in msg
    assert "fine" not in msg
    assert [n[:4] for n in info.value.nodes] == [("topk_1", "TopK", "ai.onnx", 17), ("custom", "FancyOp", "com.example", 2),
                                                  ("ln", "LayerNormalization", "ai.onnx", 17)]


def test_unsupported_attribute_reasons():
    nodes = [h.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2], name="pool"),
             h.make_node("BatchNormalization", ["y", "s", "s", "s", "s"], ["z"], training_mode=1, name="bn"),
             h.make_node("Pad", ["z", "p"], ["w"], mode="wrap", name="wrap")]
    inits = [numpy_helper.from_array(np.ones(2, np.float32), "s"),
             numpy_helper.from_array(np.zeros(8, np.int64), "p")]
    model = model_of(nodes, [vi("x", shape=(1, 2, 4, 4))], [vi("w", shape=(1, 2, 3, 3)), vi("idx", T.INT64, (1, 2, 3, 3))],
                     inits=inits, opsets=(("", 19),))
    msg = error_of(model, exc=UnsupportedOpError)
    assert msg.startswith("model 'm': 3 unsupported nodes: ")
    assert "'pool' (MaxPool, ai.onnx opset 19): the Indices output is not supported" in msg
    assert "'bn' (BatchNormalization, ai.onnx opset 19): training_mode=1" in msg
    assert "'wrap' (Pad, ai.onnx opset 19): mode='wrap'" in msg


def test_symbolic_dim():
    model = model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", shape=("batch", 3))], [vi("y", shape=("batch", 3))])
    msg = error_of(model)
    assert "1 unbound symbolic dim (input 'x' axis 0 dim_param 'batch')" in msg
    assert "input_shapes={'x': (1, 3)}" in msg and "--shape x=1x3" in msg
    assert "input_shapes={'batch': 1}" in msg and "--shape batch=1" in msg
    assert load(model, input_shapes={"x": (4, 3)}).tensors["y"].shape == (4, 3)
    assert load(model, input_shapes={"batch": 5}).tensors["y"].shape == (5, 3)


def test_every_unbound_dim_on_one_line():
    """Each unbound dim is named (input, axis, dim_param), with both ways to bind them."""
    nodes = [h.make_node("Add", ["a", "b"], ["y"])]
    model = model_of(nodes, [vi("a", shape=("batch", "seq", 4)), vi("b", shape=("batch", "seq", 4))],
                     [vi("y", shape=("batch", "seq", 4))])
    msg = error_of(model)
    assert "\n" not in msg and msg.startswith("model 'm': 4 unbound symbolic dims (")
    for name in "ab":
        assert f"input '{name}' axis 0 dim_param 'batch'" in msg and f"input '{name}' axis 1 dim_param 'seq'" in msg
    assert "input_shapes={'a': (1, 1, 4), 'b': (1, 1, 4)}" in msg and "--shape a=1x1x4 --shape b=1x1x4" in msg
    assert "input_shapes={'batch': 1, 'seq': 1}" in msg and "--shape batch=1 --shape seq=1" in msg
    g = load(model, input_shapes={"batch": 2, "seq": (7,)})
    assert g.tensors["y"].shape == (2, 7, 4) and g.tensors["a"].shape == (2, 7, 4)
    # an input name and a dim name mixed: the input's own shape wins for that input
    g = load(model, input_shapes={"a": (2, 7, 4), "batch": 2, "seq": 7})
    assert g.tensors["b"].shape == (2, 7, 4)
    msg = error_of(model, input_shapes={"batch": 2})
    assert "2 unbound symbolic dims" in msg and "dim_param 'seq'" in msg and "batch" not in msg.split("(")[1]


def test_unknown_dim_and_rank():
    m1 = model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", shape=(None, 3))], [vi("y", shape=(None, 3))])
    msg = error_of(m1)
    assert "input 'x' axis 0 (no dim_param)" in msg and "input_shapes={'x': (1, 3)}" in msg
    assert "by dim name" not in msg  # a dim with no name cannot be bound by name
    m2 = model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", shape=None)], [vi("y", shape=None)])
    assert "invalid ONNX model" in error_of(m2)  # onnx.checker demands a shape field on graph inputs


def test_input_shapes_errors():
    model = model_of([h.make_node("Relu", ["x"], ["y"])], [vi("x", shape=("n", 3))], [vi("y", shape=("n", 3))])
    assert "'z' is neither a graph input nor a symbolic dim of one" in error_of(model, input_shapes={"z": (1,)})
    assert "has rank 3, the input has rank 2" in error_of(model, input_shapes={"x": (1, 2, 3)})
    assert "'n' is a symbolic dim, it binds to one size" in error_of(model, input_shapes={"n": (1, 2)})
    assert "binds to one size" in error_of(model, input_shapes={"n": -1})


def test_bad_input_dtype():
    model = model_of([h.make_node("Identity", ["x"], ["y"])], [vi("x", T.FLOAT8E4M3FN)], [vi("y", T.FLOAT8E4M3FN)])
    msg = error_of(model)
    assert "input 'x' has element type FLOAT8E4M3FN, which GIR does not support" in msg


def test_bad_intermediate_dtype_names_tensor():
    nodes = [h.make_node("Cast", ["x"], ["c"], to=T.INT16, name="to16"), h.make_node("Cast", ["c"], ["y"], to=T.FLOAT)]
    model = model_of(nodes, [vi("x")], [vi("y")])
    msg = error_of(model)
    assert "tensor 'c' (output of node 'to16') has element type INT16" in msg


def test_shape_input_must_be_constant():
    model = model_of([h.make_node("Reshape", ["x", "s"], ["y"], name="rs")], [vi("x"), vi("s", T.INT64, (2,))],
                     [vi("y", shape=("a", "b"))])
    msg = error_of(model)
    assert "node 'rs' (Reshape, ai.onnx opset 17): input 1 (shape, tensor 's') must be a constant" in msg


def test_shape_inference_failure_is_one_line():
    model = model_of([h.make_node("Add", ["x", "z"], ["y"])], [vi("x", shape=(2, 3)), vi("z", shape=(4, 5))],
                     [vi("y", shape=(2, 3))])
    msg = error_of(model)
    assert msg.startswith("model 'm': ONNX shape inference failed: ")


def test_bad_large_initializer_dtype_names_it():
    w = numpy_helper.from_array(np.ones((100, 100), np.int16), "w16")
    nodes = [h.make_node("Cast", ["w16"], ["wf"], to=T.FLOAT), h.make_node("Add", ["x", "wf"], ["y"])]
    model = model_of(nodes, [vi("x", shape=(100, 100))], [vi("y", shape=(100, 100))], inits=[w])
    assert "initializer 'w16' has element type INT16" in error_of(model)
