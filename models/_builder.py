"""A tiny ONNX graph builder shared by the model-zoo builders.

It names nodes the way the PyTorch exporter does (``/encoder/layer.0/attention/Softmax``,
outputs ``/encoder/layer.0/attention/Softmax_output_0``), keeps every shape-like operand as
an initializer, and draws weights from a seeded ``numpy.random.default_rng`` so a builder
always produces byte-identical models.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10  # onnxruntime 1.31 rejects onnx 1.23's default IR version (14)
OPSET = 17

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}


class GraphBuilder:
    """Accumulates nodes, initializers, inputs and outputs of one ONNX graph."""

    def __init__(self, name: str, seed: int = 0, opset: int = OPSET) -> None:
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._scope: list[str] = []
        self._node_names: dict[str, int] = {}
        self._init_names: set[str] = set()
        self._const_cache: dict[tuple, str] = {}

    # ------------------------------------------------------------------ naming
    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Nest node names under ``name`` (may contain ``/``)."""
        self._scope.append(name.strip("/"))
        try:
            yield
        finally:
            self._scope.pop()

    @property
    def prefix(self) -> str:
        return "/" + "/".join(self._scope) if self._scope else ""

    @property
    def param_prefix(self) -> str:
        """Dotted parameter prefix, like a torch ``state_dict`` key."""
        return ".".join(s.replace("/", ".") for s in self._scope)

    def _unique_node_name(self, op_type: str) -> str:
        base = f"{self.prefix}/{op_type}"
        n = self._node_names.get(base, 0)
        self._node_names[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    # ------------------------------------------------------------ initializers
    def init(self, name: str, array: np.ndarray) -> str:
        """Add an initializer under an exact name (must be unique)."""
        if name in self._init_names:
            raise ValueError(f"duplicate initializer {name!r}")
        self._init_names.add(name)
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C", copy=True), name))
        return name

    def param(self, local: str, array: np.ndarray) -> str:
        """Add a parameter named ``<scope dotted>.<local>``."""
        full = f"{self.param_prefix}.{local}" if self._scope else local
        return self.init(full, array)

    def weight(self, local: str, shape: Sequence[int], std: float = 0.02) -> str:
        return self.param(local, self.randn(shape, std))

    def randn(self, shape: Sequence[int], std: float = 0.02) -> np.ndarray:
        return (self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)).astype(np.float32)

    def const(self, value, dtype=np.int64) -> str:
        """A (deduplicated) constant initializer, e.g. a Reshape shape or an axes list."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._const_cache:
            name = f"onnx::Const_{len(self._const_cache)}"
            self._const_cache[key] = self.init(name, arr)
        return self._const_cache[key]

    def fconst(self, value) -> str:
        return self.const(value, np.float32)

    # ----------------------------------------------------------------- nodes
    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs):
        """Append a node; returns its output name (or a list when ``n_out != 1``)."""
        name = self._unique_node_name(op_type)
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    # ------------------------------------------------------------ graph I/O
    def input(self, name: str, elem_type: int, shape: Sequence[int]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, value: str, name: str, elem_type: int, shape: Sequence[int]) -> str:
        """Expose ``value`` as a graph output called ``name`` (renames the producer's output)."""
        for node in reversed(self.nodes):
            for i, o in enumerate(node.output):
                if o == value:
                    node.output[i] = name
                    for n in self.nodes:
                        for j, x in enumerate(n.input):
                            if x == value:
                                n.input[j] = name
                    self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
                    return name
        raise KeyError(value)

    def build(self, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph,
            ir_version=IR_VERSION,
            opset_imports=[helper.make_opsetid("", self.opset)],
            producer_name="gir-model-zoo",
            producer_version="1.0",
            doc_string=doc,
        )
        return model

    # ------------------------------------------------------- layer helpers
    def linear(self, x: str, in_f: int, out_f: int, name: str, std: float = 0.02, bias: bool = True) -> str:
        """A torch ``nn.Linear`` on an N-D tensor as the exporter writes it: MatMul + Add."""
        with self.scope(name):
            w = self.weight("weight_T", (in_f, out_f), std)  # stored pre-transposed, as exporters do
            y = self.op("MatMul", [x, w])
            if bias:
                b = self.weight("bias", (out_f,), std)
                y = self.op("Add", [b, y])
        return y

    def gemm(self, x: str, in_f: int, out_f: int, name: str, std: float = 0.02) -> str:
        """A 2-D ``nn.Linear`` as Gemm(transB=1)."""
        with self.scope(name):
            w = self.weight("weight", (out_f, in_f), std)
            b = self.weight("bias", (out_f,), std)
            return self.op("Gemm", [x, w, b], alpha=1.0, beta=1.0, transB=1)

    def layer_norm(self, x: str, dim: int, name: str, eps: float = 1e-5) -> str:
        with self.scope(name):
            g = self.param("weight", 1.0 + self.randn((dim,), 0.02))
            b = self.weight("bias", (dim,), 0.02)
            return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=eps)

    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        k: int,
        name: str,
        stride: int = 1,
        pad: int | None = None,
        dilation: int = 1,
        group: int = 1,
        bias: bool = True,
        gain: float = 1.0,
    ) -> str:
        """Conv (BN folded in, so it has a bias) with He-style random weights scaled by ``gain``."""
        if pad is None:
            pad = dilation * (k - 1) // 2
        with self.scope(name):
            fan_in = (cin // group) * k * k
            w = self.weight("weight", (cout, cin // group, k, k), gain * float(np.sqrt(2.0 / fan_in)))
            ins = [x, w]
            if bias:
                ins.append(self.weight("bias", (cout,), 0.01))
            return self.op(
                "Conv",
                ins,
                dilations=[dilation, dilation],
                group=group,
                kernel_shape=[k, k],
                pads=[pad, pad, pad, pad],
                strides=[stride, stride],
            )

    def batch_norm(self, x: str, c: int, name: str, eps: float = 1e-5) -> str:
        with self.scope(name):
            scale = self.param("weight", 1.0 + self.randn((c,), 0.1))
            bias = self.weight("bias", (c,), 0.1)
            mean = self.param("running_mean", self.randn((c,), 0.1))
            var = self.param("running_var", (1.0 + np.abs(self.randn((c,), 0.1))).astype(np.float32))
            return self.op("BatchNormalization", [x, scale, bias, mean, var], epsilon=eps, momentum=0.9)

    def silu(self, x: str) -> str:
        """SiLU as exporters write it: Sigmoid then Mul."""
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def gelu_erf(self, x: str) -> str:
        """x * 0.5 * (1 + erf(x / sqrt(2))) -- the opset-17 export of ``nn.GELU()``."""
        d = self.op("Div", [x, self.fconst(1.4142135381698608)])
        e = self.op("Erf", [d])
        a = self.op("Add", [e, self.fconst(1.0)])
        m = self.op("Mul", [x, a])
        return self.op("Mul", [m, self.fconst(0.5)])

    def gelu_tanh(self, x: str) -> str:
        """GPT-2's ``gelu_new``: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))."""
        half = self.op("Mul", [self.fconst(0.5), x])
        p = self.op("Pow", [x, self.fconst(3.0)])
        m = self.op("Mul", [self.fconst(0.044715), p])
        a = self.op("Add", [x, m])
        s = self.op("Mul", [self.fconst(0.7978845834732056), a])
        t = self.op("Tanh", [s])
        one = self.op("Add", [self.fconst(1.0), t])
        return self.op("Mul", [half, one])


def count_parameters(model: onnx.ModelProto) -> int:
    """Elements of the floating-point initializers (shape constants are not parameters)."""
    total = 0
    for t in model.graph.initializer:
        if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE):
            total += int(np.prod(t.dims, dtype=np.int64)) if len(t.dims) else 1
    return total
