"""Buffers and memory slices: what one parallel unit touches.

The paper's slice is `num` runs of `width` contiguous elements `stride` apart. We keep that
form (`Slice.runs`) and allow more nesting levels (shape + strides) because transposes,
windows and broadcasts (stride 0) need two or more; the first-class 2-level case prints
and emits as the paper's. Per-dimension limits mask the ragged edge of a tensor whose size is
not a multiple of the tile: index i of dimension d is valid only while i < limits[d](unit),
and, where `starts` are given, while i >= starts[d](unit) (the lower edge of a pad or of one
input's part of a concatenation).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from math import prod

import numpy as np

from .affine import Affine
from .dtypes import itemsize
from .target import DRAM, REGISTER, SHARED

LEVELS = (REGISTER, SHARED, DRAM)
_INT = {int}
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
    limits: tuple = ()  # per dimension: Affine upper bound or None; empty = no masking
    starts: tuple = ()  # per dimension: Affine lower bound or None; empty = none

    def __post_init__(self):
        if type(self.offset) is not Affine:
            object.__setattr__(self, "offset", Affine.of(self.offset))
        for name in ("shape", "strides"):  # ints already (most slices are made from another's): kept as given
            seq = getattr(self, name)
            if type(seq) is not tuple or not set(map(type, seq)) <= _INT:
                object.__setattr__(self, name, tuple(int(v) for v in seq))
        if len(self.shape) != len(self.strides):
            raise ValueError(f"slice of {self.buffer}: shape {self.shape} and strides {self.strides} differ in rank")
        if any(s < 1 for s in self.shape):
            raise ValueError(f"slice of {self.buffer}: empty shape {self.shape}")
        for name in ("limits", "starts"):
            bounds = getattr(self, name)
            if not bounds:
                continue
            if len(bounds) != len(self.shape):
                raise ValueError(f"slice of {self.buffer}: {name} must give one bound per dimension")
            bounds = tuple(None if b is None else Affine.of(b) for b in bounds)
            object.__setattr__(self, name, bounds if any(b is not None for b in bounds) else ())

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
        return bool(self.limits or self.starts)

    def unbounded_where_still(self) -> "Slice":
        """This slice without its bounds on dimensions of stride 0 (and extent over 1): every
        element along one has the address of the first, which the other dimensions' bounds keep
        in range. The GPU emitters guard a load without a fill by this (what a masked-off
        register element holds is never read), so a 1x1 conv's weight, read for each of a ragged
        tile's pixels, is the same unguarded load four times a lane, which NVRTC issues once."""
        still = {d for d, (n, st) in enumerate(zip(self.shape, self.strides)) if st == 0 and n > 1}
        if not still or not self.is_masked:
            return self

        def keep(bounds):
            kept = tuple(None if d in still else b for d, b in enumerate(bounds))
            return kept if any(b is not None for b in kept) else ()
        return Slice(self.buffer, self.offset, self.shape, self.strides, keep(self.limits), keep(self.starts))

    @property
    def bounds(self) -> list:
        """Affine expressions a mask depends on (for variable checks)."""
        return [b for b in (*self.limits, *self.starts) if b is not None]

    @cached_property
    def pattern(self) -> np.ndarray:
        """Offsets of the slice's elements from `offset`, in row-major element order."""
        idx = np.indices(self.shape, dtype=np.int64).reshape(len(self.shape), -1)
        return (idx * np.array(self.strides, dtype=np.int64)[:, None]).sum(axis=0)

    @cached_property
    def possibly_valid(self) -> np.ndarray:
        """Per element, row-major: False where a constant bound masks it out for every unit (a
        size-1 tensor tiled a warp wide at stride 0 under `idx < 1` is one element, not 32)."""
        idx = np.indices(self.shape).reshape(len(self.shape), -1)
        keep = np.ones(idx.shape[1], bool)
        for d, b in enumerate(self.limits):
            if b is not None and b.is_const:
                keep &= idx[d] < b.const
        for d, b in enumerate(self.starts):
            if b is not None and b.is_const:
                keep &= idx[d] >= b.const
        keep.setflags(write=False)
        return keep

    def valid_box(self, env: dict) -> tuple[np.ndarray, np.ndarray]:
        """Per unit and dimension, the first and last valid index: (units, rank) arrays. The
        mask is a product of per-dimension conditions, so each unit's valid elements form this
        box (empty where last < first): bounds and counts follow without listing elements."""
        units = env["u"].shape[0]
        first = np.zeros((units, len(self.shape)), np.int64)
        last = np.broadcast_to(np.array(self.shape, np.int64) - 1, (units, len(self.shape))).copy()
        for d, b in enumerate(self.limits):
            if b is not None:
                np.minimum(last[:, d], np.asarray(b.eval(env), np.int64) - 1, out=last[:, d])
        for d, b in enumerate(self.starts):
            if b is not None:
                np.maximum(first[:, d], np.asarray(b.eval(env), np.int64), out=first[:, d])
        return first, last

    def valid_count(self, env: dict) -> int:
        """Valid elements over all units."""
        if not self.is_masked:
            return self.size * env["u"].shape[0]
        first, last = self.valid_box(env)
        return int(np.clip(last - first + 1, 0, None).prod(axis=1).sum())

    def address_range(self, env: dict) -> tuple[int, int] | None:
        """(lowest, highest) valid address over all units, None when nothing is valid. Each
        unit's valid indices form a box, so its extremes are corners of it."""
        low, high = self.unit_ranges(env)
        if not low.size:
            return None
        return int(low.min()), int(high.max())

    def unit_ranges(self, env: dict) -> tuple[np.ndarray, np.ndarray]:
        """Per unit that has a valid element, its lowest and highest valid address (the
        corners of its box of valid indices), as two arrays over those units."""
        units = env["u"].shape[0]
        live = np.ones(units, bool)
        low = high = np.asarray(self.offset.eval(env), np.int64)
        for (first, last), stride in zip(self._index_ranges(env), self.strides):
            live &= last >= first
            low = low + (first if stride >= 0 else last) * stride
            high = high + (last if stride >= 0 else first) * stride
        return tuple(np.broadcast_to(a, (units,))[live] for a in (low, high))

    def units_apart(self, env: dict) -> bool:
        """No two units' valid addresses can coincide: their address ranges do not overlap (a
        sufficient test, from one box per unit, without listing elements)."""
        low, high = self.unit_ranges(env)
        order = np.argsort(low, kind="stable")
        return bool((low[order][1:] > high[order][:-1]).all())

    def _index_ranges(self, env: dict) -> list[tuple]:
        """Per dimension, the first and last valid index: plain ints where the dimension is not
        masked, arrays over units where it is."""
        limits = self.limits or (None,) * len(self.shape)
        starts = self.starts or (None,) * len(self.shape)
        out = []
        for n, limit, start in zip(self.shape, limits, starts):
            first = 0 if start is None else np.maximum(0, np.asarray(start.eval(env), np.int64))
            last = n - 1 if limit is None else np.minimum(n - 1, np.asarray(limit.eval(env), np.int64) - 1)
            out.append((first, last))
        return out

    def addresses(self, env: dict) -> np.ndarray:
        """(units, size) element addresses for every unit."""
        return _cached(self, env, "addresses")

    def valid(self, env: dict) -> np.ndarray:
        """(units, size) mask of the elements inside the tensor's ragged edge."""
        return _cached(self, env, "valid")

    def _addresses(self, env: dict) -> np.ndarray:
        base = np.broadcast_to(np.asarray(self.offset.eval(env), dtype=np.int64), env["u"].shape)
        return base[:, None] + self.pattern[None, :]

    def _valid(self, env: dict) -> np.ndarray:
        units = env["u"].shape[0]
        mask = np.ones((units, self.size), dtype=bool)
        if not self.is_masked:
            return mask
        idx = np.indices(self.shape, dtype=np.int64).reshape(len(self.shape), -1)
        for bounds, below in ((self.limits, True), (self.starts, False)):
            for d, b in enumerate(bounds):
                if b is None:
                    continue
                value = np.broadcast_to(np.asarray(b.eval(env), dtype=np.int64), (units,))[:, None]
                mask &= (idx[d][None, :] < value) if below else (idx[d][None, :] >= value)
        return mask

    def with_buffer(self, buffer: str) -> "Slice":
        return Slice(buffer, self.offset, self.shape, self.strides, self.limits, self.starts)

    def same_pattern(self, other: "Slice") -> bool:
        """Same elements in the same order, whatever the shape that lists them (a (1, 40) row
        and a (40,) vector of one buffer): what merging and the scope fast path compare."""
        if self == other:
            return True
        if self.buffer != other.buffer or self.offset != other.offset:
            return False
        if self.is_masked or other.is_masked:  # a mask compares dimension by dimension
            return self._squeezed() == other._squeezed()
        return np.array_equal(self.pattern, other.pattern)

    def _squeezed(self) -> tuple:
        """(shape, strides, limits, starts) without the unmasked dimensions of extent 1."""
        limits, starts = self.limits or (None,) * len(self.shape), self.starts or (None,) * len(self.shape)
        keep = [d for d, n in enumerate(self.shape) if n != 1 or limits[d] is not None or starts[d] is not None]
        return tuple(tuple(seq[d] for d in keep) for seq in (self.shape, self.strides, limits, starts))

    def __str__(self):
        dims = "x".join(map(str, self.shape))
        strides = ",".join(map(str, self.strides))
        text = f"{self.buffer}[{self.offset}; {dims} @ {strides}]"
        if self.limits:
            text += " if idx < (" + ", ".join("-" if l is None else str(l) for l in self.limits) + ")"
        if self.starts:
            text += " if idx >= (" + ", ".join("-" if l is None else str(l) for l in self.starts) + ")"
        return text


_CACHE: "OrderedDict[tuple, tuple]" = OrderedDict()
_CACHE_LIMIT = 256 << 20
_cache_bytes = 0


def _cached(s: Slice, env: dict, what: str) -> np.ndarray:
    """Addresses and masks are asked for again and again by the analyses and rewrites; keep
    the most recent ones (read-only) up to a memory budget. Entries hold the unit array they
    were computed for, so its id cannot be reused by another primitive while they live."""
    global _cache_bytes
    units = env["u"]
    key = (s.offset, s.shape, s.strides, s.limits, s.starts, id(units), what)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit[1]
    value = s._addresses(env) if what == "addresses" else s._valid(env)
    value.flags.writeable = False
    _CACHE[key] = (units, value)
    _cache_bytes += value.nbytes
    while _cache_bytes > _CACHE_LIMIT and len(_CACHE) > 1:
        _, (_, old) = _CACHE.popitem(last=False)
        _cache_bytes -= old.nbytes
    return value
