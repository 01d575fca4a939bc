"""Convolution calls on device buffers in cuDNN's convention, shared by the GPU launchers that
have a convolution library (cuDNN on NVIDIA) and by the recording stand-in that checks them.

Why a spec of its own (as blas.Gemm is for GEMMs): the device runtime hands a library
convolution to cuDNN as one call on resident pointers; the stand-in executes the same call
with numpy as cuDNN defines it (NC* tensors, cross-correlation, groups read from the weight's
channel count, padding before and after each spatial axis, bias one value per output channel
added last), so a swapped pointer, a wrong pad or group count fails in CI, not on the GPU.
Where no convolution library is there (no cuDNN, hipBLAS on AMD, float64), the engine keeps
the im2col kernel + GEMM path (device_engine.py)."""
from __future__ import annotations

import string
from dataclasses import dataclass
from math import prod

import numpy as np

from gir.ir.dtypes import HALF_NP

CONV_DTYPES = ("float32", "float16", "bfloat16")  # what a library convolution takes (halves accumulate in fp32)


@dataclass(frozen=True)
class Conv:
    """y = conv(x, w) + bias, row-major contiguous tensors at device pointers: x (N, C, *S),
    w (K, C / groups, *R), y (N, K, *O) with O[d] = (S[d] + pre[d] + post[d] - dilation[d] *
    (R[d] - 1) - 1) // stride[d] + 1; `bias` (0: none) points to K values."""
    dtype: str
    x: int
    x_shape: tuple
    w: int
    w_shape: tuple
    y: int
    y_shape: tuple
    pre_pads: tuple
    post_pads: tuple
    strides: tuple
    dilations: tuple
    bias: int = 0

    @property
    def groups(self) -> int:
        return self.x_shape[1] // self.w_shape[1]

    @property
    def shape_key(self) -> tuple:
        """Everything but the pointers: what the library plans once (graph, engine)."""
        return (self.dtype, self.x_shape, self.w_shape, self.y_shape, self.pre_pads, self.post_pads,
                self.strides, self.dilations, bool(self.bias))

    @property
    def flops(self) -> int:
        return 2 * prod(self.y_shape) * prod(self.w_shape[1:])


def conv_call(dtype: str, x: int, x_shape, w: int, w_shape, y: int, y_shape, attrs: dict, bias: int = 0) -> Conv:
    """The Conv of an ONNX Conv (frontend attrs: strides, pads as begins then ends, dilations)."""
    nsp = len(x_shape) - 2
    pads = tuple(attrs["pads"])
    return Conv(dtype, x, tuple(x_shape), w, tuple(w_shape), y, tuple(y_shape), pads[:nsp], pads[nsp:2 * nsp],
                tuple(attrs["strides"]), tuple(attrs["dilations"]), bias)


def check_conv(c: Conv) -> None:
    """The shapes must agree as cuDNN requires (CUDNN_STATUS_BAD_PARAM otherwise)."""
    nsp = len(c.x_shape) - 2
    if c.dtype not in CONV_DTYPES:
        raise ValueError(f"conv: dtype {c.dtype} has no library kernel (takes {', '.join(CONV_DTYPES)})")
    if nsp < 1 or not (len(c.w_shape) == len(c.y_shape) == nsp + 2
                       and len(c.pre_pads) == len(c.post_pads) == len(c.strides) == len(c.dilations) == nsp):
        raise ValueError(f"conv: ranks disagree {c}")
    if c.w_shape[1] < 1 or c.x_shape[1] % c.w_shape[1] or c.w_shape[0] % c.groups or c.y_shape[:2] != (c.x_shape[0], c.w_shape[0]):
        raise ValueError(f"conv: channels disagree (x {c.x_shape}, w {c.w_shape}, y {c.y_shape})")
    for d in range(nsp):
        span = c.x_shape[2 + d] + c.pre_pads[d] + c.post_pads[d] - c.dilations[d] * (c.w_shape[2 + d] - 1) - 1
        if min(c.strides[d], c.dilations[d]) < 1 or min(c.pre_pads[d], c.post_pads[d]) < 0 or span < 0 \
                or c.y_shape[2 + d] != span // c.strides[d] + 1:
            raise ValueError(f"conv: spatial axis {d} disagrees {c}")


def reference_conv(c: Conv, typed_at) -> None:
    """Execute `c` with numpy as cuDNN defines it; `typed_at(ptr, count, dtype)` returns a flat
    array of the device memory at `ptr` (as for blas.reference_gemm); y is written through it."""
    check_conv(c)
    dt = np.dtype(c.dtype)
    acc = np.float32 if dt in HALF_NP else dt
    nsp, groups = len(c.x_shape) - 2, c.groups
    x = typed_at(c.x, prod(c.x_shape), dt).reshape(c.x_shape).astype(acc)
    w = typed_at(c.w, prod(c.w_shape), dt).reshape(c.w_shape).astype(acc)
    x = np.pad(x, [(0, 0), (0, 0)] + list(zip(c.pre_pads, c.post_pads)))
    n, ch = x.shape[:2]
    cg, kg = ch // groups, c.w_shape[0] // groups
    out, taps = c.y_shape[2:], c.w_shape[2:]
    # windows (N, G, C/G, *O, *R): output o, tap r of axis d reads o * stride + r * dilation
    s = x.strides
    windows = np.lib.stride_tricks.as_strided(
        x, (n, groups, cg, *out, *taps),
        (s[0], s[1] * cg, s[1], *[s[2 + d] * c.strides[d] for d in range(nsp)],
         *[s[2 + d] * c.dilations[d] for d in range(nsp)]), writeable=False)
    o, r = "abdefhijlm"[:nsp], string.ascii_uppercase[:nsp]  # n, g, c, k name the other axes
    y = np.einsum(f"ngc{o}{r},gkc{r}->ngk{o}", windows, w.reshape(groups, kg, cg, *taps), optimize=True)
    y = y.reshape(c.y_shape)
    if c.bias:
        y = y + typed_at(c.bias, c.w_shape[0], dt).astype(acc).reshape((1, -1) + (1,) * nsp)
    typed_at(c.y, prod(c.y_shape), dt)[:] = y.reshape(-1).astype(dt)
