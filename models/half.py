"""A zoo model in half precision (fp16 or bf16), the way exporters write one (torch autocast,
onnxconverter-common's float16 pass): weights, activations, graph inputs and outputs in the half
type; LayerNormalization and Softmax computed in fp32 between Casts (their scale and bias stay
fp32), so the statistics and the softmax sums are not rounded to 16 bits. Reductions
(ReduceSum, ReduceMean, the average pools) keep half inputs and outputs: ONNX has no
accumulation type for them, and GIR (like onnxruntime's kernels) accumulates half sums in fp32.

A bf16 model is first moved to opset 22 (onnx's version converter), the first opset whose Conv,
pooling and a few other ops take bfloat16 (at opset 17 the model would not type-check); fp16
models keep the builder's opset 17.

Float constants are rounded to the half type with saturation: a mask bias of float32's lowest
value becomes the half type's lowest finite value, not -inf (which 0 * -inf would turn into NaN).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HALF = {"fp16": (TensorProto.FLOAT16, np.dtype(np.float16)),
        "bf16": (TensorProto.BFLOAT16, np.dtype(ml_dtypes.bfloat16))}
FP32_OPS = ("LayerNormalization", "Softmax")  # computed in fp32 between Casts
BF16_OPSET = 22  # Conv, MaxPool, AveragePool, GlobalAveragePool take bfloat16 from opset 22


def _round(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    top = float(ml_dtypes.finfo(dtype).max)
    finite = np.isfinite(array)
    return np.where(finite, np.clip(array, -top, top), array).astype(dtype)


def to_half(model: onnx.ModelProto, precision: str) -> onnx.ModelProto:
    """`model` (fp32) with half-precision weights and activations; `precision` is fp16 or bf16."""
    if precision not in HALF:
        raise ValueError(f"precision must be one of {', '.join(HALF)}, got {precision!r}")
    elem, dtype = HALF[precision]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), BF16_OPSET)
    if precision == "bf16" and opset < BF16_OPSET:
        from onnx import version_converter
        model = version_converter.convert_version(model, BF16_OPSET)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    kept = set(FP32_OPS)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in g.node:
        for i, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, i))
    # parameters only the fp32 ops read, past their data input (LayerNorm's scale and bias), stay fp32
    fp32_params = {t.name for t in g.initializer
                   if readers.get(t.name) and all(n.op_type in kept and i > 0 for n, i in readers[t.name])}
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT and t.name not in fp32_params:
            t.CopyFrom(numpy_helper.from_array(_round(numpy_helper.to_array(t), dtype), t.name))
    for vi in [*g.input, *g.output]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = elem
    del g.value_info[:]
    nodes = []
    for n in g.node:
        if n.op_type == "Cast" and helper.get_attribute_value(n.attribute[0]) == TensorProto.FLOAT:
            n.attribute[0].CopyFrom(helper.make_attribute("to", elem))
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                    a.t.CopyFrom(numpy_helper.from_array(_round(numpy_helper.to_array(a.t), dtype), a.t.name))
        if n.op_type not in kept:
            nodes.append(n)
            continue
        wide_in = f"{n.input[0]}_fp32_{len(nodes)}"
        nodes.append(helper.make_node("Cast", [n.input[0]], [wide_in], name=f"{n.name}/CastIn", to=TensorProto.FLOAT))
        n.input[0] = wide_in
        result = n.output[0]
        n.output[0] = f"{result}_fp32"
        nodes.append(n)
        nodes.append(helper.make_node("Cast", [n.output[0]], [result], name=f"{n.name}/CastOut", to=elem))
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(out, full_check=True)  # types against each op's constraints too
    return out
