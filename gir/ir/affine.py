"""Affine index expressions over the parallel indices, and the parallel primitive.

Slice offsets and bounds are affine in the parallel indices so that every analysis (bounds,
sync scope, byte counts) can enumerate all units at once with numpy instead of reasoning
symbolically, and so emitters print them as one C expression.

Variables: `u` global unit index, `w` unit index within its block, `b` linear block index,
`b0, b1, ...` block coordinates in the grid (b0 outermost).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

import numpy as np


@dataclass(frozen=True)
class Affine:
    const: int = 0
    terms: tuple = ()  # sorted ((var, coef), ...), no zero coefficients

    @staticmethod
    def of(value) -> "Affine":
        if isinstance(value, Affine):
            return value
        if isinstance(value, (int, np.integer)):
            return Affine(int(value))
        raise TypeError(f"cannot use {value!r} as an affine index")

    def _combine(self, other, sign):
        other = Affine.of(other)
        coeffs = dict(self.terms)
        for name, coef in other.terms:
            coeffs[name] = coeffs.get(name, 0) + sign * coef
        terms = tuple(sorted((k, v) for k, v in coeffs.items() if v))
        return Affine(self.const + sign * other.const, terms)

    def __add__(self, other): return self._combine(other, 1)
    def __radd__(self, other): return self._combine(other, 1)
    def __sub__(self, other): return self._combine(other, -1)
    def __rsub__(self, other): return Affine.of(other)._combine(self, -1)
    def __neg__(self): return self * -1

    def __mul__(self, k):
        if not isinstance(k, (int, np.integer)):
            raise TypeError("affine expressions scale by integers only")
        k = int(k)
        return Affine(self.const * k, tuple((n, c * k) for n, c in self.terms if c * k))

    __rmul__ = __mul__

    @property
    def variables(self) -> set[str]:
        return {name for name, _ in self.terms}

    @property
    def is_const(self) -> bool:
        return not self.terms

    def substitute(self, mapping: dict[str, "Affine"]) -> "Affine":
        """Replace variables by affine expressions (e.g. u -> b * units_per_block + w)."""
        out = Affine(self.const)
        for name, coef in self.terms:
            out = out + (mapping[name] * coef if name in mapping else Affine(0, ((name, coef),)))
        return out

    def split(self, names: set[str]) -> tuple["Affine", "Affine"]:
        """(part over `names`, the rest including the constant)."""
        inside = tuple((n, c) for n, c in self.terms if n in names)
        outside = tuple((n, c) for n, c in self.terms if n not in names)
        return Affine(0, inside), Affine(self.const, outside)

    def eval(self, env: dict):
        """Value for every unit at once: env maps each variable to an array over units."""
        total = self.const
        for name, coef in self.terms:
            total = total + coef * env[name]
        return total

    def __str__(self):
        parts = []
        for name, coef in self.terms:
            parts.append(name if coef == 1 else f"-{name}" if coef == -1 else f"{coef}*{name}")
        if self.const or not parts:
            parts.append(str(self.const))
        text = " + ".join(parts)
        return text.replace("+ -", "- ")


def var(name: str) -> Affine:
    return Affine(0, ((name, 1),))


U, W, B = var("u"), var("w"), var("b")


def block_coord(i: int) -> Affine:
    return var(f"b{i}")


@dataclass(frozen=True)
class ParallelPrimitive:
    """How many parallel units run, grouped into blocks: a grid of blocks of `units_per_block`.
    Units of one block are adjacent (unit u is in block u // units_per_block)."""
    grid: tuple[int, ...]
    units_per_block: int

    def __post_init__(self):
        if not self.grid or any(g < 1 for g in self.grid) or self.units_per_block < 1:
            raise ValueError(f"bad parallel primitive grid={self.grid} units_per_block={self.units_per_block}")

    @property
    def num_blocks(self) -> int:
        return prod(self.grid)

    @property
    def num_units(self) -> int:
        return self.num_blocks * self.units_per_block

    def env(self) -> dict[str, np.ndarray]:
        return _env(self)

    def _build_env(self) -> dict[str, np.ndarray]:
        u = np.arange(self.num_units, dtype=np.int64)
        b = u // self.units_per_block
        env = {"u": u, "w": u % self.units_per_block, "b": b}
        for i, coord in enumerate(np.unravel_index(b, self.grid)):
            env[f"b{i}"] = coord.astype(np.int64)
        return env

    def block_variables(self) -> set[str]:
        return {f"b{i}" for i in range(len(self.grid))}

    def normalize(self, expr: Affine) -> Affine:
        """Rewrite in block coordinates and `w` only, so block and unit parts separate."""
        b = Affine(0)
        for i in range(len(self.grid)):
            b = b + block_coord(i) * prod(self.grid[i + 1:])
        return expr.substitute({"b": b}).substitute({"u": b * self.units_per_block + W})

    def check_variables(self, expr: Affine) -> None:
        allowed = _parallel_indices(len(self.grid))
        if all(name in allowed for name, _ in expr.terms):  # every slice added is checked: no set built
            return
        unknown = expr.variables - allowed
        if unknown:
            raise ValueError(f"index {expr} uses {sorted(unknown)}, not parallel indices of grid {self.grid}")

    def __str__(self):
        return f"grid={self.grid} x {self.units_per_block} units/block ({self.num_units} units)"


@lru_cache(maxsize=None)
def _parallel_indices(rank: int) -> frozenset[str]:
    """Variable names of a grid of `rank` dimensions (built once: every slice added is checked)."""
    return frozenset({"u", "w", "b"} | {f"b{i}" for i in range(rank)})


@lru_cache(maxsize=64)
def _env(prim: ParallelPrimitive) -> dict[str, np.ndarray]:
    """Index arrays per primitive, built once: every analysis asks for them repeatedly."""
    env = prim._build_env()
    for arr in env.values():
        arr.flags.writeable = False
    return env
