"""The zoo in half precision (models/half.py, `python -m models build --dtype fp16|bf16`): the
models type-check with half weights, activations, inputs and outputs, LayerNorm and Softmax sit
between Casts to fp32, and (slow, two tiny models) GIR on the CPU target stays within the half
type's precision of the fp32 model in onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import gir
import models
from models.__main__ import main as cli_main
from models.half import HALF, to_half

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("precision", list(HALF))
@pytest.mark.parametrize("name", list(models.MODELS))
def test_half_model_is_half_with_fp32_norms(name, precision):
    elem = HALF[precision][0]
    m = models.build(name, tiny=True, dtype=precision)  # to_half runs the full checker
    g = m.graph
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    for vi in [*g.input, *g.output]:
        assert vi.type.tensor_type.elem_type in (elem, TensorProto.INT64), vi.name
    norm_params = {x for n in g.node if n.op_type == "LayerNormalization" for x in n.input[1:]}
    for t in g.initializer:
        if t.data_type in floats:
            assert t.data_type == (TensorProto.FLOAT if t.name in norm_params else elem), t.name
    producers = {o: n for n in g.node for o in n.output}
    readers = {x: n for n in g.node for x in n.input}
    for n in g.node:
        if n.op_type in ("LayerNormalization", "Softmax"):
            before, after = producers[n.input[0]], readers[n.output[0]]
            assert before.op_type == after.op_type == "Cast"
            assert before.attribute[0].i == TensorProto.FLOAT and after.attribute[0].i == elem
    if precision == "bf16":
        assert [o.version for o in m.opset_import if o.domain == ""] == [22]


def test_constants_saturate_instead_of_overflowing():
    """float32's lowest (a mask bias) becomes fp16's lowest finite value, not -inf."""
    x = onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    c = numpy_helper.from_array(np.array([np.finfo(np.float32).min, np.inf], np.float32), "c")
    m = onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("Add", ["x", "c"], ["y"])], "g", [x], [y], [c]),
                               opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=10)
    value = numpy_helper.to_array(to_half(m, "fp16").graph.initializer[0])
    assert value.dtype == np.float16 and value[0] == np.finfo(np.float16).min and value[1] == np.inf


def test_cli_builds_half_models(tmp_path, capsys):
    assert cli_main(["build", "--out", str(tmp_path), "--tiny", "--dtype", "bf16", "--only", "sardrn"]) == 0
    m = onnx.load(str(tmp_path / "sardrn_tiny_bf16.onnx"))
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16


def _rel_error(got, want) -> float:
    return max(float(np.abs(g.astype(np.float64) - w).max()) / float(np.abs(w).max()) for g, w in zip(got, want))


@pytest.mark.slow
@pytest.mark.parametrize("precision,bound", [("fp16", 3e-3), ("bf16", 3e-2)])
@pytest.mark.parametrize("name", ["bert", "sardrn"])
def test_half_model_on_the_cpu_matches_fp32_onnxruntime(name, precision, bound):
    fp32 = models.build(name, tiny=True)
    feeds = models.example_inputs(fp32, 0)
    want = ort.InferenceSession(fp32.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    dtype = HALF[precision][1]
    half_feeds = {k: v.astype(dtype) if v.dtype == np.float32 else v for k, v in feeds.items()}
    got = gir.Session(models.build(name, tiny=True, dtype=precision), target="cpu").run(None, half_feeds)
    assert all(g.dtype == dtype for g in got)
    assert _rel_error(got, want) < bound
