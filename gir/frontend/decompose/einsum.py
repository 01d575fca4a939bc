"""Einsum as transposes, views, reduce sums, elementwise products and matmuls.

Operands are contracted left to right. Before each pairwise step, an index that no later operand
and not the output needs is summed out of the operand holding it alone (``reduce``). The two
operands are then laid out as (batch..., free..., contracted) and (batch..., contracted, free...)
and multiplied with one ``matmul`` (batch dimensions broadcast as matmul does), or, with nothing
to contract, multiplied elementwise with broadcasting (outer and Hadamard products).
Explicit and implicit outputs, ``...``, and an index repeated within one operand (a diagonal,
``ii->i``: one strided layout) are supported.
"""
from __future__ import annotations

import math

from gir.ir.expr import Input, call

from ..basic import contiguous_strides
from .context import Builder, Node
from .registry import register

ELLIPSIS = "..."


def _split(equation: str) -> tuple[list[str], str | None]:
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    return lhs.split(","), (rhs if "->" in eq else None)


def _letters(term: str) -> list[str]:
    return [c for c in term.replace(ELLIPSIS, "")]


def _check(n: Node):
    eq = n.attr("equation")
    if not isinstance(eq, str) or not eq:
        return "the equation attribute is missing"
    terms, out = _split(eq)
    if len(terms) != len([t for t in n.inputs]):
        return f"equation {eq!r} names {len(terms)} operands for {len(n.inputs)} inputs"
    for term in terms + ([out] if out is not None else []):
        letters = _letters(term)
        if term.count(ELLIPSIS) > 1 or "." in term.replace(ELLIPSIS, "") or not all(c.isalpha() for c in letters):
            return f"equation {eq!r} is malformed"
        if term is out and len(set(letters)) != len(letters):
            return f"equation {eq!r} repeats an index in the output"
    if out is not None and not set(_letters(out)) <= {c for t in terms for c in _letters(t)}:
        return f"equation {eq!r}: an output index appears in no input"
    return None


def _expand(b: Builder, terms, out, ranks) -> tuple[list[list[str]], list[str]]:
    """Index lists per operand and for the output, ``...`` replaced by digit names aligned from
    the right (so broadcast ellipsis dimensions share names)."""
    width = 0
    expanded = []
    for term, rank in zip(terms, ranks):
        letters = _letters(term)
        if ELLIPSIS in term:
            k = rank - len(letters)
            if k < 0:
                raise b.error(f"term {term!r} has more indices than its operand's rank {rank}")
            width = max(width, k)
            head, tail = term.split(ELLIPSIS)
            expanded.append(list(head) + [str(i) for i in reversed(range(k))] + list(tail))
        else:
            if len(letters) != rank:
                raise b.error(f"term {term!r} has {len(letters)} indices for an operand of rank {rank}")
            expanded.append(letters)
    dots = [str(i) for i in reversed(range(width))]
    if out is None:
        counts = {}
        for t in expanded:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out_idx = dots + sorted(c for c, k in counts.items() if k == 1 and not c.isdigit())
    else:
        head, _, tail = out.partition(ELLIPSIS)
        out_idx = list(head) + (dots if ELLIPSIS in out else []) + list(tail)
    return expanded, out_idx


def _permute(b: Builder, t: str, idx: list[str], order: list[str], step: str) -> str:
    shape, strides = b.shape(t), contiguous_strides(b.shape(t))
    perm = [idx.index(c) for c in order]
    return b.layout(t, 0, [shape[p] for p in perm], [strides[p] for p in perm], step=step)


def _sum_out(b: Builder, t: str, idx: list[str], drop) -> tuple[str, list[str]]:
    axes = [i for i, c in enumerate(idx) if c in drop]
    if not axes:
        return t, idx
    return b.reduce(t, "sum", axes, False, step="sum"), [c for c in idx if c not in drop]


def _sizes(b: Builder, t: str, idx: list[str]) -> dict[str, int]:
    return dict(zip(idx, b.shape(t)))


def _contract(b: Builder, a: str, ia: list[str], c: str, ic: list[str], keep: set) -> tuple[str, list[str]]:
    a, ia = _sum_out(b, a, ia, {x for x in ia if x not in keep and x not in ic})
    c, ic = _sum_out(b, c, ic, {x for x in ic if x not in keep and x not in ia})
    sa, sc = _sizes(b, a, ia), _sizes(b, c, ic)
    batch = [x for x in ia if x in ic and x in keep]
    con = [x for x in ia if x in ic and x not in keep]
    m = [x for x in ia if x not in ic]
    n = [x for x in ic if x not in ia]
    for x in batch + con:
        if sa[x] != sc[x] and 1 not in (sa[x], sc[x]):
            raise b.error(f"index {x!r} has sizes {sa[x]} and {sc[x]}")
    if any(sa[x] != sc[x] for x in con):  # a broadcast (size-1) contracted index: sum it out first
        ones = {x for x in con if sa[x] == 1}
        a, ia = _sum_out(b, a, ia, ones)
        c, ic = _sum_out(b, c, ic, {x for x in con if sc[x] == 1 and x not in ones})
        return _contract(b, a, ia, c, ic, keep)
    if not con:  # outer / Hadamard product: broadcast multiply
        at = _permute(b, a, ia, batch + m, "lhs")
        ct = _permute(b, c, ic, batch + n, "rhs")
        at = b.view(at, [sa[x] for x in batch + m] + [1] * len(n), step="lhs_bcast")
        ct = b.view(ct, [sc[x] for x in batch] + [1] * len(m) + [sc[x] for x in n], step="rhs_bcast")
        return b.elementwise(call("mul", Input(0), Input(1)), [at, ct], step="mul"), batch + m + n
    mm, nn, kk = math.prod(sa[x] for x in m), math.prod(sc[x] for x in n), math.prod(sa[x] for x in con)
    at = b.view(_permute(b, a, ia, batch + m + con, "lhs"), [sa[x] for x in batch] + [mm, kk], step="lhs_mat")
    ct = b.view(_permute(b, c, ic, batch + con + n, "rhs"), [sc[x] for x in batch] + [kk, nn], step="rhs_mat")
    y = b.emit("matmul", [at, ct], {}, step="matmul")
    out_batch = list(b.shape(y)[:len(batch)])
    return b.view(y, out_batch + [sa[x] for x in m] + [sc[x] for x in n], step="unflatten"), batch + m + n


def _diagonal(b: Builder, t: str, idx: list[str]) -> tuple[str, list[str]]:
    """An index repeated within one operand (``ii->i``) reads the diagonal: one axis whose
    stride is the sum of the repeated axes' strides, a single layout."""
    shape, strides = b.shape(t), contiguous_strides(b.shape(t))
    uniq = list(dict.fromkeys(idx))
    sizes = {c: {shape[i] for i, x in enumerate(idx) if x == c} for c in uniq}
    if any(len(v) > 1 for v in sizes.values()):
        raise b.error(f"a repeated index spans axes of different sizes: {dict(zip(idx, shape))}")
    st = [sum(strides[i] for i, x in enumerate(idx) if x == c) for c in uniq]
    return b.layout(t, 0, [sizes[c].pop() for c in uniq], st, step="diagonal"), uniq


@register("Einsum", check=_check)
def einsum(b: Builder, n: Node):
    terms, out = _split(n.attr("equation"))
    ops = list(n.inputs)
    idx, out_idx = _expand(b, terms, out, [b.rank(t) for t in ops])
    for k, (t, it) in enumerate(zip(ops, idx)):
        if len(set(it)) != len(it):
            ops[k], idx[k] = _diagonal(b, t, it)
    t, it = ops[0], idx[0]
    for k in range(1, len(ops)):
        keep = set(out_idx).union(*[set(i) for i in idx[k + 1:]])
        t, it = _contract(b, t, it, ops[k], idx[k], keep)
    t, it = _sum_out(b, t, it, {x for x in it if x not in out_idx})
    shape, strides = b.shape(t), contiguous_strides(b.shape(t))
    perm = [it.index(c) for c in out_idx]
    b.layout(t, 0, [shape[p] for p in perm], [strides[p] for p in perm], step="output", out=n.outputs[0])
