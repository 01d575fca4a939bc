"""What a decomposition function works with: the ONNX node (``Node``) and an op emitter
(``Builder``) that names steps, computes output shapes, and folds constants on the spot.

Folding here, one basic op at a time, is what lets a later node read a shape computed by an
earlier chain (Shape -> Gather -> Concat -> Reshape) as a plain constant.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gir.ir.dtypes import DTypeError, DTYPES, np_dtype
from gir.ir.expr import Const, Expr, Input, substitute

from ..basic import BasicGraph, BasicOp, Tensor, compute_dtype, contiguous_strides, infer, layout_bounds
from ..errors import FrontendError, UnsupportedDtypeError
from ..limits import check_tensor
from ..reference import execute_op

ONNX_TO_GIR = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool",
}


def onnx_type_name(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"type {elem_type}"


def gir_dtype(elem_type: int, what: str) -> str:
    """GIR dtype name for an ONNX element type; FrontendError naming ``what`` otherwise."""
    if elem_type in ONNX_TO_GIR:
        return ONNX_TO_GIR[elem_type]
    raise UnsupportedDtypeError(f"{what} has element type {onnx_type_name(elem_type)}, which GIR does not support "
                        f"(supported: {', '.join(DTYPES)})")


def _attr_value(a: onnx.AttributeProto):
    v = helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode("utf-8", "replace") for s in v]
    return v


class Node:
    """One ONNX node: its (unique) name, attributes as Python values, and the model opset."""

    def __init__(self, proto: onnx.NodeProto, name: str, opset: int, model: str):
        self.proto = proto
        self.name = name
        self.op_type = proto.op_type
        self.domain = proto.domain or ""
        self.opset = opset
        self.model = model
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        self.attrs = {a.name: a for a in proto.attribute}

    @property
    def origin(self) -> str:
        return f"node '{self.name}' ({self.op_type}, {self.domain or 'ai.onnx'} opset {self.opset})"

    def attr(self, name: str, default=None):
        a = self.attrs.get(name)
        return default if a is None else _attr_value(a)

    def has_attr(self, name: str) -> bool:
        return name in self.attrs

    def input(self, i: int) -> str | None:
        """Name of input i, or None where it is absent or the empty name (optional input)."""
        return self.inputs[i] if i < len(self.inputs) and self.inputs[i] else None

    def output(self, i: int) -> str | None:
        return self.outputs[i] if i < len(self.outputs) and self.outputs[i] else None

    def error(self, message: str) -> FrontendError:
        return FrontendError(f"{self.model}: {self.origin}: {message}")


class Names:
    """Tensor and op names unique across the graph; ONNX names are reserved up front."""

    def __init__(self, reserved=()):
        self.used = set(reserved)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name


def normalize_axis(axis: int, rank: int, node: Node) -> int:
    if not -rank <= axis < max(rank, 1):
        raise node.error(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(axes, rank: int, node: Node) -> tuple[int, ...]:
    out = sorted({normalize_axis(int(a), rank, node) for a in axes})
    if len(out) != len(list(axes)):
        raise node.error(f"repeated axes {list(axes)}")
    return tuple(out)


class Builder:
    """Emits the basic ops of one node into ``graph`` (ops collected in ``self.ops``)."""

    def __init__(self, graph: BasicGraph, node: Node, names: Names, op_names: Names, fold: bool = True):
        self.graph = graph
        self.node = node
        self.names = names
        self.op_names = op_names
        self.fold = fold
        self.ops: list[BasicOp] = []
        self._steps: set[str] = set()

    # ---- queries ---------------------------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        try:
            return self.graph.tensors[name]
        except KeyError:
            raise self.node.error(f"input {name!r} is not defined") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensor(name).shape)

    def rank(self, name: str) -> int:
        return len(self.tensor(name).shape)

    def dtype(self, name: str) -> str:
        return self.tensor(name).dtype

    def value(self, name: str | None) -> np.ndarray | None:
        return None if name is None else self.tensor(name).value

    def const_input(self, i: int, what: str, default=None) -> np.ndarray | None:
        """Value of input i, which GIR needs at compile time (shapes, axes, pads, ...)."""
        name = self.node.input(i)
        if name is None:
            return default
        v = self.value(name)
        if v is None:
            raise self.node.error(
                f"input {i} ({what}, tensor {name!r}) must be a constant: GIR compiles static shapes, "
                f"so {what} must come from an initializer or from constant-foldable nodes")
        return v

    def error(self, message: str) -> FrontendError:
        return self.node.error(message)

    # ---- emission --------------------------------------------------------------------------
    def _step_name(self, step: str) -> str:
        s, k = step, 1
        while s in self._steps:
            s = f"{step}{k}"
            k += 1
        self._steps.add(s)
        return s

    def _new_tensor(self, out: str | None, step: str, shape, dtype: str, value=None) -> str:
        try:
            np_dtype(dtype)
        except DTypeError as e:
            raise self.node.error(f"tensor {out or step!r}: {e}") from None
        name = out if out is not None else self.names.fresh(f"{self.node.name}/{step}")
        shape = tuple(int(d) for d in shape)
        check_tensor(f"{self.node.model}: {self.node.origin}", name, shape)
        if out is not None:
            self.names.used.add(out)
            old = self.graph.tensors.get(out)
            if old is not None and value is None and old.value is None and old.shape == shape and old.dtype == dtype:
                return name  # lowering an op in place: keep the existing output Tensor
        self.graph.tensors[name] = Tensor(name, shape, dtype, value)
        return name

    def constant(self, value, dtype: str | None = None, step: str = "const", out: str | None = None,
                 shared: bool = False) -> str:
        """`shared`: value may be a view of another constant's memory, kept as it is where it is
        already contiguous and of the dtype (a weight laid out back in its own order)."""
        arr = np.asarray(value)
        dtype = dtype or _dtype_of(arr, self.node)
        arr = np.ascontiguousarray(arr, np_dtype(dtype)) if shared else np.array(arr, dtype=np_dtype(dtype), order="C")
        return self._new_tensor(out, self._step_name(step), arr.shape, dtype, arr)

    def emit(self, kind: str, inputs: list[str], attrs: dict, *, step: str, out: str | None = None,
             shape=None, dtype: str | None = None) -> str:
        ins = [self.tensor(t) for t in inputs]
        if shape is None or dtype is None:
            inferred = infer(kind, attrs, ins)
            if inferred is None:
                raise AssertionError(f"{kind} needs an explicit output shape and dtype")
            shape = inferred[0] if shape is None else shape
            dtype = inferred[1] if dtype is None else dtype
        step = self._step_name(step)
        name = self._new_tensor(out, step, shape, dtype)
        op = BasicOp(self.op_names.fresh(f"{self.node.name}/{step}"), kind, list(inputs), [name],
                     dict(attrs), self.node.origin)
        if (self.fold or kind == "view") and all(t.value is not None for t in ins):
            check_tensor(f"{self.node.model}: {self.node.origin}", name, shape, fold=kind != "view")
            strided = _strided_view(ins[0].value, attrs) if kind == "layout" else None
            if strided is not None:
                self.graph.tensors[name].value = strided.reshape(shape)
                return name
            value = execute_op(op, self.graph.tensors, [t.value for t in ins])
            # a view of a constant shares its memory (GPT-2's lm_head reads the embedding's
            # 154 MB weight, which the Gather reads too: copied, the session held it twice)
            self.graph.tensors[name].value = np.asarray(value) if kind == "view" else np.array(value)
        else:
            self.ops.append(op)
        return name

    def elementwise(self, expr: Expr, inputs: list[str], *, step: str, out: str | None = None,
                    dtype: str | None = None, shape=None) -> str:
        """Emit one elementwise op; scalar constants of the compute type become Const leaves."""
        dtype = dtype or self.dtype(inputs[0])
        shapes = [self.shape(t) for t in inputs]
        try:
            full = np.broadcast_shapes(*shapes) if inputs else ()
            # an operand larger than a given result (PRelu's slope) would be read out of bounds
            ok = shape is None or np.broadcast_shapes(full, tuple(shape)) == tuple(shape)
        except ValueError:
            ok = False
        if not ok:
            to = "" if shape is None else f" to {tuple(shape)}"
            raise self.error(f"input shapes {', '.join(map(str, shapes))} do not broadcast{to}")
        if shape is None:
            shape = full
        cdt = compute_dtype([self.dtype(t) for t in inputs], dtype)
        values = [self.value(t) for t in inputs]
        if inputs and not all(v is not None for v in values):
            repl, kept = {}, []
            for i, (t, v) in enumerate(zip(inputs, values)):
                leaf = _scalar_leaf(v, self.dtype(t), cdt)
                if leaf is not None:
                    repl[i] = leaf
                elif t in kept:  # Mul(x, x): one input read twice
                    repl[i] = Input(kept.index(t))
                else:
                    repl[i] = Input(len(kept))
                    kept.append(t)
            expr = substitute(expr, repl)
            inputs = kept
        return self.emit("elementwise", inputs, {"expr": expr, "dtype": dtype}, step=step, out=out,
                         shape=tuple(shape), dtype=dtype)

    def c(self, value: float, like: str) -> Const:
        """A Const leaf in the compute type of tensor ``like``."""
        dt = self.dtype(like)
        return Const(bool(value), "bool") if dt == "bool" else Const(float(value), dt)

    def reduce(self, x: str, op: str, axes, keepdims: bool, *, step: str, out: str | None = None) -> str:
        return self.emit("reduce", [x], {"op": op, "axes": tuple(sorted(int(a) for a in axes)),
                                         "keepdims": bool(keepdims)}, step=step, out=out)

    def view(self, x: str, shape, *, step: str = "view", out: str | None = None) -> str:
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) != math.prod(self.shape(x)):
            raise self.error(f"cannot view {self.shape(x)} as {shape}")
        return self.emit("view", [x], {}, step=step, out=out, shape=shape, dtype=self.dtype(x))

    def layout(self, x: str, offset: int, shape, strides, *, step: str, out: str | None = None,
               out_shape=None) -> str:
        """Strided copy; an identity layout becomes a view (nothing moves)."""
        shape = tuple(int(d) for d in shape)
        strides = tuple(int(s) for s in strides)
        out_shape = shape if out_shape is None else tuple(int(d) for d in out_shape)
        n = math.prod(shape)
        if math.prod(out_shape) != n:
            raise AssertionError(f"layout shape {shape} vs output shape {out_shape}")
        if n == math.prod(self.shape(x)) and (n == 0 or (offset == 0 and _is_contiguous(shape, strides))):
            return self.view(x, out_shape, step=step, out=out)
        return self.emit("layout", [x], {"offset": int(offset), "shape": shape, "strides": strides},
                         step=step, out=out, shape=out_shape, dtype=self.dtype(x))

    def copy(self, x: str, out: str, step: str = "identity") -> str:
        return self.view(x, self.shape(x), step=step, out=out)


def _strided_view(v: np.ndarray, attrs: dict) -> np.ndarray | None:
    """The layout `attrs` of constant `v` as a read-only strided view of v's memory (a transpose
    or slice of a weight folds without a copy: GPT-2's lm_head transposed its 154 MB embedding
    twice, transB and then `weight_T`, each a copy), or None where v is not one contiguous
    block, or the layout repeats an element (a stride 0 over more than one), steps backwards or
    reads outside v (the reference's gather then does it, or raises)."""
    shape, strides, offset = tuple(attrs["shape"]), tuple(attrs["strides"]), int(attrs["offset"])
    if not v.flags.c_contiguous or math.prod(shape) == 0 or any(st < 0 or st == 0 and n > 1 for n, st in zip(shape, strides)):
        return None
    lo, hi = layout_bounds(attrs)
    if lo < 0 or hi >= v.size:
        return None
    return np.lib.stride_tricks.as_strided(v.reshape(-1)[offset:], shape, tuple(st * v.itemsize for st in strides),
                                           writeable=False)


def _is_contiguous(shape, strides) -> bool:
    want = contiguous_strides(shape)
    return all(n == 1 or s == w for n, s, w in zip(shape, strides, want))


def _dtype_of(arr: np.ndarray, node: Node) -> str:
    for name, dt in DTYPES.items():
        if arr.dtype == dt:
            return name
    raise node.error(f"constant of numpy type {arr.dtype} is not a GIR dtype")


def _scalar_leaf(v, dtype: str, cdt: str):
    """A Const for a one-element constant of the compute type, or None to keep it an input."""
    if v is None or v.size != 1 or dtype != cdt:
        return None
    x = v.reshape(-1)[0]
    if dtype == "bool":
        return Const(bool(x), "bool")
    if np.dtype(np_dtype(dtype)).kind in "iu" and abs(int(x)) > 2 ** 53:
        return None
    return Const(float(x), dtype)
