"""op_type -> decomposition. One entry per supported ONNX op (default domain only).

``static`` lists the input positions whose values GIR needs at compile time (shapes, axes,
pads, BatchNormalization statistics): the loader demands they be constant, and the onnx
backend test binds graph inputs found there. ``check`` rejects attribute combinations GIR
does not implement before any work is done, so they are reported with the other
unsupported nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Decomposition:
    op_type: str
    fn: Callable
    static: frozenset = field(default_factory=frozenset)
    check: Callable | None = None   # (Node) -> reason string, or None when supported


REGISTRY: dict[str, Decomposition] = {}


def register(*op_types: str, static=(), check=None):
    def deco(fn):
        for op_type in op_types:
            if op_type in REGISTRY:
                raise ValueError(f"{op_type} registered twice")
            REGISTRY[op_type] = Decomposition(op_type, fn, frozenset(static), check)
        return fn
    return deco
