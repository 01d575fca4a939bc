"""GIR model zoo: ONNX builders (random weights from a fixed seed, static shapes, opset 17) for the
seven models of the PowerFusion evaluation, each with a TINY variant for fast tests.

``MODELS[name](tiny=False) -> onnx.ModelProto``; ``python -m models build|report`` on the command line.
Tiny variants are bundled under ``models/bundled/NAME_tiny.onnx``; full-size ones are generated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from . import bert, efficientnet_b0, gpt2, rednet50, sardrn, shufflenet_v2, vit

Builder = Callable[..., onnx.ModelProto]

MODELS: dict[str, Builder] = {
    "bert": bert.build,
    "gpt2": gpt2.build,
    "gpt2_b128": gpt2.build_b128,
    "vit": vit.build,
    "efficientnet_b0": efficientnet_b0.build,
    "shufflenet_v2": shufflenet_v2.build,
    "rednet50": rednet50.build,
    "sardrn": sardrn.build,
}

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


DTYPES = ("fp32", "fp16", "bf16")


def file_name(name: str, tiny: bool = False, dtype: str = "fp32") -> str:
    """NAME[_tiny][_fp16|_bf16].onnx"""
    return f"{name}{'_tiny' if tiny else ''}{'' if dtype == 'fp32' else '_' + dtype}.onnx"


def build(name: str, tiny: bool = False, dtype: str = "fp32") -> onnx.ModelProto:
    """Build model ``name``; raises ``KeyError`` with the known names if it is unknown. ``dtype``
    fp16 or bf16: half-precision weights and activations (models/half.py), fp32 LayerNorm and softmax."""
    try:
        builder = MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r} (known: {', '.join(MODELS)})") from None
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    model = builder(tiny=tiny)
    if dtype == "fp32":
        return model
    from .half import to_half
    return to_half(model, dtype)


def bundled_path(name: str) -> Path:
    """Path of the committed tiny variant of ``name``."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    return BUNDLED_DIR / file_name(name, tiny=True)


def load_bundled(name: str) -> onnx.ModelProto:
    return onnx.load(str(bundled_path(name)))


def example_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for ``model`` (shapes from its static input types): int64 inputs that a
    Gather indexes a table with get ids below the table's size, other int64 inputs (masks) are all
    ones, float inputs are standard normal."""
    rng = np.random.default_rng(seed)
    table_rows = {t.name: int(t.dims[0]) for t in model.graph.initializer if len(t.dims)}
    gather_bound: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) == 2 and n.input[0] in table_rows:
            gather_bound[n.input[1]] = table_rows[n.input[0]]
    feeds = {}
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        if tt.elem_type == TensorProto.INT64:
            if vi.name in gather_bound:
                feeds[vi.name] = rng.integers(0, gather_bound[vi.name], size=shape, dtype=np.int64)
            else:
                feeds[vi.name] = np.ones(shape, dtype=np.int64)
        elif tt.elem_type == TensorProto.FLOAT:
            feeds[vi.name] = rng.standard_normal(shape, dtype=np.float32)
        elif tt.elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):  # the fp32 model's inputs, rounded
            half = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
            feeds[vi.name] = rng.standard_normal(shape, dtype=np.float32).astype(half)
        else:
            raise TypeError(f"input {vi.name!r}: unsupported element type {tt.elem_type}")
    return feeds


__all__ = ["DTYPES", "MODELS", "BUNDLED_DIR", "build", "bundled_path", "example_inputs", "file_name", "load_bundled"]
