"""Sliding windows shared by pooling and by conv lowering: pad resolution, output sizes, and the
window unfold, a single ``layout`` that reads each window of the padded input as extra axes
(N, C, *out, *kernel) so that pooling is an ordinary reduce over the kernel axes."""
from __future__ import annotations

from ..basic import contiguous_strides


def resolve_pads(auto_pad: str, in_sp, kernel, strides, dilations, pads) -> list[int]:
    """Explicit (begin..., end...) pads, ONNX auto_pad rules."""
    nsp = len(in_sp)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nsp):
            out = -(-in_sp[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i])
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
        return begin + end
    if auto_pad == "VALID":
        return [0] * (2 * nsp)
    return list(pads) if pads else [0] * (2 * nsp)


def pool_out_sizes(in_sp, kernel, strides, dilations, pads, ceil_mode: bool) -> list[int]:
    nsp = len(in_sp)
    out = []
    for i in range(nsp):
        span = (kernel[i] - 1) * dilations[i] + 1
        room = in_sp[i] + pads[i] + pads[nsp + i] - span
        if ceil_mode:
            o = -(-room // strides[i]) + 1
            if (o - 1) * strides[i] >= in_sp[i] + pads[i]:  # last window must start inside the input
                o -= 1
        else:
            o = room // strides[i] + 1
        out.append(max(o, 0))
    return out


def window_counts(in_sp, kernel, strides, dilations, pads, out_sp, include_pad: bool):
    """Per spatial axis, how many taps of each output window fall inside the input (or inside
    input + explicit pads when include_pad); the product over axes is the divisor of AveragePool."""
    nsp = len(in_sp)
    counts = []
    for i in range(nsp):
        lo = -pads[i] if include_pad else 0
        hi = in_sp[i] + pads[nsp + i] if include_pad else in_sp[i]
        row = []
        for o in range(out_sp[i]):
            first = o * strides[i] - pads[i]
            row.append(sum(1 for j in range(kernel[i]) if lo <= first + j * dilations[i] < hi))
        counts.append(row)
    return counts


def pad_for_windows(b, x: str, kernel, strides, dilations, pads, out_sp, pad_value: float, *, step: str) -> str:
    """x padded with pad_value by the explicit pads, extended at the end where ceil_mode
    windows run past them (x itself when nothing is padded)."""
    shape = b.shape(x)
    nsp = len(shape) - 2
    in_sp = shape[2:]
    end = []
    for i in range(nsp):
        need = (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 if out_sp[i] else 0
        end.append(max(pads[nsp + i], need - in_sp[i] - pads[i]))
    grow = [(0, 0), (0, 0)] + [(pads[i], end[i]) for i in range(nsp)]
    if not any(p or q for p, q in grow):
        return x
    return b.emit("pad", [x], {"pads": tuple(grow), "mode": "constant", "value": float(pad_value)},
                  step=f"{step}_pad")


def unfold(b, x: str, kernel, strides, dilations, pads, out_sp, pad_value: float, *, step: str) -> str:
    """Layout of shape (N, C, *out_sp, *kernel): every window of the padded input."""
    shape = b.shape(x)
    nsp = len(shape) - 2
    xp = pad_for_windows(b, x, kernel, strides, dilations, pads, out_sp, pad_value, step=step)
    ps = contiguous_strides(b.shape(xp))
    vshape = list(shape[:2]) + list(out_sp) + list(kernel)
    vstrides = [ps[0], ps[1]] + [ps[2 + i] * strides[i] for i in range(nsp)] + \
               [ps[2 + i] * dilations[i] for i in range(nsp)]
    return b.layout(xp, 0, vshape, vstrides, step=step)
