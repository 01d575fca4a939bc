"""Library ops on the host (numpy's BLAS), for the native engines. A convolution is a sum over
kernel offsets of batched GEMMs, one per group, on strided views of the padded input. Why not
the reference's im2col + tensordot: its im2col buffer is k times the input (SAR-DRN's 3x3
convs at 256x256: 150 MB each) and it loops over groups in Python (depthwise convs)."""
from __future__ import annotations

import numpy as np

from gir.frontend.basic import BasicOp
from gir.frontend.reference import execute_op
from gir.ir.dtypes import HALF_NP, np_dtype


def run_library_op(op: BasicOp, tensors: dict, args: list[np.ndarray]) -> np.ndarray:
    if op.kind != "conv":
        return execute_op(op, tensors, args)
    a = op.attrs
    y = conv(args[0], args[1], args[2] if len(args) > 2 else None, a["strides"], a["pads"], a["dilations"], a["group"])
    return y.astype(np_dtype(tensors[op.outputs[0]].dtype), copy=False)


def conv(x, w, b, strides, pads, dilations, group) -> np.ndarray:
    """ONNX Conv (N-d, NCHW..., explicit pads); fp16 accumulates in fp32."""
    nsp = x.ndim - 2
    n, m, cpg = x.shape[0], w.shape[0], w.shape[1]
    acc = np.float32 if x.dtype in HALF_NP else x.dtype
    if any(pads):
        x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nsp + i]) for i in range(nsp)])
    kernel = w.shape[2:]
    out_sp = [(x.shape[2 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(nsp)]
    wg = w.astype(acc, copy=False).reshape(group, m // group, cpg, -1)  # (G, M/G, C/G, taps)
    y = np.zeros((n, group, m // group, int(np.prod(out_sp))), acc)
    depthwise = cpg == 1 and m == group
    for tap, offset in enumerate(np.ndindex(*kernel)):
        window = x[(slice(None), slice(None), *[slice(o * d, o * d + s * (size - 1) + 1, s)
                                               for o, d, s, size in zip(offset, dilations, strides, out_sp)])]
        xs = window.astype(acc, copy=False).reshape(n, group, cpg, -1)  # (N, G, C/G, positions)
        if depthwise:
            y[:, :, 0] += wg[None, :, 0, 0, tap, None] * xs[:, :, 0]
        else:
            y += wg[:, :, :, tap] @ xs
    y = y.reshape(n, m, *out_sp)
    if b is not None:
        y += b.astype(acc, copy=False).reshape((1, m) + (1,) * nsp)
    return y
