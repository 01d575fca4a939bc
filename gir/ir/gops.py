"""gOperators: data movement, sync, and computation on memory slices.

Every gOperator is executed by every parallel unit (SPMD). Within a unit, output element k
belongs to lane (k // vec) % lanes_per_unit: `vec` = 1 is the paper's interleaving (a unit
reading n x 32 contiguous elements is each lane reading n elements 32 apart), `vec` = 4 gives
vector loads, `vec` = group size gives one lane per reduction output. A `uniform` gOperator is
computed by every lane of the unit (its result is replicated), which is what a cooperative
warp reduction leaves behind.

Which lane produces and which lane consumes every element is all the sync-scope analysis and
the interpreter's race check need.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .expr import Expr, count_ops, inputs_of
from .slices import Slice
from .target import SCOPE_NAMES

REDUCE_OPS = ("sum", "max", "min", "prod")
_IDENTITY = {"sum": 0.0, "max": -np.inf, "min": np.inf, "prod": 1.0}


def reduce_identity(op: str, dtype: str = "float32"):
    """Neutral element of a reduction in a given dtype (masked-off elements read as this)."""
    dt = np.dtype(dtype)
    if dt.kind in "iu" and op in ("max", "min"):
        info = np.iinfo(dt)
        return int(info.min if op == "max" else info.max)
    if dt.kind == "b" and op in ("max", "min"):
        return op == "min"
    return _IDENTITY[op]


@dataclass(frozen=True, kw_only=True)
class GOp:
    """Base: subclasses list the slices they read and the one they write."""
    vec: int = 1
    uniform: bool = False

    def reads(self) -> tuple[Slice, ...]:
        raise NotImplementedError

    def writes(self) -> tuple[Slice, ...]:
        raise NotImplementedError

    def lane_of_output(self, k: np.ndarray, lanes: int) -> np.ndarray:
        """Lane computing output element k, or -1 where every lane does (uniform)."""
        if self.uniform:
            return np.full_like(k, -1)
        return (k // self.vec) % lanes

    def source_index(self, read_index: int, k: np.ndarray) -> np.ndarray:
        """Element of reads()[read_index] that output element k consumes (1:1 by default)."""
        return k

    def flops_per_output(self) -> int:
        return 0

    def with_slices(self, mapping: dict[Slice, Slice]) -> "GOp":
        """The same gOperator with some slices replaced (rewrites use this)."""
        raise NotImplementedError

    @property
    def kind(self) -> str:
        return type(self).__name__

    def _lanes_text(self) -> str:
        extra = []
        if self.vec != 1:
            extra.append(f"vec={self.vec}")
        if self.uniform:
            extra.append("uniform")
        return (" {" + ", ".join(extra) + "}") if extra else ""


@dataclass(frozen=True, kw_only=True)
class Move(GOp):
    """Copy between or within memory levels. Masked-off source elements read as `fill`
    (the identity of the reduction that follows), masked-off destination elements are skipped."""
    src: Slice = None
    dst: Slice = None
    fill: float | None = None

    def reads(self): return (self.src,)
    def writes(self): return (self.dst,)

    def with_slices(self, m):
        return replace(self, src=m.get(self.src, self.src), dst=m.get(self.dst, self.dst))

    def __str__(self):
        fill = f" fill={self.fill}" if self.fill is not None else ""
        return f"Move {self.src} -> {self.dst}{fill}{self._lanes_text()}"


@dataclass(frozen=True, kw_only=True)
class Sync(GOp):
    """Makes the writes to `slice` visible at `scope`: no-op (lane), shuffle/syncwarp (unit),
    barrier (block) or kernel boundary (device)."""
    scope: int = 0
    slice: Slice = None

    def reads(self): return ()
    def writes(self): return ()

    def with_slices(self, m):
        return replace(self, slice=m.get(self.slice, self.slice))

    def __str__(self):
        return f"Sync({SCOPE_NAMES[self.scope]}) {self.slice}"


@dataclass(frozen=True, kw_only=True)
class Elementwise(GOp):
    """out[k] = expr(inputs[0][k], inputs[1][k], ...), computed in registers."""
    expr: Expr = None
    inputs: tuple[Slice, ...] = ()
    out: Slice = None
    compute_dtype: str = "float32"

    def __post_init__(self):
        used = inputs_of(self.expr)
        if used and max(used) >= len(self.inputs):
            raise ValueError(f"expression {self.expr} uses input {max(used)} of {len(self.inputs)}")

    def reads(self): return self.inputs
    def writes(self): return (self.out,)

    def flops_per_output(self):
        return count_ops(self.expr)

    def with_slices(self, m):
        return replace(self, inputs=tuple(m.get(s, s) for s in self.inputs), out=m.get(self.out, self.out))

    def __str__(self):
        ins = ", ".join(f"in{i}={s}" for i, s in enumerate(self.inputs))
        return f"Elementwise {self.out} = {self.expr}  where {ins}{self._lanes_text()}"


@dataclass(frozen=True, kw_only=True)
class Reduce(GOp):
    """dst[r] = op over src[r*g : (r+1)*g], g = src.size // dst.size, in element order.
    Masked-off source elements count as the identity. Accumulates in dst's dtype."""
    op: str = "sum"
    src: Slice = None
    dst: Slice = None
    uniform: bool = True

    def __post_init__(self):
        if self.op not in REDUCE_OPS:
            raise ValueError(f"unknown reduction {self.op!r}; expected one of {', '.join(REDUCE_OPS)}")

    @property
    def group(self) -> int:
        return self.src.size // self.dst.size

    def reads(self): return (self.src,)
    def writes(self): return (self.dst,)

    def flops_per_output(self):
        return self.group

    def with_slices(self, m):
        return replace(self, src=m.get(self.src, self.src), dst=m.get(self.dst, self.dst))

    def __str__(self):
        return f"Reduce({self.op}) {self.src} -> {self.dst}{self._lanes_text()}"


@dataclass(frozen=True, kw_only=True)
class Broadcast(GOp):
    """Expand src to dst: `repeat` gives dst[k] = src[k // r], `tile` gives dst[k] = src[k % n]."""
    src: Slice = None
    dst: Slice = None
    mode: str = "repeat"

    def __post_init__(self):
        if self.mode not in ("repeat", "tile"):
            raise ValueError(f"unknown broadcast mode {self.mode!r}")

    def reads(self): return (self.src,)
    def writes(self): return (self.dst,)

    def source_index(self, read_index, k):
        if self.mode == "repeat":
            return k // (self.dst.size // self.src.size)
        return k % self.src.size

    def with_slices(self, m):
        return replace(self, src=m.get(self.src, self.src), dst=m.get(self.dst, self.dst))

    def __str__(self):
        return f"Broadcast({self.mode}) {self.src} -> {self.dst}{self._lanes_text()}"


@dataclass(frozen=True, kw_only=True)
class Gather(GOp):
    """Data movement with one level of indirection (ONNX Gather, embedding lookups):
    dst[k] = src.buffer[src.address(k) + wrap(index[k // g]) * stride], g = dst.size // index.size,
    where wrap adds `extent` to negative indices. `index` is a register slice of integers."""
    src: Slice = None
    index: Slice = None
    dst: Slice = None
    stride: int = 1
    extent: int = 1

    @property
    def group(self) -> int:
        return self.dst.size // self.index.size

    def reads(self): return (self.src, self.index)
    def writes(self): return (self.dst,)

    def source_index(self, read_index, k):
        return k if read_index == 0 else k // self.group

    def with_slices(self, m):
        return replace(self, src=m.get(self.src, self.src), index=m.get(self.index, self.index), dst=m.get(self.dst, self.dst))

    def __str__(self):
        return f"Gather {self.src} + {self.index} * {self.stride} -> {self.dst}{self._lanes_text()}"


COMPUTE = (Elementwise, Reduce, Broadcast)
