"""Data-movement ONNX ops. Anything that is a strided view of one input (Transpose, Slice,
Expand, Tile, Split, Gather by a constant progression) becomes one ``layout`` op with explicit
offset and strides, so later stages see every such op as the same thing; reshapes become
``view`` ops (no data moves)."""
from __future__ import annotations

import math

import numpy as np

from ..basic import contiguous_strides
from .context import Builder, Node, normalize_axes, normalize_axis
from .indexing import affine_strides
from .registry import register


@register("Identity")
def identity(b: Builder, n: Node):
    b.copy(n.inputs[0], n.outputs[0])


@register("Transpose")
def transpose(b: Builder, n: Node):
    x = n.inputs[0]
    shape, strides = b.shape(x), contiguous_strides(b.shape(x))
    perm = n.attr("perm")
    perm = list(reversed(range(len(shape)))) if perm is None else [normalize_axis(p, len(shape), n) for p in perm]
    if sorted(perm) != list(range(len(shape))):
        raise b.error(f"perm {perm} is not a permutation of {len(shape)} axes")
    b.layout(x, 0, [shape[p] for p in perm], [strides[p] for p in perm], step="transpose", out=n.outputs[0])


def slice_range(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX Slice clamping: (first index, element count) on an axis of size ``dim``."""
    if step == 0:
        raise ValueError("slice step 0")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        count = max(0, -(-(end - start) // step))
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        count = max(0, -(-(start - end) // -step))
    return start, count


def strided_slice(b: Builder, x: str, axes, starts, ends, steps, *, step: str, out: str | None) -> str:
    shape = list(b.shape(x))
    strides = list(contiguous_strides(shape))
    offset = 0
    out_shape, out_strides = list(shape), list(strides)
    for ax, s, e, st in zip(axes, starts, ends, steps):
        try:
            first, count = slice_range(int(s), int(e), int(st), shape[ax])
        except ValueError:
            raise b.error("slice step is 0") from None
        offset += first * strides[ax] if count else 0
        out_shape[ax] = count
        out_strides[ax] = strides[ax] * int(st)
    if math.prod(out_shape) == 0:
        offset = 0
    return b.layout(x, offset, out_shape, out_strides, step=step, out=out)


@register("Slice", static=(1, 2, 3, 4))
def slice_(b: Builder, n: Node):
    x = n.inputs[0]
    rank = b.rank(x)
    if n.opset < 10:
        starts, ends = n.attr("starts"), n.attr("ends")
        axes = n.attr("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = [int(v) for v in b.const_input(1, "starts").reshape(-1)]
        ends = [int(v) for v in b.const_input(2, "ends").reshape(-1)]
        a = b.const_input(3, "axes")
        axes = list(range(len(starts))) if a is None else [int(v) for v in a.reshape(-1)]
        s = b.const_input(4, "steps")
        steps = [1] * len(starts) if s is None else [int(v) for v in s.reshape(-1)]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise b.error("starts, ends, axes and steps differ in length")
    axes_n = [normalize_axis(a, rank, n) for a in axes]
    if len(set(axes_n)) != len(axes_n):
        raise b.error(f"repeated axes {axes}")
    strided_slice(b, x, axes_n, starts, ends, steps, step="slice", out=n.outputs[0])


def broadcast_layout(b: Builder, x: str, out_shape, *, step: str, out: str | None = None) -> str:
    """Expand x to out_shape (numpy rules, right-aligned) with stride-0 axes."""
    shape = b.shape(x)
    strides = contiguous_strides(shape)
    lead = len(out_shape) - len(shape)
    st = []
    for i, d in enumerate(out_shape):
        j = i - lead
        st.append(0 if j < 0 or shape[j] == 1 and d != 1 else strides[j])
    return b.layout(x, 0, out_shape, st, step=step, out=out)


@register("Expand", static=(1,))
def expand(b: Builder, n: Node):
    x = n.inputs[0]
    target = [int(v) for v in b.const_input(1, "shape").reshape(-1)]
    try:
        out_shape = np.broadcast_shapes(b.shape(x), tuple(target))
    except ValueError:
        raise b.error(f"cannot expand {b.shape(x)} to {target}") from None
    broadcast_layout(b, x, out_shape, step="expand", out=n.outputs[0])


@register("Tile", static=(1,))
def tile(b: Builder, n: Node):
    x = n.inputs[0]
    shape = b.shape(x)
    reps = [int(v) for v in b.const_input(1, "repeats").reshape(-1)]
    if len(reps) != len(shape) or any(r < 0 for r in reps):
        raise b.error(f"repeats {reps} do not match rank {len(shape)}")
    strides = contiguous_strides(shape)
    vshape, vstrides = [], []
    for r, d, s in zip(reps, shape, strides):
        vshape += [r, d]
        vstrides += [0, s]
    b.layout(x, 0, vshape, vstrides, step="tile", out=n.outputs[0], out_shape=[r * d for r, d in zip(reps, shape)])


@register("Split", static=(1,))
def split(b: Builder, n: Node):
    x = n.inputs[0]
    shape = b.shape(x)
    axis = normalize_axis(n.attr("axis", 0), len(shape), n)
    dim = shape[axis]
    outs = n.outputs
    if n.opset >= 13:
        sizes = b.const_input(1, "split")
        sizes = None if sizes is None else [int(v) for v in sizes.reshape(-1)]
    else:
        sizes = n.attr("split")
    if sizes is None:
        parts = n.attr("num_outputs", len(outs)) if n.opset >= 18 else len(outs)
        if n.opset >= 18 and n.has_attr("num_outputs"):
            chunk = -(-dim // parts)
            sizes = [min(chunk, max(0, dim - chunk * i)) for i in range(parts)]
        else:
            if dim % parts:
                raise b.error(f"cannot split axis of size {dim} into {parts} equal parts")
            sizes = [dim // parts] * parts
    if len(sizes) != len(outs) or sum(sizes) != dim:
        raise b.error(f"split sizes {sizes} do not cover axis {axis} of size {dim} in {len(outs)} outputs")
    start = 0
    for size, out in zip(sizes, outs):
        if out:
            strided_slice(b, x, [axis], [start], [start + size], [1], step=f"part{outs.index(out)}", out=out)
        start += size


@register("Concat")
def concat(b: Builder, n: Node):
    ins = [t for t in n.inputs if t]
    axis = normalize_axis(n.attr("axis"), b.rank(ins[0]), n)
    if len(ins) == 1:
        b.copy(ins[0], n.outputs[0])
        return
    b.emit("concat", ins, {"axis": axis}, step="concat", out=n.outputs[0])


def _pad_check(n: Node):
    mode = n.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        return f"mode={mode!r} is not supported (constant, reflect, edge)"
    return None


@register("Pad", static=(1, 2, 3), check=_pad_check)
def pad(b: Builder, n: Node):
    x = n.inputs[0]
    shape = b.shape(x)
    rank = len(shape)
    mode = n.attr("mode", "constant")
    if n.opset < 11:
        pads = list(n.attr("pads"))
        value = float(n.attr("value", 0.0))
        axes = list(range(rank))
    else:
        pads = [int(v) for v in b.const_input(1, "pads").reshape(-1)]
        cv = b.const_input(2, "constant_value")
        value = 0.0 if cv is None or cv.size == 0 else float(cv.reshape(-1)[0])
        a = b.const_input(3, "axes")
        axes = list(range(rank)) if a is None else [normalize_axis(int(v), rank, n) for v in a.reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise b.error(f"pads {pads} do not match {len(axes)} axes")
    before, after = [0] * rank, [0] * rank
    for i, ax in enumerate(axes):
        before[ax], after[ax] = pads[i], pads[len(axes) + i]
    if mode == "reflect" and any(max(p, q) > 0 and d < 2 for p, q, d in zip(before, after, shape)):
        raise b.error("reflect padding of an axis of size < 2")
    if mode == "reflect" and any(max(p, q) >= d for p, q, d in zip(before, after, shape)):
        raise b.error(f"reflect pads {pads} must be smaller than the padded dimension (input shape {list(shape)})")
    grow = [(max(p, 0), max(q, 0)) for p, q in zip(before, after)]
    out = n.outputs[0]
    crop = any(p < 0 or q < 0 for p, q in zip(before, after))
    if not any(p or q for p, q in grow):
        y = x
    else:
        y = b.emit("pad", [x], {"pads": tuple(grow), "mode": mode, "value": value}, step="pad",
                   out=None if crop else out)
    if crop:  # negative pads remove elements: a slice of the padded tensor
        ys = b.shape(y)
        strided_slice(b, y, list(range(rank)), [max(-p, 0) for p in before],
                      [d - max(-q, 0) for d, q in zip(ys, after)], [1] * rank, step="crop", out=out)
    elif y == x:
        b.copy(x, out)


@register("Gather")
def gather(b: Builder, n: Node):
    """Constant indices are data movement: when they step regularly along each of their own
    dims (an arithmetic progression, or the windows torch's nn.Unfold exports: row i, column j
    -> i * stride + j * dilation) the gather is one strided view of the data, which the fusion
    passes compose and fold like any other layout; otherwise an index gather."""
    x, idx = n.inputs[0], n.inputs[1]
    shape = b.shape(x)
    axis = normalize_axis(n.attr("axis", 0), len(shape), n)
    v = b.value(idx)
    if v is not None and b.value(x) is None and v.size > 0:
        ids = np.where(v < 0, v + shape[axis], v).astype(np.int64)
        if ids.min() < 0 or ids.max() >= shape[axis]:
            bad = v[(ids < 0) | (ids >= shape[axis])].reshape(-1)[0]
            raise b.error(f"index {int(bad)} out of range for axis of size {shape[axis]}")
        steps = affine_strides(ids)
        if steps is not None:
            strides = contiguous_strides(shape)
            vshape = list(shape[:axis]) + list(ids.shape) + list(shape[axis + 1:])
            vstrides = list(strides[:axis]) + [strides[axis] * st for st in steps] + list(strides[axis + 1:])
            b.layout(x, int(ids.reshape(-1)[0]) * strides[axis], vshape, vstrides, step="gather",
                     out=n.outputs[0])
            return
    b.emit("gather", [x, idx], {"axis": axis}, step="gather", out=n.outputs[0])


# ---- views ----------------------------------------------------------------------------------

@register("Reshape", static=(1,))
def reshape(b: Builder, n: Node):
    x = n.inputs[0]
    shape = b.shape(x)
    target = [int(v) for v in b.const_input(1, "shape").reshape(-1)] if n.opset >= 5 else list(n.attr("shape"))
    allowzero = n.attr("allowzero", 0)
    out = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(shape):
                raise b.error(f"shape {target}: 0 at axis {i} has no input dim to copy")
            out.append(shape[i])
        else:
            out.append(d)
    if out.count(-1) > 1:
        raise b.error(f"shape {target} has more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(shape)
        if known == 0 or total % known:
            raise b.error(f"cannot reshape {shape} to {target}")
        out[out.index(-1)] = total // known
    if math.prod(out) != math.prod(shape):
        raise b.error(f"cannot reshape {shape} to {target}")
    b.view(x, out, step="reshape", out=n.outputs[0])


@register("Flatten")
def flatten(b: Builder, n: Node):
    x = n.inputs[0]
    shape = b.shape(x)
    axis = n.attr("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise b.error(f"axis {axis} out of range for rank {len(shape)}")
    if axis < 0:
        axis += len(shape)
    b.view(x, (math.prod(shape[:axis]), math.prod(shape[axis:])), step="flatten", out=n.outputs[0])


def _axes_arg(b: Builder, n: Node):
    if n.opset >= 13:
        v = b.const_input(1, "axes")
        return None if v is None else [int(a) for a in v.reshape(-1)]
    return n.attr("axes")


@register("Squeeze", static=(1,))
def squeeze(b: Builder, n: Node):
    x = n.inputs[0]
    shape = b.shape(x)
    axes = _axes_arg(b, n)
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    axes = normalize_axes(axes, len(shape), n)
    if any(shape[a] != 1 for a in axes):
        raise b.error(f"cannot squeeze axes {list(axes)} of shape {shape}")
    b.view(x, [d for i, d in enumerate(shape) if i not in axes], step="squeeze", out=n.outputs[0])


@register("Unsqueeze", static=(1,))
def unsqueeze(b: Builder, n: Node):
    x = n.inputs[0]
    shape = list(b.shape(x))
    axes = _axes_arg(b, n)
    if axes is None:
        raise b.error("axes are required")
    rank = len(shape) + len(axes)
    axes = normalize_axes(axes, rank, n)
    it = iter(shape)
    b.view(x, [1 if i in axes else next(it) for i in range(rank)], step="unsqueeze", out=n.outputs[0])
