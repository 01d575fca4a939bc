"""GIR templates: each basic operator -> candidate GIR-Graphs (graph structure x parameters).

A template enumerates every structure and parameter choice that is valid on the target
(capacity checks by the IR validator); rejected choices are reported with their reason.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from gir.frontend.basic import BasicOp, Tensor
from gir.ir.target import Target

from . import concat, elementwise, gather, layout, pad, reduce
from .common import Candidate

GENERATORS = {
    "elementwise": elementwise.generate,
    "reduce": reduce.generate,
    "layout": layout.generate,
    "concat": concat.generate,
    "pad": pad.generate,
    "gather": gather.generate,
}
ALIASES = ("view",)  # no data moves: the output shares the input's storage


class TemplateError(ValueError):
    """No template applies, or none produced a valid candidate."""


@dataclass
class Candidates:
    op: BasicOp
    candidates: list[Candidate]
    rejected: list[tuple[str, dict, str]] = field(default_factory=list)

    @property
    def structures(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.candidates:
            out[c.structure] = out.get(c.structure, 0) + 1
        return out

    def sample(self, count: int, seed: int = 0) -> list[Candidate]:
        """A seeded sample that keeps at least one candidate of every structure."""
        if len(self.candidates) <= count:
            return list(self.candidates)
        first = {c.structure: c for c in reversed(self.candidates)}
        rest = [c for c in self.candidates if c not in first.values()]
        return list(first.values()) + random.Random(seed).sample(rest, count - len(first))


def shape_only(op: BasicOp, tensors: dict[str, Tensor]) -> bool:
    """An empty output, or an empty operand of anything but a concat (which just skips it):
    the op reads no data and its value follows from shapes alone."""
    if any(tensors[t].size == 0 for t in op.outputs):
        return True
    return op.kind != "concat" and any(tensors[t].size == 0 for t in op.inputs)


def candidates(op: BasicOp, tensors: dict[str, Tensor], target: Target) -> Candidates:
    if op.kind in ALIASES:
        return Candidates(op, [])
    if op.kind not in GENERATORS:
        raise TemplateError(f"{op.origin}: no GIR template for basic operator kind {op.kind!r} "
                            f"({op.name}); library ops must be lowered or sent to a library first")
    if shape_only(op, tensors):
        return Candidates(op, [])  # nothing to move: the value is fixed by shapes (folded at compile time)
    rejected: list = []
    found = GENERATORS[op.kind](op, tensors, target, rejected)
    if not found:
        reasons = "; ".join(sorted({r[2] for r in rejected})) or "no structure applies"
        raise TemplateError(f"{op.origin}: no valid GIR-Graph for {op.kind} {op.name} on {target.name}: {reasons}")
    return Candidates(op, found, rejected)


__all__ = ["Candidate", "Candidates", "TemplateError", "candidates", "shape_only", "GENERATORS"]
