"""GEMM calls on device buffers in the vendor libraries' convention, shared by every GPU
launcher (cuBLASLt, hipBLAS) and by the recording stand-in that checks them in CI.

Why one spec in the libraries' own convention: the device runtime turns ONNX's row-major
matmuls and convolutions into these calls, and the argument order, transposes and leading
dimensions are where such code goes wrong. The stand-in (harness/recording.py) executes a
Gemm exactly as cuBLAS defines it (column-major, `ld` >= rows, strided batches), so a swapped
operand or a wrong leading dimension fails in CI instead of on the first GPU.

Row-major to column-major: a row-major R x C matrix is the column-major C x R matrix (its
transpose) with ld = C, so row-major C = A @ B is column-major C^T = B^T @ A^T: cuBLAS's
m = N, n = M, k = K, its A is our B (ld N) and its B is our A (ld K), no transposes.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from gir.ir.dtypes import HALF_NP

DTYPES = ("float32", "float16", "bfloat16", "float64")  # what the library path takes (fp16/bf16 accumulate in fp32)
# cuBLASLt's epilogues (cublasLtEpilogue_t): D = act(alpha op(A) op(B) + beta C + bias), the bias
# one value per row of the column-major D (broadcast over its columns), added before the
# activation. Keyed by (activation, has bias). GELU is the tanh form: on an H100 (2026-11-25)
# tests/test_gpu_epilogue.py found GELU_BIAS nearer it than the erf form and within 1e-3 of it;
# no target declares it, since 1e-3 does not show the zoo's 1e-4 against onnxruntime.
LT_EPILOGUE = {("", False): 1, ("relu", False): 2, ("", True): 4, ("relu", True): 6,
               ("gelu_tanh", False): 32, ("gelu_tanh", True): 36}
# What a cuBLASLt call runs after a library matmul (gir/fusion/epilogue.py), as the cuda presets
# declare it (`Target.extra["library_epilogues"]`): exact only in cuBLASLt's order, bias, then a
# residual (C with beta = 1), then one activation; bias and residual in the output's dtype.
# bfloat16 since an H200 run (2026-11-26, tests/test_gpu_epilogue.py): bias + residual + ReLU
# in one bf16 call came within 0.49 ulp of the float64 result rounded once (fp16: 0.50).
# Convolutions (cuDNN, or im2col + GEMM) take no epilogues: their bias is cuDNN's or a rank-1 GEMM.
CUBLASLT_EPILOGUES = {"kinds": ("bias", "relu", "residual"), "dtypes": ("bfloat16", "float16", "float32"),
                      "ops": ("matmul",), "order": ("bias", "residual", "activation")}
# The kinds each library can run (a launcher's `epilogue_kinds`): hipBLAS has no epilogues.
LIBRARY_EPILOGUE_KINDS = {"cublaslt": frozenset({"bias", "relu", "residual", "gelu_tanh"}), "hipblas": frozenset()}


@dataclass(frozen=True)
class Gemm:
    """D = act(alpha * op(A) @ op(B) + beta * C + bias), column-major as cuBLAS(Lt): op(A) is
    m x k, op(B) k x n, D m x n at `c`. A matrix stored untransposed has element (i, j) at
    ptr + (i + j * ld) * itemsize; with `transa`, A is stored k x m and op(A) = A^T (likewise
    B). `batch` products, each operand `stride_*` elements after the one before (0: every
    product reads the same). C is at `c_in` (0: D itself) with D's layout, as cuBLASLt allows;
    `bias` (0: none) points to m values, one per row of D, the same for every column and batch;
    `activation` ("", "relu", "gelu_tanh") is applied last (cuBLASLt's epilogue)."""
    dtype: str
    transa: bool
    transb: bool
    m: int
    n: int
    k: int
    a: int
    lda: int
    stride_a: int
    b: int
    ldb: int
    stride_b: int
    c: int
    ldc: int
    stride_c: int
    batch: int = 1
    alpha: float = 1.0
    beta: float = 0.0
    c_in: int = 0
    bias: int = 0
    activation: str = ""

    @property
    def epilogue(self) -> int:
        """cublasLtEpilogue_t of this call (DEFAULT = 1 without bias or activation)."""
        return LT_EPILOGUE[(self.activation, bool(self.bias))]

    @property
    def shape_key(self) -> tuple:
        """Everything but the pointers: what a library plans (descriptors, algorithm) once. The
        epilogue kind is part of it; the bias pointer is not (set on the descriptor per call)."""
        return (self.dtype, self.transa, self.transb, self.m, self.n, self.k, self.lda, self.stride_a,
                self.ldb, self.stride_b, self.ldc, self.stride_c, self.batch, self.alpha, self.beta, self.epilogue)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch


def _batch_strides(shape: tuple, batch: tuple) -> list[int]:
    """Element strides of a contiguous operand's batch dims against the broadcast batch shape
    (0 where the operand has size 1 or lacks the dim)."""
    mat = int(np.prod(shape[-2:]))
    own = shape[:-2]
    strides, step = [], mat
    for size in reversed(own):
        strides.append(step)
        step *= size
    strides = list(reversed(strides))
    own_padded = (1,) * (len(batch) - len(own)) + tuple(own)
    strides = [0] * (len(batch) - len(own)) + strides
    return [0 if s == 1 else st for s, st in zip(own_padded, strides)]


def row_major_matmul(dtype: str, a: int, a_shape, b: int, b_shape, c: int, itemsize: int,
                     beta: float = 0.0, c_batch: tuple = (), c_in: int = 0, bias: int = 0,
                     activation: str = "") -> list[Gemm]:
    """The Gemm calls computing row-major, contiguous C = A @ B with numpy's matmul rules
    (1-D operands, broadcast batch dims, also against `c_batch`, C's own batch dims); `beta`
    = 1 adds the product to C, or to `c_in` (a tensor of C's shape; C is then written only).
    Batch dims whose strides compose are one strided batch; the rest are separate calls (one
    per index). `bias` (values along C's last axis) and `activation` become the calls'
    epilogue: column-major D is C^T, so C's last axis is D's rows (m) as cuBLASLt's bias wants
    (`bias_rows` says when that holds)."""
    a_shape = (1,) + tuple(a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b_shape = tuple(b_shape) + (1,) if len(b_shape) == 1 else tuple(b_shape)
    m, k = a_shape[-2:]
    n = b_shape[-1]
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2], tuple(c_batch)))
    c_shape = batch + (m, n)
    dims = [d for d in zip(batch, _batch_strides(a_shape, batch), _batch_strides(b_shape, batch),
                           _batch_strides(c_shape, batch)) if d[0] != 1]
    merged = [list(d) for d in dims]  # [size, stride_a, stride_b, stride_c], outermost first
    # merge from the inside out: dims i-1 (outer) and i (inner) join when every stride composes
    i = len(merged) - 1
    while i > 0:
        outer, inner = merged[i - 1], merged[i]
        if all(so == si * inner[0] for so, si in zip(outer[1:], inner[1:])):
            merged[i - 1:i + 1] = [[outer[0] * inner[0], *inner[1:]]]
        i -= 1
    inner = merged.pop() if merged else [1, 0, 0, 0]
    count, sa, sb, sc = inner
    if count > 1 and sb == 0 and sa == m * k and sc == m * n:
        m, count, sa, sc = m * count, 1, 0, 0  # B shared, A and C contiguous: one taller product
    calls = []
    for index in itertools.product(*[range(d[0]) for d in merged]):
        oa = sum(i * d[1] for i, d in zip(index, merged))
        ob = sum(i * d[2] for i, d in zip(index, merged))
        oc = sum(i * d[3] for i, d in zip(index, merged))
        # column-major C^T (n x m) = B^T (n x k, ld n) @ A^T (k x m, ld k)
        calls.append(Gemm(dtype, False, False, n, m, k, b + ob * itemsize, n, sb if count > 1 else 0,
                          a + oa * itemsize, k, sa if count > 1 else 0, c + oc * itemsize, n,
                          sc if count > 1 else 0, count, 1.0, beta, c_in + oc * itemsize if c_in else 0,
                          bias, activation))
    return calls


def bias_rows(b_shape) -> bool:
    """Whether a bias along the last axis of row-major A @ B lands on the rows of the Gemms'
    column-major D (one value per row, cuBLASLt's bias): D = C^T has m = B's last dim, which
    is C's last axis unless B is 1-D (then C's last axis is A's rows, D's columns)."""
    return len(tuple(b_shape)) >= 2


def _matrix(memory: np.ndarray, rows: int, cols: int, ld: int, stride: int, batch: int) -> np.ndarray:
    """(batch, rows, cols) column-major view of a typed flat array starting at the operand."""
    s = memory.itemsize
    return np.lib.stride_tricks.as_strided(memory, (batch, rows, cols), (stride * s, s, ld * s), writeable=False)


def operand_extent(rows: int, cols: int, ld: int, stride: int, batch: int) -> int:
    """Elements from an operand's pointer to one past the last it touches."""
    if rows == 0 or cols == 0 or batch == 0:
        return 0
    return (batch - 1) * stride + (cols - 1) * ld + rows


def check_gemm(g: Gemm) -> None:
    """cuBLAS's own argument rules (CUBLAS_STATUS_INVALID_VALUE otherwise)."""
    if g.dtype not in DTYPES:
        raise ValueError(f"gemm: dtype {g.dtype} has no library kernel (takes {', '.join(DTYPES)})")
    if (g.activation, bool(g.bias)) not in LT_EPILOGUE:
        raise ValueError(f"gemm: no cuBLASLt epilogue {g.activation!r}{' with bias' if g.bias else ''}")
    if min(g.m, g.n, g.k, g.batch) < 1 or min(g.stride_a, g.stride_b, g.stride_c) < 0:
        raise ValueError(f"gemm: bad sizes {g}")
    rows_a, rows_b = (g.k if g.transa else g.m), (g.n if g.transb else g.k)
    for name, ld, rows in (("lda", g.lda, rows_a), ("ldb", g.ldb, rows_b), ("ldc", g.ldc, g.m)):
        if ld < max(1, rows):
            raise ValueError(f"gemm: {name}={ld} < {rows} rows of its column-major matrix")


def reference_gemm(g: Gemm, typed_at) -> None:
    """Execute `g` with numpy as cuBLAS defines it. `typed_at(ptr, count, dtype)` returns a
    flat array of `count` elements of the device memory at `ptr` (raising if that is not
    inside one allocation); D is written through it."""
    check_gemm(g)
    dt = np.dtype(g.dtype)
    acc = np.float32 if dt in HALF_NP else dt
    ra, ca = (g.k, g.m) if g.transa else (g.m, g.k)
    rb, cb = (g.n, g.k) if g.transb else (g.k, g.n)
    a = _matrix(typed_at(g.a, operand_extent(ra, ca, g.lda, g.stride_a, g.batch), dt), ra, ca, g.lda, g.stride_a, g.batch)
    b = _matrix(typed_at(g.b, operand_extent(rb, cb, g.ldb, g.stride_b, g.batch), dt), rb, cb, g.ldb, g.stride_b, g.batch)
    extent = operand_extent(g.m, g.n, g.ldc, g.stride_c, g.batch)
    out = typed_at(g.c, extent, dt)
    a = a.transpose(0, 2, 1) if g.transa else a
    b = b.transpose(0, 2, 1) if g.transb else b
    d = g.alpha * (a.astype(acc) @ b.astype(acc))
    c = _matrix(typed_at(g.c_in, extent, dt) if g.c_in else out, g.m, g.n, g.ldc, g.stride_c, g.batch)
    if g.beta:
        d = d + g.beta * c.astype(acc)
    if g.bias:  # one value per row of D, every column and batch
        d = d + typed_at(g.bias, g.m, dt).astype(acc)[None, :, None]
    if g.activation == "relu":
        d = np.maximum(d, 0)
    elif g.activation == "gelu_tanh":
        d = 0.5 * d * (1 + np.tanh(np.sqrt(2 / np.pi) * (d + 0.044715 * d ** 3)))
    if g.batch > 1 and g.stride_c < operand_extent(g.m, g.n, g.ldc, 0, 1):
        raise ValueError(f"gemm: output batches overlap (stride_c={g.stride_c})")
    s = out.itemsize
    np.lib.stride_tricks.as_strided(out, c.shape, (g.stride_c * s, s, g.ldc * s))[...] = d.astype(dt)

