"""Reductions made innermost: an elementwise op whose only reader is a reduction over middle
axes is re-expressed over its index space permuted so that the reduced axes come last (and,
where one of them indexes the taps of an unfolded window, split into the window's own
dimensions).

Why: the templates fuse an elementwise producer into a reduction when both walk the same
index order with the reduced axes innermost (a lowered matmul or depthwise conv). RedNet's
involution multiplies a per-pixel kernel with a 7x7 unfold and sums over the 49 taps, which sit
between the channels and the pixels; in ONNX order the product (40 MB a layer) goes through DRAM
and the unfold (49 shifted slices joined by a concat) is written expanded. Reordered, each
operand is a strided layout of its source (the 49 taps, split 7x7, are one affine view of the
padded input), composition and folding read them in place, and product and sum are one kernel.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import product
from math import prod

from gir.frontend.basic import BasicGraph, BasicOp, Tensor
from gir.templates.common import broadcast_strides

from .compose import MOVEMENT, Composition, compose, single_view


def innermost_reductions(graph: BasicGraph, subgraphs: list[list[BasicOp]]) -> tuple[BasicGraph, list[list[BasicOp]]]:
    """The graph and subgraphs with every eligible elementwise -> reduce pair reordered."""
    tensors, ops = dict(graph.tensors), list(graph.ops)
    readers = graph.consumers()
    out_subgraphs = []
    for sub in subgraphs:
        comp = None
        producer = {t: op for op in sub for t in op.outputs}
        new_sub = list(sub)
        for r in sub:
            e = producer.get(r.inputs[0]) if r.kind == "reduce" else None
            if e is None or e.kind != "elementwise" or not _eligible(graph, e, r, producer, readers):
                continue
            comp = comp or compose(graph, sub)
            layout = _layout(graph, comp, e, r)
            if layout is None:
                continue
            e_ops, r_ops = _rewrite(graph, tensors, e, r, *layout)
            for old, new in ((e, e_ops), (r, r_ops)):
                ops[_index(ops, old):_index(ops, old) + 1] = new
                new_sub[_index(new_sub, old):_index(new_sub, old) + 1] = new
        out_subgraphs.append(new_sub)
    return replace(graph, tensors=tensors, ops=ops), out_subgraphs


def _index(ops: list[BasicOp], op: BasicOp) -> int:
    return next(i for i, o in enumerate(ops) if o is op)


def _eligible(graph: BasicGraph, e: BasicOp, r: BasicOp, producer, readers) -> bool:
    """The product feeds only the reduction, the reduced axes are not innermost already, and
    no operand comes from a computing op of the subgraph (that op would then be read in another
    order than it writes, and lose its own fusion)."""
    rank = len(graph.tensors[e.outputs[0]].shape)
    axes = r.attrs["axes"]
    if axes == tuple(range(rank - len(axes), rank)) or e.outputs[0] in graph.outputs:
        return False
    if [op.name for op in readers.get(e.outputs[0], [])] != [r.name]:
        return False
    return all(producer.get(t) is None or producer[t].kind in MOVEMENT for t in e.inputs)


def _layout(graph: BasicGraph, comp: Composition, e: BasicOp, r: BasicOp):
    """(new shape, operand strides) with the reduced axes last, each split into factors where
    that makes every composed operand one affine view of its source; None if no split does."""
    shape = graph.tensors[e.outputs[0]].shape
    axes = r.attrs["axes"]
    kept = [d for d in range(len(shape)) if d not in axes]
    for split in product(*(_factorings(shape[d]) for d in axes)):
        new_shape = tuple(shape[d] for d in kept) + tuple(f for fs in split for f in fs)
        strides = [_strides(graph.tensors[t].shape, shape, kept, axes, split) for t in e.inputs]
        if all(t not in comp.contents or single_view(comp.contents[t], new_shape, s) is not None
               for t, s in zip(e.inputs, strides)):
            return new_shape, strides
    return None


def _factorings(n: int) -> list[tuple[int, ...]]:
    """n whole first, then as two factors (a window's rows x columns)."""
    return [(n,)] + [(a, n // a) for a in range(2, n) if n % a == 0]


def _strides(operand: tuple, shape: tuple, kept, axes, split) -> tuple[int, ...]:
    """The operand's broadcast strides over the kept axes, then over each reduced axis's factors."""
    own = broadcast_strides(operand, shape)
    out = [own[d] for d in kept]
    for d, factors in zip(axes, split):
        out += [own[d] * prod(factors[i + 1:]) for i in range(len(factors))]
    return tuple(out)


def _rewrite(graph: BasicGraph, tensors: dict, e: BasicOp, r: BasicOp, shape, strides):
    """(ops replacing e: layouts of its operands and the product over `shape`; ops replacing r:
    the reduction of the last axes, then a reshape where r kept the reduced dimensions)."""
    e_ops, operands = [], []
    for i, (name, s) in enumerate(zip(e.inputs, strides)):
        view = f"{e.outputs[0]}/reordered_in{i}"
        tensors[view] = Tensor(view, shape, tensors[name].dtype)
        e_ops.append(BasicOp(f"{e.name}/reorder_in{i}", "layout", [name], [view],
                             {"offset": 0, "shape": shape, "strides": s}, e.origin))
        operands.append(view)
    product_name = f"{e.outputs[0]}/reordered"
    tensors[product_name] = Tensor(product_name, shape, tensors[e.outputs[0]].dtype)
    e_ops.append(replace(e, inputs=operands, outputs=[product_name]))
    kept = len(graph.tensors[e.outputs[0]].shape) - len(r.attrs["axes"])
    attrs = r.attrs | {"axes": tuple(range(kept, len(shape))), "keepdims": False}
    out = tensors[r.outputs[0]]
    if not r.attrs["keepdims"]:
        return e_ops, [replace(r, inputs=[product_name], attrs=attrs)]
    flat = f"{out.name}/reordered"
    tensors[flat] = Tensor(flat, shape[:kept], out.dtype)
    return e_ops, [replace(r, inputs=[product_name], outputs=[flat], attrs=attrs),
                   BasicOp(f"{r.name}/reorder_out", "view", [flat], [out.name], {}, r.origin)]
