"""Drop masks that hold for every unit (a tensor whose size is a multiple of the tile), so
identical loads compare equal and fills that can never apply disappear."""
from __future__ import annotations

from gir.ir import Move
from gir.ir.validate import tidy_slice

from .query import slices_of


def tidy(g) -> int:
    """Rewrite every gOperator in place; returns how many slices lost their masks."""
    dropped, tidied = 0, {}
    for node, op in g.ops():
        mapping = {s: tidy_slice(s, g.prim) for s in slices_of(op)}
        changed = {k: v for k, v in mapping.items() if k != v}
        if not changed:
            continue
        dropped += len(changed)
        new = op.with_slices(changed)
        if isinstance(new, Move) and new.fill is not None and not new.src.is_masked:
            new = Move(src=new.src, dst=new.dst, vec=new.vec, uniform=new.uniform)
        tidied[node] = new
    g.replace_all(tidied)
    return dropped
