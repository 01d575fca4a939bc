"""Elementwise template: n-ary with numpy broadcasting (stride-0 operands), fp16 computed in fp32."""
from __future__ import annotations

from gir.frontend.basic import compute_dtype, contiguous_strides
from gir.ir import Elementwise
from gir.ir.dtypes import compute as widened
from gir.ir.expr import split

from .common import broadcast_strides, coalesce, unique_views
from .pointwise import pointwise_candidates, register_result


def generate(op, tensors, target, rejected, views=None):
    """`views`: per input (tensor, offset, strides over the output's index space); by default
    each input itself with numpy broadcasting. A planner passes views to read a layout's source
    directly instead of a materialised copy."""
    out = tensors[op.outputs[0]]
    shape = out.shape or (1,)
    ins = [tensors[n] for n in op.inputs]
    cdt = compute_dtype([t.dtype for t in ins], op.attrs["dtype"])
    cdt = widened(cdt)
    if views is None:
        views = [(t.name, 0, broadcast_strides(t.shape, shape)) for t in ins]
    operand_strides = [contiguous_strides(shape), *[v[2] for v in views]]

    pieces = split(op.attrs["expr"], [t.dtype for t in ins], cdt)  # long chains: bounded loop bodies

    def compute(g, regs, box, vec):
        values = list(regs)
        for i, (expr, operands) in enumerate(pieces[:-1]):
            values.append(register_result(g, box, cdt, name=f"%part{i}"))
            g.add(Elementwise(expr=expr, inputs=tuple(values[j] for j in operands), out=values[-1],
                              compute_dtype=cdt, vec=vec))
        expr, operands = pieces[-1]
        result = register_result(g, box, out.dtype)
        g.add(Elementwise(expr=expr, inputs=tuple(values[j] for j in operands), out=result, compute_dtype=cdt, vec=vec))
        return result

    cands = []
    own = unique_views(shape, operand_strides)
    for dims, strides in own:
        coalesced = [(name, offset, s) for (name, offset, _), s in zip(views, strides[1:])]
        cands += pointwise_candidates(op, tensors, target, dims, coalesced, strides[0], compute, rejected)
    for dims, strides in cut_views(shape, operand_strides, target, own):
        coalesced = [(name, offset, s) for (name, offset, _), s in zip(views, strides[1:])]
        cands += pointwise_candidates(op, tensors, target, dims, coalesced, strides[0], compute, rejected,
                                      structures=("chunk",))
    return cands


def cut_views(shape, stride_sets, target, own) -> list:
    """GPU only: the output as (leading dimensions, the rest coalesced), for each place the rest
    starts, with chunks along the rest: the tiling of an epilogue after a reduction whose lanes
    take runs of outputs restarting at each channel's pixels (`reduce._run_rows`), where the
    operands would otherwise coalesce across channels (a ReLU after a 1x1 conv's bias)."""
    if target.lanes_per_unit < 32 or target.timing.widest_access_bytes < 16:
        return []
    out = []
    for i in range(1, len(shape) - 1):
        head = coalesce(shape[:i], *[s[:i] for s in stride_sets])
        tail = coalesce(shape[i:], *[s[i:] for s in stride_sets])
        if head[0] == (1,) or len(tail[0]) != 1 or tail[0][0] < target.lanes_per_unit:
            continue
        view = ((*head[0], *tail[0]), [(*h, *t) for h, t in zip(head[1], tail[1])])
        if view not in own and view not in out:
            out.append(view)
    return out
