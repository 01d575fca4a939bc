"""Buffers and memory slices: what one parallel unit touches.

The paper's slice is `num` runs of `width` contiguous elements `stride` apart. We keep that
form (`Slice.runs`) and allow more nesting levels (shape + strides) because transposes,
windows and broadcasts (stride 0) need two or more; the first-class 2-level case prints
and emits as the paper's. Per-dimension limits mask the ragged edge of a tensor whose size is
not a multiple of the tile: index i of dimension d is valid only while i < limits[d](unit).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import prod

import numpy as np

from .affine import Affine
from .dtypes import itemsize
from .target import DRAM, REGISTER, SHARED

LEVELS = (REGISTER, SHARED, DRAM)
ROLES = ("input", "output", "temp", "const")


@dataclass(frozen=True)
class Buffer:
    """Storage at one level. `size` counts elements per device (dram), per block (shared)
    or per unit (register). DRAM buffers carry the tensor shape they hold."""
    name: str
    level: str
    size: int
    dtype: str
    role: str = "temp"
    shape: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"buffer {self.name}: unknown memory level {self.level!r}")
        if self.role not in ROLES:
            raise ValueError(f"buffer {self.name}: unknown role {self.role!r}")
        if self.size < 1:
            raise ValueError(f"buffer {self.name}: size must be positive, got {self.size}")
        itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.size * itemsize(self.dtype)


@dataclass(frozen=True)
class Slice:
    buffer: str
    offset: Affine
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    limits: tuple = ()  # per dimension: Affine bound or None; empty = no masking

    def __post_init__(self):
        object.__setattr__(self, "offset", Affine.of(self.offset))
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        if len(self.shape) != len(self.strides):
            raise ValueError(f"slice of {self.buffer}: shape {self.shape} and strides {self.strides} differ in rank")
        if any(s < 1 for s in self.shape):
            raise ValueError(f"slice of {self.buffer}: empty shape {self.shape}")
        if self.limits:
            if len(self.limits) != len(self.shape):
                raise ValueError(f"slice of {self.buffer}: limits must give one bound per dimension")
            limits = tuple(None if lim is None else Affine.of(lim) for lim in self.limits)
            object.__setattr__(self, "limits", limits if any(l is not None for l in limits) else ())

    @classmethod
    def runs(cls, buffer: str, offset, num: int, width: int, stride: int | None = None,
             num_limit=None, width_limit=None) -> "Slice":
        """The paper's form: `num` runs of `width` contiguous elements, `stride` apart."""
        limits = (num_limit, width_limit) if num_limit is not None or width_limit is not None else ()
        return cls(buffer, offset, (num, width), (width if stride is None else stride, 1), limits)

    @classmethod
    def flat(cls, buffer: str, offset, size: int, limit=None) -> "Slice":
        return cls(buffer, offset, (size,), (1,), (limit,) if limit is not None else ())

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def is_masked(self) -> bool:
        return bool(self.limits)

    @cached_property
    def pattern(self) -> np.ndarray:
        """Offsets of the slice's elements from `offset`, in row-major element order."""
        idx = np.indices(self.shape, dtype=np.int64).reshape(len(self.shape), -1)
        return (idx * np.array(self.strides, dtype=np.int64)[:, None]).sum(axis=0)

    def addresses(self, env: dict) -> np.ndarray:
        """(units, size) element addresses for every unit."""
        base = np.broadcast_to(np.asarray(self.offset.eval(env), dtype=np.int64), env["u"].shape)
        return base[:, None] + self.pattern[None, :]

    def valid(self, env: dict) -> np.ndarray:
        """(units, size) mask of the elements inside the tensor's ragged edge."""
        units = env["u"].shape[0]
        mask = np.ones((units, self.size), dtype=bool)
        if not self.limits:
            return mask
        idx = np.indices(self.shape, dtype=np.int64).reshape(len(self.shape), -1)
        for d, lim in enumerate(self.limits):
            if lim is None:
                continue
            bound = np.broadcast_to(np.asarray(lim.eval(env), dtype=np.int64), (units,))
            mask &= idx[d][None, :] < bound[:, None]
        return mask

    def with_buffer(self, buffer: str) -> "Slice":
        return Slice(buffer, self.offset, self.shape, self.strides, self.limits)

    def same_pattern(self, other: "Slice") -> bool:
        """Same elements in the same order (used by read-after-write merging)."""
        return (self.buffer == other.buffer and self.offset == other.offset and self.limits == other.limits
                and np.array_equal(self.pattern, other.pattern))

    def __str__(self):
        dims = "x".join(map(str, self.shape))
        strides = ",".join(map(str, self.strides))
        text = f"{self.buffer}[{self.offset}; {dims} @ {strides}]"
        if self.limits:
            text += " if idx < (" + ", ".join("-" if l is None else str(l) for l in self.limits) + ")"
        return text
