"""Resize (opset 10-19) and the deprecated Upsample (7-9) as one separable pass per resized axis.

Every Resize mode is linear in the data along each axis: output position o reads a few input
positions idx[o, k] with constant weights w[o, k] (nearest: one tap of weight 1; linear: 2;
cubic: 4; antialias: a wider footprint). Shapes are static, so the taps are computed here once
and each axis becomes ``gather`` (constant indices) then, unless nearest, a weighted
``reduce`` sum over the taps. The tap rules follow the ONNX specification (and onnx's
reference implementation, including its tie-breaking between neighbours).
"""
from __future__ import annotations

import math

import numpy as np

from gir.ir.expr import Call, Input, call

from .context import Builder, Node, normalize_axis
from .indexing import unsupported
from .registry import register

MODES = ("nearest", "linear", "cubic")
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
              "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _check(n: Node):
    mode = n.attr("mode", "nearest")
    if mode not in MODES:
        return f"mode={mode!r} is not supported ({', '.join(MODES)})"
    ctm = n.attr("coordinate_transformation_mode", "half_pixel")
    if ctm not in TRANSFORMS:
        return f"coordinate_transformation_mode={ctm!r} is not supported"
    if n.attr("nearest_mode", "round_prefer_floor") not in NEAREST_MODES:
        return f"nearest_mode={n.attr('nearest_mode')!r} is not supported"
    if n.attr("antialias", 0) and mode == "nearest":
        return "antialias=1 with mode='nearest' is not defined"
    if n.attr("keep_aspect_ratio_policy", "stretch") not in ("stretch", "not_larger", "not_smaller"):
        return f"keep_aspect_ratio_policy={n.attr('keep_aspect_ratio_policy')!r} is not supported"
    return None


# ---- per-axis taps ------------------------------------------------------------------------------

def _source_coords(ctm: str, out_d: int, in_d: int, scale: float, roi) -> np.ndarray:
    """x_original for every output index (ONNX coordinate_transformation_mode). As the
    specification and onnxruntime have it, align_corners, pytorch_half_pixel and
    tf_crop_and_resize divide by the integer output length (onnx's reference implementation
    uses scale * length_original, which differs when that is not an integer)."""
    y = np.arange(out_d, dtype=np.float64)
    if ctm == "align_corners":
        return np.zeros(out_d) if out_d == 1 else y * (in_d - 1) / (out_d - 1)
    if ctm == "asymmetric":
        return y / scale
    if ctm == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(out_d, (hi - lo) * (in_d - 1) / 2) if out_d == 1 else y * (hi - lo) * (in_d - 1) / (out_d - 1)
        return x + lo * (in_d - 1)
    if ctm == "pytorch_half_pixel":
        return np.full(out_d, -0.5) if out_d == 1 else (y + 0.5) / scale - 0.5
    if ctm == "half_pixel":
        return (y + 0.5) / scale - 0.5
    offset = in_d / 2 * (1 - out_d / (scale * in_d))  # half_pixel_symmetric
    return offset + (y + 0.5) / scale - 0.5


def _coeffs(mode: str, ratio: float, scale: float, n: Node) -> np.ndarray:
    antialias = bool(n.attr("antialias", 0))
    if mode == "nearest":
        if ratio == 1:
            return np.array([0.0, 1.0])
        nm = n.attr("nearest_mode", "round_prefer_floor")
        if n.opset < 11:  # Resize-10 has no nearest_mode: onnxruntime floors up-, ceils downsampling
            nm = "ceil" if scale < 1 else "floor"
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}[nm]
        return np.array([0.0, 1.0]) if up else np.array([1.0, 0.0])
    if mode == "linear":
        if not antialias:
            return np.array([1 - ratio, ratio])
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)
        c = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * s), 0, 1)
        return c / c.sum()
    a = float(n.attr("cubic_coeff_a", -0.75))
    if not antialias:
        r, q = ratio, 1 - ratio
        return np.array([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                         ((a + 2) * r - (a + 3)) * r * r + 1,
                         ((a + 2) * q - (a + 3)) * q * q + 1,
                         ((a * (q + 1) - 5 * a) * (q + 1) + 8 * a) * (q + 1) - 4 * a])
    s = min(scale, 1.0)

    def cubic(x):
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a if x < 2 else 0.0

    start = int(np.floor(-2 / s) + 1)
    c = np.array([cubic(s * (i - ratio)) for i in range(start, 2 - start)])
    return c / c.sum()


def axis_taps(n: Node, mode: str, in_d: int, out_d: int, scale: float, roi):
    """(indices [out_d, k] clamped into the axis, weights [out_d, k], extrapolated [out_d] or None)."""
    ctm = n.attr("coordinate_transformation_mode", "half_pixel") if n.opset >= 11 else "asymmetric"
    x = _source_coords(ctm, out_d, in_d, scale, roi)
    base = np.floor(x)
    ratios = np.where(x == base, 1.0, x - base)
    coeffs = np.stack([_coeffs(mode, float(r), scale, n) for r in ratios])
    k = coeffs.shape[1]
    pad = math.ceil(k / 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if k % 2 == 0:
        start = p + np.where(frac == 0, -(k // 2), -(k // 2) + 1)
    else:
        start = p + np.where(frac <= 0.5, -((k - 1) // 2), -((k - 1) // 2) + 1)
    idx = start[:, None] + np.arange(k)[None, :] - pad
    if n.attr("exclude_outside", 0):
        coeffs = np.where((idx < 0) | (idx >= in_d), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    extrapolated = ((x < 0) | (x > in_d - 1)) if ctm == "tf_crop_and_resize" else None
    return np.clip(idx, 0, in_d - 1), coeffs, extrapolated


# ---- sizes ----------------------------------------------------------------------------------

def _targets(b: Builder, n: Node, shape) -> tuple[list[float], list[int], list[int], np.ndarray | None]:
    """(scale per axis, output size per axis, resized axes, roi [2*rank] or None)."""
    rank = len(shape)
    if n.op_type == "Upsample" and n.input(1) is None:  # Upsample-7: scales is an attribute
        scales, sizes, roi = np.asarray(n.attr("scales", []), np.float32), None, None
    elif n.opset < 11:
        scales, sizes, roi = b.const_input(1, "scales"), None, None
    else:
        roi = b.const_input(1, "roi")
        scales, sizes = b.const_input(2, "scales"), b.const_input(3, "sizes")
        if scales is not None and scales.size == 0:
            scales = None
        if sizes is not None and sizes.size == 0:
            sizes = None
    if (scales is None) == (sizes is None):
        raise b.error("exactly one of scales and sizes must be given")
    axes = n.attr("axes")
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank, n) for a in axes]
    given = (scales if scales is not None else sizes).reshape(-1)
    if len(given) != len(axes):
        raise b.error(f"{'scales' if sizes is None else 'sizes'} has {len(given)} values for {len(axes)} axes")
    if roi is not None and roi.size:
        roi = roi.astype(np.float64).reshape(-1)
        if roi.size != 2 * len(axes):
            raise b.error(f"roi has {roi.size} values for {len(axes)} axes")
        full = np.array([0.0] * rank + [1.0] * rank)
        for i, a in enumerate(axes):
            full[a], full[rank + a] = roi[i], roi[len(axes) + i]
        roi = full
    else:
        roi = None
    scale, out = [1.0] * rank, list(shape)
    if sizes is None:
        for a, s in zip(axes, given):
            if not s > 0:
                raise b.error(f"scales must be positive, got {scales.tolist()}")
            scale[a], out[a] = float(s), int(np.float64(s) * shape[a])
    else:
        for a, s in zip(axes, given):
            scale[a], out[a] = int(s) / shape[a] if shape[a] else 1.0, int(s)
        policy = n.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scale[a] for a in axes)
            for a in axes:
                scale[a], out[a] = s, int(s * shape[a] + 0.5)
    if min(out, default=1) < 0:
        raise b.error(f"output shape {out} is negative")
    return scale, out, axes, roi


def _upsample_check(n: Node):
    mode = n.attr("mode", "nearest")
    return None if mode in ("nearest", "linear", "bilinear") else f"mode={mode!r} is not supported"


@register("Upsample", static=(1,), check=_upsample_check)
def upsample(b: Builder, n: Node):
    """Upsample (opset 7-9, deprecated): Resize-10's semantics (asymmetric coordinates)."""
    mode = n.attr("mode", "nearest")
    _resize(b, n, "linear" if mode == "bilinear" else mode)


@register("Resize", static=(1, 2, 3), check=_check)
def resize(b: Builder, n: Node):
    _resize(b, n, n.attr("mode", "nearest"))


def _resize(b: Builder, n: Node, mode: str):
    x, final = n.inputs[0], n.outputs[0]
    shape = b.shape(x)
    dt = b.dtype(x)
    if mode != "nearest" and dt not in ("float32", "float16", "bfloat16", "float64"):
        raise unsupported(n, f"mode={mode!r} on {dt} data is not supported (float types only)")
    if n.opset >= 11 and n.attr("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize" \
            and b.value(n.input(1)) is None:
        raise b.error("tf_crop_and_resize needs roi")
    scale, out, axes, roi = _targets(b, n, shape)
    rank = len(shape)
    todo = [a for a in axes if not (math.isclose(scale[a], 1.0) and out[a] == shape[a]
                                     and (roi is None or (roi[a] == 0 and roi[rank + a] == 1)))]
    if 0 in out:
        b.constant(np.zeros(out), dt, step="empty", out=final)
        return
    if not todo:
        b.copy(x, final)
        return
    y = x
    for i, a in enumerate(todo):
        last = i == len(todo) - 1
        y = _resize_axis(b, n, y, a, mode, shape[a], out[a], scale[a],
                         None if roi is None else (roi[a], roi[rank + a]), final if last else None)


def _resize_axis(b: Builder, n: Node, x: str, axis: int, mode: str, in_d: int, out_d: int, scale: float,
                 roi, out: str | None) -> str:
    idx, w, extrapolated = axis_taps(n, mode, in_d, out_d, scale, roi)
    rank = b.rank(x)
    one_hot = np.all((w == 0) | (w == 1), axis=1) & (np.count_nonzero(w, axis=1) == 1)
    needs_mask = extrapolated is not None and extrapolated.any()
    if one_hot.all():  # nearest (or integer-aligned linear): a pure gather
        pick = idx[np.arange(out_d), np.argmax(w, axis=1)]
        ids = b.constant(pick.astype(np.int64), "int64", step=f"idx{axis}")
        y = b.emit("gather", [x, ids], {"axis": axis}, step=f"gather{axis}", out=None if needs_mask else out)
    else:
        ids = b.constant(idx.astype(np.int64), "int64", step=f"idx{axis}")
        taps = b.emit("gather", [x, ids], {"axis": axis}, step=f"taps{axis}")
        wt = b.constant(w.reshape((out_d, w.shape[1]) + (1,) * (rank - axis - 1)), b.dtype(x), step=f"w{axis}")
        prod = b.elementwise(call("mul", Input(0), Input(1)), [taps, wt], step=f"weigh{axis}")
        y = b.reduce(prod, "sum", (axis + 1,), False, step=f"sum{axis}", out=None if needs_mask else out)
    if needs_mask:
        mask = b.constant(extrapolated.reshape((out_d,) + (1,) * (rank - axis - 1)), "bool", step=f"outside{axis}")
        value = float(n.attr("extrapolation_value", 0.0))
        y = b.elementwise(Call("where", (Input(0), b.c(value, y), Input(1))), [mask, y], step=f"extrapolate{axis}",
                          dtype=b.dtype(y), out=out, shape=b.shape(y))
    return y
