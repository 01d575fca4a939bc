"""ConvTranspose as an ordinary ``conv``, so the partitioner treats it like any convolution
(library or GIR by arithmetic intensity).

A transposed convolution with stride s, dilation d and pads p equals a stride-1 convolution,
dilation d, of the input with s-1 zeros interleaved between neighbours and padded by
(k_eff - 1 - p_begin, k_eff - 1 - p_end + output_padding) (negative: cropped), with the kernel's
in/out channels swapped per group and every spatial axis flipped. The zeros are a view + pad +
view (each element gets s-1 zeros after it); a constant kernel is rearranged at compile time.
"""
from __future__ import annotations

import math

from ..basic import contiguous_strides
from .context import Builder, Node
from .registry import register


def _check(n: Node):
    if n.attr("auto_pad", "NOTSET") not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"auto_pad={n.attr('auto_pad')!r} is not defined"
    return None


def _pads(b: Builder, n: Node, in_sp, keff, strides, out_pad) -> list[int]:
    """(begin..., end...) pads, from pads, output_shape or auto_pad as ONNX defines them."""
    nsp = len(in_sp)
    auto = n.attr("auto_pad", "NOTSET")
    output_shape = n.attr("output_shape")
    if output_shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [d * s for d, s in zip(in_sp, strides)]
    if output_shape is not None:
        output_shape = list(output_shape)[-nsp:]
        begin, end = [], []
        for i in range(nsp):
            total = strides[i] * (in_sp[i] - 1) + out_pad[i] + keff[i] - int(output_shape[i])
            small, big = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
        return begin + end
    if auto == "VALID" or n.attr("pads") is None:
        return [0] * (2 * nsp)
    pads = [int(p) for p in n.attr("pads")]
    if len(pads) != 2 * nsp:
        raise b.error(f"pads {pads} needs {2 * nsp} values")
    return pads


def _interleave_zeros(b: Builder, x: str, axis: int, stride: int) -> str:
    """x with stride-1 zeros between neighbours along ``axis``: (n) -> ((n-1)*stride + 1)."""
    shape = list(b.shape(x))
    count = shape[axis]
    if stride == 1 or count <= 1:
        return x
    v = b.view(x, shape[:axis + 1] + [1] + shape[axis + 1:], step=f"unit{axis}")
    pads = tuple((0, stride - 1) if i == axis + 1 else (0, 0) for i in range(len(shape) + 1))
    p = b.emit("pad", [v], {"pads": pads, "mode": "constant", "value": 0.0}, step=f"zeros{axis}")
    wide = shape[:axis] + [count * stride] + shape[axis + 1:]
    flat = b.view(p, wide, step=f"spread{axis}")
    keep = shape[:axis] + [(count - 1) * stride + 1] + shape[axis + 1:]
    return b.layout(flat, 0, keep, contiguous_strides(wide), step=f"trim{axis}")


def _pad_or_crop(b: Builder, x: str, begin, end) -> str:
    shape = b.shape(x)
    nsp = len(begin)
    grow = tuple((0, 0) for _ in shape[:2]) + tuple((max(lo, 0), max(hi, 0)) for lo, hi in zip(begin, end))
    if any(lo or hi for lo, hi in grow):
        x = b.emit("pad", [x], {"pads": grow, "mode": "constant", "value": 0.0}, step="pad")
    if min(list(begin) + list(end)) < 0:
        shape = b.shape(x)
        strides = contiguous_strides(shape)
        offset = sum(max(-lo, 0) * strides[2 + i] for i, lo in enumerate(begin))
        keep = list(shape[:2]) + [shape[2 + i] - max(-begin[i], 0) - max(-end[i], 0) for i in range(nsp)]
        if min(keep) <= 0:
            raise b.error(f"pads leave an empty output ({keep})")
        x = b.layout(x, offset, keep, strides, step="crop")
    return x


def _flipped_kernel(b: Builder, w: str, group: int) -> str:
    """(C_in, C_out/g, *k) -> (C_out, C_in/g, *k), every spatial axis reversed."""
    ws = b.shape(w)
    cin, cout_g, k = ws[0], ws[1], ws[2:]
    grouped = (group, cin // group, cout_g) + tuple(k)
    st = contiguous_strides(grouped)
    offset = sum((d - 1) * s for d, s in zip(k, st[3:]))
    shape = (group, cout_g, cin // group) + tuple(k)
    strides = (st[0], st[2], st[1]) + tuple(-s for s in st[3:])
    g = b.view(w, grouped, step="w_groups")
    t = b.layout(g, offset, shape, strides, step="w_flip")
    return b.view(t, (group * cout_g, cin // group) + tuple(k), step="w_conv")


@register("ConvTranspose", check=_check)
def conv_transpose(b: Builder, n: Node):
    x, w, bias = n.inputs[0], n.inputs[1], n.input(2)
    xs, ws = b.shape(x), b.shape(w)
    if len(xs) < 3 or len(ws) != len(xs):
        raise b.error(f"X {list(xs)} and W {list(ws)} are not N-d conv operands")
    nsp = len(xs) - 2
    group = int(n.attr("group", 1))
    if group < 1 or xs[1] != ws[0] or ws[0] % group:
        raise b.error(f"X {list(xs)} and W {list(ws)} do not agree with group={group}")
    kernel = list(n.attr("kernel_shape", ws[2:]))
    if kernel != list(ws[2:]):
        raise b.error(f"kernel_shape {kernel} does not match W of shape {list(ws)}")
    strides = [int(s) for s in n.attr("strides", [1] * nsp)]
    dilations = [int(d) for d in n.attr("dilations", [1] * nsp)]
    out_pad = [int(p) for p in n.attr("output_padding", [0] * nsp)]
    if min(strides + dilations) < 1 or len(strides) != nsp or len(dilations) != nsp or len(out_pad) != nsp:
        raise b.error(f"strides {strides}, dilations {dilations}, output_padding {out_pad} do not fit {nsp} axes")
    keff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    pads = _pads(b, n, xs[2:], keff, strides, out_pad)
    out_sp = [strides[i] * (xs[2 + i] - 1) + out_pad[i] + keff[i] - pads[i] - pads[nsp + i] for i in range(nsp)]
    if min(out_sp) < 1 or math.prod(xs) == 0:
        raise b.error(f"output spatial shape {out_sp} is empty")
    y = x
    for i, s in enumerate(strides):
        y = _interleave_zeros(b, y, 2 + i, s)
    y = _pad_or_crop(b, y, [keff[i] - 1 - pads[i] for i in range(nsp)],
                     [keff[i] - 1 - pads[nsp + i] + out_pad[i] for i in range(nsp)])
    wt = _flipped_kernel(b, w, group)
    attrs = {"strides": (1,) * nsp, "pads": (0,) * (2 * nsp), "dilations": tuple(dilations), "group": group}
    ins = [y, wt] + ([bias] if bias is not None else [])
    b.emit("conv", ins, attrs, step="conv", out=n.outputs[0])
