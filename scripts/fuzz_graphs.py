"""Random valid ONNX graphs for the fuzzer (scripts/fuzz.py): 2-12 nodes drawn from every op
GIR supports (gir.frontend.decompose SUPPORTED_OPS), each with a valid attribute set, on odd
shapes (1, 3, 7, 33, 129, 512, 1000), broadcasting and every axis. Deterministic given the
random.Random passed in. Shapes of intermediate tensors come from ONNX shape inference, so a
generator only has to build a valid node; one that does not is dropped and another op drawn.
"""
from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DIMS = (1, 3, 7, 33, 129, 512, 1000)
MAX_ELEMENTS = 1 << 16  # keeps a case (and the native engine's compile) to seconds
OPSET = 23
F = TensorProto.FLOAT


class Builder:
    """A graph under construction: a pool of float32 tensors with inferred shapes."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.nodes, self.inputs, self.inits, self.pool = [], [], [], []
        self.shapes: dict[str, tuple] = {}
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def shape(self) -> tuple:
        for _ in range(50):
            rank = self.rng.choice((1, 2, 2, 3, 3, 4))
            shape = tuple(self.rng.choice(DIMS) for _ in range(rank))
            if int(np.prod(shape)) <= MAX_ELEMENTS:
                return shape
        return (7,)

    def input(self, shape: tuple) -> str:
        name = self.name("in")
        self.inputs.append(helper.make_tensor_value_info(name, F, list(shape)))
        self.shapes[name] = tuple(shape)
        return name

    def init(self, value: np.ndarray) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list, n_out: int = 1, **attrs) -> list[str]:
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name("n_"), **attrs))
        return outs

    def model(self, outputs: list[str]) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, F, list(self.shapes[o]) if o in self.shapes else None)
                for o in outputs]
        graph = helper.make_graph(self.nodes, "fuzz", self.inputs, outs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)

    def infer(self, outputs: list[str]) -> dict[str, tuple]:
        m = onnx.shape_inference.infer_shapes(self.model(outputs), strict_mode=True, data_prop=True)
        out = {}
        for vi in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input):
            tt = vi.type.tensor_type
            if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
                out[vi.name] = (tt.elem_type, tuple(d.dim_value for d in tt.shape.dim))
        return out

    def weights(self, shape, low=-1.0, high=1.0) -> str:
        return self.init(np.asarray(self.rng_np().uniform(low, high, shape), np.float32))

    def rng_np(self) -> np.random.Generator:
        return np.random.default_rng(self.rng.getrandbits(32))

    def positive(self, x: str) -> str:
        """|x| + 0.5: a valid argument for Log, Sqrt, Reciprocal, Pow, Div."""
        return self.node("Add", [self.node("Abs", [x])[0], self.init(np.float32(0.5))])[0]

    def to_float(self, t: str) -> str:
        return self.node("Cast", [t], to=F)[0]

    def broadcast_shape(self, shape: tuple) -> tuple:
        """A shape that broadcasts against `shape`: a suffix, some dims set to 1."""
        keep = self.rng.randint(0, len(shape))
        suffix = list(shape[len(shape) - keep:])
        return tuple(1 if self.rng.random() < 0.3 else d for d in suffix)

    def other(self, shape: tuple) -> str:
        """A second operand broadcasting against `shape`: a pool tensor of the same shape, a new
        input or a constant."""
        same = [t for t in self.pool if self.shapes.get(t) == shape]
        r = self.rng.random()
        if same and r < 0.3:
            return self.rng.choice(same)
        b = self.broadcast_shape(shape)
        return self.input(b) if r < 0.65 else self.weights(b)

    def axis(self, rank: int, negative: bool = True) -> int:
        a = self.rng.randrange(rank)
        return a - rank if negative and self.rng.random() < 0.4 else a

    def axes(self, rank: int) -> list[int]:
        return sorted(self.rng.sample(range(rank), self.rng.randint(1, rank)))


def _unary(op, positive=False):
    def gen(b, x, s):
        return b.node(op, [b.positive(x) if positive else x])[0]
    return gen


def _periodic(op):
    """Sin and Cos read a Tanh-bounded argument: of a large one (a 7,000-element sum, where fp32
    values are 5e-4 apart) every summation order gives a different, equally right answer."""
    def gen(b, x, s):
        return b.node(op, [b.node("Tanh", [x])[0]])[0]
    return gen


def _binary(op, positive_rhs=False):
    def gen(b, x, s):
        y = b.other(s)
        if positive_rhs:
            y = b.positive(y)
        return b.node(op, [x, y] if b.rng.random() < 0.7 else [y, x])[0]
    return gen


def _variadic(op):
    def gen(b, x, s):
        return b.node(op, [x] + [b.other(s) for _ in range(b.rng.randint(0, 2))])[0]
    return gen


def _compare(op):
    def gen(b, x, s):
        cond = b.node(op, [x, b.other(s)])[0]
        return b.node("Where", [cond, x, b.weights(b.broadcast_shape(s))])[0]
    return gen


def _logic(op):
    def gen(b, x, s):
        p = b.node("Greater", [x, b.init(np.float32(0))])[0]
        q = b.node("Less", [b.other(s), b.init(np.float32(0.3))])[0]
        return b.to_float(b.node(op, [p, q])[0])
    return gen


def _reduce(op, positive=False):
    def gen(b, x, s):
        x = b.positive(x) if positive else x
        keep = b.rng.randint(0, 1)
        if b.rng.random() < 0.2:
            return b.node(op, [x], keepdims=keep)[0]
        axes = b.init(np.array([a - len(s) if b.rng.random() < 0.3 else a for a in b.axes(len(s))], np.int64))
        return b.node(op, [x, axes], keepdims=keep)[0]
    return gen


def _arg(op):
    def gen(b, x, s):
        return b.to_float(b.node(op, [x], axis=b.axis(len(s)), keepdims=b.rng.randint(0, 1))[0])
    return gen


def _softmax(op):
    def gen(b, x, s):
        return b.node(op, [x], axis=b.axis(len(s)))[0]
    return gen


def _norm(op):
    def gen(b, x, s):
        axis = b.axis(len(s))
        norm = s[axis % len(s):]
        ins = [x, b.weights(norm, 0.5, 1.5)] + ([b.weights(norm)] if op == "LayerNormalization" and b.rng.random() < 0.7 else [])
        return b.node(op, ins, axis=axis, epsilon=b.rng.choice((1e-5, 1e-3)))[0]
    return gen


def _instance_norm(b, x, s):
    if len(s) < 3:
        return None
    return b.node("InstanceNormalization", [x, b.weights((s[1],), 0.5, 1.5), b.weights((s[1],))],
                  epsilon=1e-5)[0]


def _batch_norm(b, x, s):
    if len(s) < 2:
        return None
    c = (s[1],)
    return b.node("BatchNormalization", [x, b.weights(c, 0.5, 1.5), b.weights(c), b.weights(c),
                                         b.weights(c, 0.5, 1.5)], epsilon=1e-5)[0]


def _pool(op):
    def gen(b, x, s):
        if len(s) < 3 or len(s) > 4:
            return None
        spatial = s[2:]
        kernel = [b.rng.randint(1, min(3, d)) for d in spatial]
        strides = [b.rng.randint(1, 2) for _ in spatial]
        pads = [b.rng.randint(0, k - 1) for k in kernel] * 2
        attrs = dict(kernel_shape=kernel, strides=strides, pads=pads)
        if op == "AveragePool":
            attrs["count_include_pad"] = b.rng.randint(0, 1)
        return b.node(op, [x], **attrs)[0]
    return gen


def _global_pool(op):
    def gen(b, x, s):
        return b.node(op, [x])[0] if len(s) >= 3 else None
    return gen


def _conv(op):
    def gen(b, x, s):
        if len(s) not in (3, 4) or s[1] > 64:
            return None
        spatial = s[2:]
        kernel = [b.rng.randint(1, min(3, d)) for d in spatial]
        out_c = b.rng.choice((1, 3, 7))
        group = s[1] if op == "Conv" and b.rng.random() < 0.3 else 1
        w_shape = (out_c * group if group > 1 else out_c, s[1] // group, *kernel) if op == "Conv" else \
            (s[1], out_c, *kernel)
        attrs = dict(kernel_shape=kernel, strides=[b.rng.randint(1, 2) for _ in spatial],
                     pads=[b.rng.randint(0, k - 1) for k in kernel] * 2, group=group)
        ins = [x, b.weights(w_shape)] + ([b.weights((w_shape[0] if op == "Conv" else out_c,))]
                                         if b.rng.random() < 0.5 else [])
        return b.node(op, ins, **attrs)[0]
    return gen


def _matmul(b, x, s):
    k = s[-1]
    if k > 1024:
        return None
    return b.node("MatMul", [x, b.weights((k, b.rng.choice((1, 3, 7, 33))))])[0]


def _gemm(b, x, s):
    if len(s) != 2:
        return None
    trans_b = b.rng.randint(0, 1)
    n = b.rng.choice((1, 3, 7, 33))
    w = b.weights((n, s[1]) if trans_b else (s[1], n))
    return b.node("Gemm", [x, w, b.weights((n,))], transB=trans_b, alpha=0.5, beta=1.5)[0]


def _einsum(b, x, s):
    if len(s) != 2:
        return None
    eq, ins = b.rng.choice([("ij->ji", [x]), ("ij->i", [x]), ("ij,jk->ik", [x, b.weights((s[1], 3))])])
    return b.node("Einsum", ins, equation=eq)[0]


def _transpose(b, x, s):
    perm = list(range(len(s)))
    b.rng.shuffle(perm)
    return b.node("Transpose", [x], perm=perm)[0]


def _reshape(b, x, s):
    n = int(np.prod(s))
    target = b.rng.choice([[n], [-1], list(reversed(s)), [1, n], [0, -1] if len(s) > 1 else [n, 1]])
    return b.node("Reshape", [x, b.init(np.array(target, np.int64))])[0]


def _flatten(b, x, s):
    return b.node("Flatten", [x], axis=b.rng.randint(-len(s), len(s)))[0]


def _unsqueeze(b, x, s):
    return b.node("Unsqueeze", [x, b.init(np.array([b.rng.randint(-len(s) - 1, len(s))], np.int64))])[0]


def _squeeze(b, x, s):
    ones = [i for i, d in enumerate(s) if d == 1]
    if not ones or len(ones) == len(s):
        return None
    return b.node("Squeeze", [x, b.init(np.array(b.rng.sample(ones, b.rng.randint(1, len(ones))), np.int64))])[0]


def _expand(b, x, s):
    grow = [b.rng.choice((3, 7)) if d == 1 else d for d in s]
    if np.prod(grow) > MAX_ELEMENTS:
        return None
    return b.node("Expand", [x, b.init(np.array(grow, np.int64))])[0]


def _tile(b, x, s):
    reps = [b.rng.randint(1, 3) for _ in s]
    if np.prod(s) * np.prod(reps) > MAX_ELEMENTS:
        return None
    return b.node("Tile", [x, b.init(np.array(reps, np.int64))])[0]


def _slice(b, x, s):
    axes = b.axes(len(s))
    starts, ends, steps = [], [], []
    for a in axes:
        step = b.rng.choice((1, 1, 2, -1, -3))
        lo, hi = sorted(b.rng.sample(range(-s[a] - 2, s[a] + 3), 2))
        starts, ends, steps = starts + ([lo] if step > 0 else [hi]), ends + ([hi] if step > 0 else [lo]), steps + [step]
    ins = [x] + [b.init(np.array(v, np.int64)) for v in (starts, ends, axes, steps)]
    return b.node("Slice", ins)[0]


def _split(b, x, s):
    axis = b.axis(len(s))
    if s[axis] < 2:
        return None
    if b.rng.random() < 0.5:
        parts = b.rng.randint(2, min(4, s[axis]))
        outs = b.node("Split", [x], n_out=parts, axis=axis, num_outputs=parts)
    else:
        first = b.rng.randint(1, s[axis] - 1)
        outs = b.node("Split", [x, b.init(np.array([first, s[axis] - first], np.int64))], n_out=2, axis=axis)
    return b.rng.choice(outs)


def _concat(b, x, s):
    axis = b.axis(len(s))
    ins = [x]
    for _ in range(b.rng.randint(1, 3)):
        shape = list(s)
        shape[axis] = b.rng.choice((1, 3, 7))
        ins.append(b.input(tuple(shape)) if b.rng.random() < 0.5 else b.weights(shape))
    if sum(int(np.prod(b.shapes.get(t, s))) for t in ins) > MAX_ELEMENTS * 2:
        return None
    return b.node("Concat", ins, axis=axis)[0]


def _pad(b, x, s):
    mode = b.rng.choice(("constant", "reflect", "edge"))
    limit = [d - 1 if mode == "reflect" else 3 for d in s]
    pads = [b.rng.randint(0, min(3, m)) for m in limit] + [b.rng.randint(0, min(3, m)) for m in limit]
    if np.prod([d + pads[i] + pads[i + len(s)] for i, d in enumerate(s)]) > MAX_ELEMENTS * 2:
        return None
    ins = [x, b.init(np.array(pads, np.int64))] + ([b.init(np.float32(0.25))] if mode == "constant" else [])
    return b.node("Pad", ins, mode=mode)[0]


def _gather(b, x, s):
    axis = b.axis(len(s))
    n = s[axis]
    idx = b.rng_np().integers(-n, n, size=b.rng.choice(((3,), (2, 2), ())))
    return b.node("Gather", [x, b.init(idx.astype(np.int64))], axis=axis)[0]


def _gather_nd(b, x, s):
    depth = b.rng.randint(1, len(s))
    idx = np.stack([b.rng_np().integers(0, d, size=(3,)) for d in s[:depth]], axis=-1)
    return b.node("GatherND", [x, b.init(idx.astype(np.int64))])[0]


def _trilu(b, x, s):
    if len(s) < 2:
        return None
    return b.node("Trilu", [x, b.init(np.array(b.rng.randint(-2, 2), np.int64))], upper=b.rng.randint(0, 1))[0]


def _cumsum(b, x, s):
    return b.node("CumSum", [x, b.init(np.array(b.axis(len(s)), np.int64))], exclusive=b.rng.randint(0, 1),
                  reverse=b.rng.randint(0, 1))[0]


def _clip(b, x, s):
    lo = b.rng.uniform(-1, 0)
    return b.node("Clip", [x, b.init(np.float32(lo)), b.init(np.float32(lo + b.rng.uniform(0.1, 2)))])[0]


def _prelu(b, x, s):
    slope = b.broadcast_shape(s) if len(s) < 2 or b.rng.random() < 0.5 else (s[1],) + (1,) * (len(s) - 2)
    return b.node("PRelu", [x, b.weights(slope)])[0]


def _cast(b, x, s):
    to = b.rng.choice((TensorProto.FLOAT16, TensorProto.INT32, TensorProto.DOUBLE))
    return b.to_float(b.node("Cast", [x], to=to)[0])


def _castlike(b, x, s):
    return b.to_float(b.node("CastLike", [x, b.init(np.array([1], np.float64))])[0])


def _where(b, x, s):
    cond = b.node("Greater", [b.other(s), b.init(np.float32(0))])[0]
    return b.node("Where", [cond, x, b.other(s)])[0]


def _isnan(b, x, s):
    return b.to_float(b.node("IsNaN", [b.node("Log", [x])[0]])[0])


def _not(b, x, s):
    return b.to_float(b.node("Not", [b.node("Greater", [x, b.init(np.float32(0))])[0]])[0])


def _mod(b, x, s):
    return b.node("Mod", [x, b.positive(b.other(s))], fmod=1)[0]


def _pow(b, x, s):
    return b.node("Pow", [b.positive(x), b.init(np.float32(b.rng.choice((0.5, 2.0, 3.0, -1.0))))])[0]


def _shape(op):
    def gen(b, x, s):
        return b.to_float(b.node(op, [x])[0])
    return gen


def _constant_of_shape(b, x, s):
    c = b.node("ConstantOfShape", [b.init(np.array(s, np.int64))],
               value=numpy_helper.from_array(np.array([1.5], np.float32)))[0]
    return b.node("Add", [x, c])[0]


def _constant(b, x, s):
    c = b.node("Constant", [], value=numpy_helper.from_array(b.rng_np().uniform(-1, 1, b.broadcast_shape(s)).astype(np.float32)))[0]
    return b.node("Mul", [x, c])[0]


def _range(b, x, s):
    n = s[-1]
    r = b.node("Range", [b.init(np.float32(0.5)), b.init(np.float32(0.5 + 0.25 * n)), b.init(np.float32(0.25))])[0]
    return b.node("Add", [x, r])[0]


def _resize(b, x, s):
    if len(s) < 3:
        return None
    scales = [1.0, 1.0] + [b.rng.choice((0.5, 1.0, 2.0)) for _ in s[2:]]
    if np.prod([d * f for d, f in zip(s, scales)]) > MAX_ELEMENTS * 2:
        return None
    mode = b.rng.choice(("nearest", "linear"))
    return b.node("Resize", [x, "", b.init(np.array(scales, np.float32))], mode=mode)[0]


def _attention(b, x, s):
    if len(s) != 4 or s[3] > 129 or s[2] > 129:
        return None
    return b.node("Attention", [x, b.weights(s), b.weights(s)])[0]


def _dropout(b, x, s):
    return b.node("Dropout", [x])[0]


GENERATORS = {
    **{op: _unary(op) for op in ("Abs", "Ceil", "Erf", "Exp", "Floor", "Neg", "Relu", "Sigmoid",
                                  "Tanh", "Identity", "HardSwish")},
    "Sin": _periodic("Sin"), "Cos": _periodic("Cos"),
    **{op: _unary(op, positive=True) for op in ("Log", "Sqrt", "Reciprocal")},
    "LeakyRelu": lambda b, x, s: b.node("LeakyRelu", [x], alpha=b.rng.choice((0.01, 0.2)))[0],
    "HardSigmoid": lambda b, x, s: b.node("HardSigmoid", [x], alpha=0.3, beta=0.4)[0],
    "Gelu": lambda b, x, s: b.node("Gelu", [x], approximate=b.rng.choice(("none", "tanh")))[0],
    **{op: _binary(op) for op in ("Add", "Sub", "Mul")},
    "Div": _binary("Div", positive_rhs=True),
    **{op: _variadic(op) for op in ("Max", "Min", "Mean", "Sum")},
    **{op: _compare(op) for op in ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual")},
    **{op: _logic(op) for op in ("And", "Or", "Xor")},
    **{op: _reduce(op) for op in ("ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "ReduceSumSquare",
                                   "ReduceL1", "ReduceL2")},
    **{op: _reduce(op, positive=True) for op in ("ReduceLogSum", "ReduceLogSumExp", "ReduceProd")},
    "ArgMax": _arg("ArgMax"), "ArgMin": _arg("ArgMin"),
    "Softmax": _softmax("Softmax"), "LogSoftmax": _softmax("LogSoftmax"),
    "LayerNormalization": _norm("LayerNormalization"), "RMSNormalization": _norm("RMSNormalization"),
    "InstanceNormalization": _instance_norm, "BatchNormalization": _batch_norm,
    "AveragePool": _pool("AveragePool"), "MaxPool": _pool("MaxPool"),
    "GlobalAveragePool": _global_pool("GlobalAveragePool"), "GlobalMaxPool": _global_pool("GlobalMaxPool"),
    "Conv": _conv("Conv"), "ConvTranspose": _conv("ConvTranspose"),
    "MatMul": _matmul, "Gemm": _gemm, "Einsum": _einsum, "Transpose": _transpose, "Reshape": _reshape,
    "Flatten": _flatten, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Expand": _expand, "Tile": _tile,
    "Slice": _slice, "Split": _split, "Concat": _concat, "Pad": _pad, "Gather": _gather, "GatherND": _gather_nd,
    "Trilu": _trilu, "CumSum": _cumsum, "Clip": _clip, "PRelu": _prelu, "Cast": _cast, "CastLike": _castlike,
    "Where": _where, "IsNaN": _isnan, "Not": _not, "Mod": _mod, "Pow": _pow, "Shape": _shape("Shape"),
    "Size": lambda b, x, s: b.node("Add", [x, b.to_float(b.node("Size", [x])[0])])[0], "ConstantOfShape": _constant_of_shape, "Constant": _constant, "Range": _range,
    "Resize": _resize, "Attention": _attention, "Dropout": _dropout,
}


def random_model(rng: random.Random, ops: list[str] | None = None) -> tuple[onnx.ModelProto, list[str]]:
    """A valid model of 2-12 generated ops (more nodes, counting helpers), and the op types drawn."""
    ops = sorted(ops or GENERATORS)
    b = Builder(rng)
    first = b.input(b.shape())
    b.pool.append(first)
    want, drawn = rng.randint(2, 12), []
    for _ in range(want * 4):
        if len(drawn) >= want:
            break
        op = rng.choice(ops)
        x = rng.choice(b.pool[-3:])
        saved = (len(b.nodes), len(b.inputs), len(b.inits), b.count)
        try:
            out = GENERATORS[op](b, x, b.shapes[x])
            shapes = b.infer([out]) if out else {}
        except Exception:  # noqa: BLE001 - a generator built an invalid node: draw again
            out, shapes = None, {}
        if not out or out not in shapes or shapes[out][0] != F or not shapes[out][1] \
                or int(np.prod(shapes[out][1])) > MAX_ELEMENTS * 4 or 0 in shapes[out][1]:
            del b.nodes[saved[0]:], b.inputs[saved[1]:], b.inits[saved[2]:]
            continue
        b.shapes.update({k: v[1] for k, v in shapes.items()})
        b.pool.append(out)
        drawn.append(op)
    outputs = [b.pool[-1]] + ([b.pool[-2]] if len(b.pool) > 2 and rng.random() < 0.3 else [])
    return b.model(outputs), drawn
