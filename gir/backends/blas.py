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
# Library-op epilogues (gir/fusion/epilogue.py) the GPU library path runs: none yet. cuBLASLt has
# bias, ReLU and GELU epilogues (nvmath-python's MatmulEpilogue), not wired into Gemm and the
# recording stand-in; the GPU presets declare no `library_epilogues`, so their plans keep those
# ops in GIR kernels, and the device engine refuses a plan that carries one.
EPILOGUE_KINDS: frozenset = frozenset()


@dataclass(frozen=True)
class Gemm:
    """D = alpha * op(A) @ op(B) + beta * D, column-major as cuBLAS: op(A) is m x k, op(B)
    k x n, D m x n. A matrix stored untransposed has element (i, j) at ptr + (i + j * ld) *
    itemsize; with `transa`, A is stored k x m and op(A) = A^T (likewise B). `batch` products,
    each operand `stride_*` elements after the one before (0: every product reads the same)."""
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

    @property
    def shape_key(self) -> tuple:
        """Everything but the pointers: what a library plans (descriptors, algorithm) once."""
        return (self.dtype, self.transa, self.transb, self.m, self.n, self.k, self.lda, self.stride_a,
                self.ldb, self.stride_b, self.ldc, self.stride_c, self.batch, self.alpha, self.beta)

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
                     beta: float = 0.0, c_batch: tuple = ()) -> list[Gemm]:
    """The Gemm calls computing row-major, contiguous C = A @ B with numpy's matmul rules
    (1-D operands, broadcast batch dims, also against `c_batch`, C's own batch dims); `beta`
    = 1 adds the product to C. Batch dims whose strides compose are one strided batch; the
    rest are separate calls (one per index)."""
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
                          sc if count > 1 else 0, count, 1.0, beta))
    return calls


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
    out = typed_at(g.c, operand_extent(g.m, g.n, g.ldc, g.stride_c, g.batch), dt)
    a = a.transpose(0, 2, 1) if g.transa else a
    b = b.transpose(0, 2, 1) if g.transb else b
    d = g.alpha * (a.astype(acc) @ b.astype(acc))
    c = _matrix(out, g.m, g.n, g.ldc, g.stride_c, g.batch)
    if g.beta:
        d = d + g.beta * c.astype(acc)
    if g.batch > 1 and g.stride_c < operand_extent(g.m, g.n, g.ldc, 0, 1):
        raise ValueError(f"gemm: output batches overlap (stride_c={g.stride_c})")
    s = out.itemsize
    np.lib.stride_tricks.as_strided(out, c.shape, (g.stride_c * s, s, g.ldc * s))[...] = d.astype(dt)

