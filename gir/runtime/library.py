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
    """The op's result with its epilogue (gir/fusion/epilogue.py): a matmul's bias input, then
    each step (an activation, evaluated from the formula the frontend gives the ONNX op, or a
    residual input added), computed in the output's type as the GIR kernels did."""
    out_dtype = np_dtype(tensors[op.outputs[0]].dtype)
    a = op.attrs
    if op.kind == "conv":
        y = conv(args[0], args[1], args[2] if len(args) > 2 else None, a["strides"], a["pads"], a["dilations"], a["group"])
        y = y.astype(out_dtype, copy=False)
    elif op.kind == "matmul" and a.get("bias"):
        core = BasicOp(op.name, op.kind, op.inputs[:2], op.outputs, {}, op.origin)
        y = execute_op(core, tensors, args[:2])
        y = (y + args[2].reshape(-1).astype(out_dtype, copy=False)).astype(out_dtype, copy=False)
    else:
        y = execute_op(op, tensors, args[:2] if op.kind == "matmul" else args)
    return apply_epilogue(op, y, args, tensors)


def apply_epilogue(op: BasicOp, y: np.ndarray, args: list[np.ndarray], tensors: dict) -> np.ndarray:
    steps = op.attrs.get("epilogue", ())
    if not steps:
        return y
    if op.kind == "conv" and any(k == "residual" and int(a) < 3 for k, a, _ in steps):
        raise ValueError(f"{op.name}: a conv's residual input must come after its bias (input 2)")
    from gir.fusion.epilogue import activation_expr
    from gir.ir.expr import evaluate
    dtype = tensors[op.outputs[0]].dtype
    for kind, alpha, beta in steps:
        if kind == "residual":
            y = (y + args[int(alpha)].reshape(y.shape)).astype(y.dtype, copy=False)
        else:
            y = np.asarray(evaluate(activation_expr(kind, alpha, beta), [y], dtype)).astype(y.dtype, copy=False)
    return y


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
