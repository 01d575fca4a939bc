"""Ops that address elements by computed positions: GatherND, ArgMax/ArgMin, CumSum, Trilu,
Range. None is a new basic kind: each is index arithmetic over small constant index vectors
("iotas") in ``elementwise`` ops, plus ``reduce``, ``layout`` and ``gather``. An iota is a
constant of one axis' length (not a mask of the whole tensor), so it costs almost no bytes.
"""
from __future__ import annotations

import math

import numpy as np

from gir.ir.expr import Call, Const, Input, call

from ..basic import contiguous_strides
from ..errors import UnsupportedOpError
from .context import Builder, Node, normalize_axis
from .registry import register

x0, x1, x2, x3 = Input(0), Input(1), Input(2), Input(3)


def unsupported(n: Node, reason: str) -> UnsupportedOpError:
    """A valid node GIR cannot compile (exit 2 on the CLI), found only while decomposing."""
    return UnsupportedOpError(n.model, [(n.name, n.op_type, n.domain or "ai.onnx", n.opset, reason)])


def iota(b: Builder, length: int, axis: int, rank: int, *, start: int = 0, step: str = "iota",
         dtype: str = "int64") -> str:
    """Constant [start, start + length) laid along ``axis`` of a rank-``rank`` shape."""
    shape = [1] * rank
    shape[axis] = length
    return b.constant(np.arange(start, start + length, dtype=np.int64).reshape(shape), dtype, step=step)


def _int(v: int, dtype: str = "int64") -> Const:
    return Const(float(v), dtype)


# ---- GatherND ---------------------------------------------------------------------------------

@register("GatherND")
def gather_nd(b: Builder, n: Node):
    """Each index tuple becomes one flat row number into data viewed as (rows, *rest): one
    elementwise (wrap negatives, scale by row strides, add the batch offset), a sum over the
    tuple axis, then a gather. Constant indices fold to constant rows; rows in a regular
    (affine) pattern are a strided view instead of a gather."""
    data, idx = n.inputs[0], n.inputs[1]
    ds, ishape = b.shape(data), b.shape(idx)
    nb = int(n.attr("batch_dims", 0))
    if len(ishape) < 1 or not 0 <= nb < min(len(ds), len(ishape)):
        raise b.error(f"batch_dims {nb} is out of range for data {list(ds)} and indices {list(ishape)}")
    m = ishape[-1]
    if ishape[:nb] != ds[:nb]:
        raise b.error(f"the first {nb} (batch) dims of indices {list(ishape)} and data {list(ds)} differ")
    if not 1 <= m <= len(ds) - nb:
        raise b.error(f"index tuples of length {m} do not fit data {list(ds)} with batch_dims {nb}")
    dims = ds[nb:nb + m]
    v = b.value(idx)
    if v is not None and v.size:
        bad = (v < -np.asarray(dims)) | (v >= np.asarray(dims))
        if bad.any():
            raise b.error(f"index {v[bad].reshape(-1)[0]} is out of range for data {list(ds)}")
    row_strides = np.asarray(contiguous_strides(dims), np.int64)
    # per tuple component: where(i < 0, i + dim, i) * stride, plus the batch row offset on component 0
    batch_rows = math.prod(ds[:nb])
    offset = np.zeros((batch_rows, m), np.int64)
    offset[:, 0] = np.arange(batch_rows, dtype=np.int64) * math.prod(dims)
    offset = offset.reshape(tuple(ds[:nb]) + (1,) * (len(ishape) - 1 - nb) + (m,))
    i = Call("cast", (x0,), "int64") if b.dtype(idx) != "int64" else x0
    wrapped = call("where", call("lt", i, _int(0)), call("add", i, x1), i)
    # a component out of its own range pushes the row past the table, where the gather reports
    # it, instead of landing silently on another row
    inside = call("and", call("ge", wrapped, _int(0)), call("lt", wrapped, x1))
    rows_total = math.prod(ds[:nb + m])
    expr = call("add", call("where", inside, call("mul", wrapped, x2), _int(rows_total)), x3)
    ins = [idx, b.constant(np.asarray(dims, np.int64), "int64", step="dims"),
           b.constant(row_strides, "int64", step="strides"), b.constant(offset, "int64", step="batch")]
    parts = b.elementwise(expr, ins, step="rowparts", dtype="int64", shape=ishape)
    if m == 1:
        rows = b.view(parts, ishape[:-1], step="rows")
    else:
        rows = b.reduce(parts, "sum", [len(ishape) - 1], False, step="rows")
    table = b.view(data, (math.prod(ds[:nb + m]),) + tuple(ds[nb + m:]), step="table")
    known = b.value(rows)
    strides = None if known is None or b.value(data) is not None else affine_strides(known)
    if strides is not None:  # constant rows in a regular pattern (x[:, None, None, :]): a strided view
        rest = tuple(ds[nb + m:])
        row = math.prod(rest)
        b.layout(table, int(known.reshape(-1)[0]) * row, known.shape + rest,
                 tuple(st * row for st in strides) + contiguous_strides(rest), step="gather", out=n.outputs[0])
        return
    b.emit("gather", [table, rows], {"axis": 0}, step="gather", out=n.outputs[0])


def affine_strides(values: np.ndarray) -> tuple[int, ...] | None:
    """Strides s with values[i] = values[0] + sum_d i_d * s_d for every index i, or None."""
    if values.size == 0:
        return None
    v = values.astype(np.int64)
    base = int(v.reshape(-1)[0])
    strides = tuple(int(v[(0,) * d + (1,) + (0,) * (v.ndim - d - 1)]) - base if size > 1 else 0
                    for d, size in enumerate(v.shape))
    grid = base + sum(np.arange(size, dtype=np.int64).reshape((1,) * d + (size,) + (1,) * (v.ndim - d - 1)) * st
                      for d, (size, st) in enumerate(zip(v.shape, strides)))
    return strides if np.array_equal(np.broadcast_to(grid, v.shape), v) else None


# ---- ArgMax / ArgMin ----------------------------------------------------------------------------

@register("ArgMax", "ArgMin")
def arg_extreme(b: Builder, n: Node):
    """The extreme value along the axis, then the smallest (largest, with select_last_index)
    position holding it: ReduceMin(Where(x == max, iota, N)). NaN ranks below every number
    (onnxruntime compares with > and <, which NaN never passes)."""
    x = n.inputs[0]
    shape = b.shape(x)
    axis = normalize_axis(n.attr("axis", 0), len(shape), n)
    keep = bool(n.attr("keepdims", 1))
    last = bool(n.attr("select_last_index", 0))
    size = shape[axis]
    if size == 0:
        raise b.error(f"{n.op_type} over axis {axis} of size 0 has no answer")
    ranked, hit, ins = x, call("eq", x0, x1), [x]
    if b.dtype(x).startswith("float"):
        # NaN never wins (as in onnxruntime, whose scan compares with > and <): it ranks as
        # -inf (+inf for ArgMin), so an all-NaN row still answers with an index in range
        worst = -math.inf if n.op_type == "ArgMax" else math.inf
        ranked = b.elementwise(call("where", call("isnan", x0), b.c(worst, x), x0), [x], step="nan_loses")
        hit = call("or", hit, call("and", call("isnan", x0), call("eq", x1, x3)))
    extreme = b.reduce(ranked, "max" if n.op_type == "ArgMax" else "min", [axis], True, step="extreme")
    # positions in int32 where they fit: the candidate tensor is the big one when it cannot fuse
    pdt = "int32" if size < 2 ** 31 else "int64"
    ins += [extreme, iota(b, size, axis, len(shape), dtype=pdt)]
    if ranked != x:
        ins.append(b.constant(np.asarray(worst, dtype=np.dtype(b.dtype(x))), b.dtype(x), step="worst"))
    # the NaN map is repeated here, not stored: each elementwise can fuse into its reduce
    cand = b.elementwise(call("where", hit, x2, _int(-1 if last else size, pdt)), ins, step="where",
                         dtype=pdt, shape=shape)
    if pdt == "int64":
        b.reduce(cand, "max" if last else "min", [axis], keep, step="index", out=n.outputs[0])
        return
    index = b.reduce(cand, "max" if last else "min", [axis], keep, step="index")
    b.elementwise(Call("cast", (x0,), "int64"), [index], step="int64", out=n.outputs[0], dtype="int64")


# ---- CumSum -----------------------------------------------------------------------------------

SCAN_DIRECT = 64   # axis lengths scanned in one (i, k) square; longer ones go by blocks
SCAN_BLOCK = 32


@register("CumSum", static=(1,))
def cumsum(b: Builder, n: Node):
    """A prefix sum with no scan kind: see ``scan``."""
    x = n.inputs[0]
    shape = b.shape(x)
    if not shape:
        raise b.error("CumSum of a scalar: the input must have rank >= 1")
    ax = b.const_input(1, "axis")
    if ax.size != 1:
        raise b.error(f"axis must be a scalar, got {ax.tolist()}")
    axis = normalize_axis(int(ax.reshape(-1)[0]), len(shape), n)
    exclusive, reverse = bool(n.attr("exclusive", 0)), bool(n.attr("reverse", 0))
    dt = b.dtype(x)
    if dt not in ("float16", "bfloat16"):
        scan(b, x, axis, exclusive, reverse, out=n.outputs[0])
        return
    # fp16/bf16: the partial sums of the blocked scan are added in fp32 and rounded once at the end
    wide = b.elementwise(Call("cast", (x0,), "float32"), [x], step="fp32", dtype="float32")
    total = scan(b, wide, axis, exclusive, reverse)
    b.elementwise(Call("cast", (x0,), dt), [total], step="half", out=n.outputs[0], dtype=dt)


def scan(b: Builder, x: str, axis: int, exclusive: bool, reverse: bool, *, out: str | None = None) -> str:
    """Prefix sums along ``axis``. A short axis is one square: y[.., i, ..] = sum over k of
    x[.., k, ..] where k is on the chosen side of i (a stride-0 layout repeats the axis as
    (i, k), an index comparison masks it, a sum reduces k): quadratic, but fused and
    memory-bound. A long axis is cut into blocks of SCAN_BLOCK (zero-padded at the end): a
    square scan inside each block plus an exclusive scan of the block totals (recursively),
    so the work stays near N * SCAN_BLOCK per row instead of N * N."""
    shape = b.shape(x)
    size = shape[axis]
    if size <= SCAN_DIRECT:
        return _square_scan(b, x, axis, exclusive, reverse, out=out)
    blocks = -(-size // SCAN_BLOCK)
    padded = blocks * SCAN_BLOCK
    xp = x
    if padded != size:
        pads = tuple((0, padded - size) if i == axis else (0, 0) for i in range(len(shape)))
        xp = b.emit("pad", [x], {"pads": pads, "mode": "constant", "value": 0.0}, step="scan_pad")
    split = shape[:axis] + (blocks, SCAN_BLOCK) + shape[axis + 1:]
    xb = b.view(xp, split, step="scan_blocks")
    inner = _square_scan(b, xb, axis + 1, exclusive, reverse)
    totals = b.reduce(xb, "sum", [axis + 1], True, step="scan_totals")
    before = scan(b, totals, axis, True, reverse)   # what all earlier (later) blocks add
    summed = b.elementwise(call("add", x0, x1), [inner, before], step="scan_add", shape=split)
    flat = b.view(summed, shape[:axis] + (padded,) + shape[axis + 1:], step="scan_unblock")
    if padded == size:
        return b.copy(flat, out, step="scan_out") if out is not None else flat
    strides = contiguous_strides(b.shape(flat))
    return b.layout(flat, 0, shape, strides, step="scan_crop", out=out)


def _square_scan(b: Builder, x: str, axis: int, exclusive: bool, reverse: bool, *, out: str | None = None) -> str:
    shape = b.shape(x)
    rank, size = len(shape), shape[axis]
    strides = contiguous_strides(shape)
    rep_shape = shape[:axis + 1] + (size,) + shape[axis + 1:]
    rep_strides = strides[:axis] + (0, strides[axis]) + strides[axis + 1:]
    rep = b.layout(x, 0, rep_shape, rep_strides, step="repeat")
    out_pos = iota(b, size, axis, rank + 1, step="out_pos")
    in_pos = iota(b, size, axis + 1, rank + 1, step="in_pos")
    keep = {(False, False): "le", (True, False): "lt", (False, True): "ge", (True, True): "gt"}[exclusive, reverse]
    masked = b.elementwise(call("where", call(keep, x2, x1), x0, b.c(0, x)), [rep, out_pos, in_pos],
                           step="mask", dtype=b.dtype(x), shape=rep_shape)
    return b.reduce(masked, "sum", [axis + 1], False, step="sum", out=out)


# ---- Trilu ------------------------------------------------------------------------------------

@register("Trilu")
def trilu(b: Builder, n: Node):
    """Keep x[.., i, j] where j - i >= k (upper) or <= k (lower), else 0: a row iota and a
    column iota compared elementwise (no mask of the whole matrix). A constant k shifts the
    column iota; a run-time k is one more (scalar) input of the same elementwise."""
    x = n.inputs[0]
    shape = b.shape(x)
    rank = len(shape)
    if rank < 2:
        raise b.error(f"Trilu needs rank >= 2, got shape {list(shape)}")
    k_name = n.input(1)
    if k_name is not None and b.tensor(k_name).size != 1:
        raise b.error(f"k must be a scalar, got shape {list(b.shape(k_name))}")
    kv = np.zeros((), np.int64) if k_name is None else b.value(k_name)
    rows = iota(b, shape[-2], rank - 2, rank, step="rows")
    ins = [x, rows]
    if kv is not None:
        ins.append(iota(b, shape[-1], rank - 1, rank, start=-int(kv.reshape(-1)[0]), step="cols_minus_k"))
        shifted = x2
    else:
        ins += [iota(b, shape[-1], rank - 1, rank, step="cols"), b.view(k_name, (), step="k")]
        shifted = call("sub", x2, x3)
    keep = "ge" if n.attr("upper", 1) else "le"
    b.elementwise(call("where", call(keep, shifted, x1), x0, b.c(0, x)), ins, step="trilu",
                  out=n.outputs[0], dtype=b.dtype(x), shape=shape)


# ---- Range ------------------------------------------------------------------------------------

@register("Range", static=(0, 1, 2))
def range_(b: Builder, n: Node):
    """Folded when start, limit and delta are constants; otherwise the output length depends
    on data, which static-shape compilation cannot express."""
    vals = [b.value(n.input(i)) for i in range(3)]
    missing = [name for name, v in zip(("start", "limit", "delta"), vals) if v is None]
    if missing:
        raise unsupported(n, f"{', '.join(missing)} not constant: the output length would depend on "
                             f"run-time data (GIR compiles static shapes)")
    start, limit, delta = (v.reshape(-1)[0] for v in vals)
    if delta == 0:
        raise b.error("delta is 0")
    dtype = b.dtype(n.inputs[0])
    count = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    value = (start + np.arange(count, dtype=vals[0].dtype) * delta).astype(vals[0].dtype)
    b.constant(value, dtype, out=n.outputs[0])
