"""Composition of data-movement chains (layouts, views, concats, splits) into direct copies.

A store followed by a load of the same tensor is one move (read-after-write merging) at the
level of index maps: every tensor a chain produces is described as pieces, each a box of its
index space whose elements come from one source tensor at an affine address. A layout that
reads such a tensor is re-expressed over the tensor's own dimensions (splitting a dimension
where it spans several), and the pieces compose; a concat places its inputs' pieces side by
side. Only the chain's escaping tensors are written, each piece by one strided copy, and
pieces of one shape share one kernel. ShuffleNet's concat -> channel shuffle -> split becomes
one kernel that reads each input once and writes each output once.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from gir.frontend.basic import BasicGraph, BasicOp, contiguous_strides
from gir.ir import GIRGraph, Move
from gir.ir.target import Target
from gir.templates.common import Box, Candidate, admit, box_choices, coalesce, lane_widths, load
from gir.templates.layout import wide_tiles
from gir.templates.pointwise import vec_choices

MOVEMENT = ("layout", "view", "concat")


@dataclass(frozen=True)
class Piece:
    """Elements lo <= idx < hi (per dimension) read source[offset + sum(idx * strides)]."""
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    source: str
    offset: int
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Content:
    """A tensor as pieces over an index space whose row-major order is its storage order."""
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]


def identity(name: str, shape: tuple[int, ...]) -> Content:
    shape = tuple(shape) or (1,)
    return Content(shape, (Piece((0,) * len(shape), shape, name, 0, contiguous_strides(shape)),))


def _place(n: int, s: int, start: tuple[int, ...], tshape: tuple[int, ...], cstr: tuple[int, ...]):
    """Map one view dimension (size n, flat stride s) onto tensor dimensions: [(size, dim, step)]
    outermost first, splitting it where it runs across a dimension boundary."""
    a, sign = abs(s), (1 if s > 0 else -1)
    j = next(j for j, c in enumerate(cstr) if a % c == 0)
    step = sign * (a // cstr[j])
    t = tshape[j]
    edge = 0 if step > 0 else t - 1
    if abs(step) == 1 and n > t and n % t == 0 and start[j] == edge and j > 0:
        return _place(n // t, s * t, start, tshape, cstr) + [(t, j, step)]
    return [(n, j, step)]


def reindex(content: Content, offset: int, vshape, vstrides) -> Content | None:
    """The content of a strided view (offset, vshape, vstrides) of `content`'s storage, or None
    where the view does not decompose into the tensor's dimensions or cuts a piece unevenly."""
    tshape, cstr = content.shape, contiguous_strides(content.shape)
    if not 0 <= offset < prod(tshape):
        return None
    start = tuple(int(i) for i in _unravel(offset, tshape))
    dims = []
    for n, s in zip(vshape, vstrides):
        dims += [(n, None, 0)] if n == 1 or s == 0 else _place(n, s, start, tshape, cstr)
    for j, t in enumerate(tshape):
        mapped = [(n, step) for n, jj, step in dims if jj == j]
        low = start[j] + sum(min(0, step * (n - 1)) for n, step in mapped)
        high = start[j] + sum(max(0, step * (n - 1)) for n, step in mapped)
        if low < 0 or high >= t:
            return None
    shape = tuple(n for n, _, _ in dims)
    pieces = []
    for p in content.pieces:
        piece = _compose(p, dims, start, tshape)
        if piece is False:
            return None
        if piece is not None:
            pieces.append(piece)
    return Content(shape, tuple(pieces))


def _compose(p: Piece, dims, start, tshape):
    """Piece p seen through the view: a piece, None when the view misses it, False when the
    piece's edge cuts a view dimension that several tensor dimensions share."""
    lo, hi = [0] * len(dims), [n for n, _, _ in dims]
    for j in range(len(tshape)):
        users = [i for i, (_, jj, _) in enumerate(dims) if jj == j]
        if not users:
            if not p.lo[j] <= start[j] < p.hi[j]:
                return None
            continue
        if len(users) > 1:
            if p.lo[j] == 0 and p.hi[j] == tshape[j]:
                continue
            box = _radix_box(users, dims, p.lo[j] - start[j], p.hi[j] - start[j])
            if box is False or box is None:
                return box
            for i, (a, b) in box.items():
                lo[i], hi[i] = a, b
            continue
        i = users[0]
        n, _, step = dims[i]
        first = -(-(p.lo[j] - start[j]) // step) if step > 0 else -(-(start[j] - (p.hi[j] - 1)) // -step)
        last = (p.hi[j] - 1 - start[j]) // step if step > 0 else (start[j] - p.lo[j]) // -step
        lo[i], hi[i] = max(0, first), min(n, last + 1)
        if lo[i] >= hi[i]:
            return None
    offset = p.offset + sum(start[j] * p.strides[j] for j in range(len(tshape)))
    strides = tuple(0 if jj is None else step * p.strides[jj] for _, jj, step in dims)
    return Piece(tuple(lo), tuple(hi), p.source, offset, strides)


def single_view(content: Content, shape: tuple, strides: tuple):
    """(source, offset, strides over `shape`) when reading `content` with `strides` is one
    affine read of one source tensor; None otherwise."""
    seen = reindex(content, 0, shape, strides)
    if seen is None or seen.shape != tuple(shape) or not seen.pieces:
        return None
    p = seen.pieces[0] if len(seen.pieces) == 1 else merged(seen.pieces)
    if p is None:
        return None
    if p.lo != (0,) * len(shape) or p.hi != tuple(shape):
        return None
    return p.source, p.offset, p.strides


def merged(pieces) -> Piece | None:
    """The pieces as one affine piece, when they tile a box of one source at addresses affine in
    the index (the 49 shifted slices of an unfolded 7x7 window, once the tap dimension is split
    into 7x7: each tap a point, together one strided view of the padded input); None otherwise."""
    source = pieces[0].source
    if any(p.source != source for p in pieces):
        return None
    rank = len(pieces[0].lo)
    lo = tuple(min(p.lo[d] for p in pieces) for d in range(rank))
    hi = tuple(max(p.hi[d] for p in pieces) for d in range(rank))
    if sum(prod(h - l for l, h in zip(p.lo, p.hi)) for p in pieces) != prod(h - l for l, h in zip(lo, hi)):
        return None
    first = {p.lo: p.offset + sum(i * s for i, s in zip(p.lo, p.strides)) for p in pieces}
    if lo not in first:
        return None
    origin = next(p for p in pieces if p.lo == lo)
    strides = []
    for d in range(rank):
        wide = {p.strides[d] for p in pieces if p.hi[d] - p.lo[d] > 1}
        if len(wide) > 1:
            return None
        if wide:
            strides.append(wide.pop())
            continue
        step = lo[:d] + (lo[d] + 1,) + lo[d + 1:]
        strides.append(first[step] - first[lo] if step in first else origin.strides[d])
    offset = first[lo] - sum(i * s for i, s in zip(lo, strides))
    for p in pieces:
        if first[p.lo] != offset + sum(i * s for i, s in zip(p.lo, strides)) or \
                any(p.strides[d] != strides[d] for d in range(rank) if p.hi[d] - p.lo[d] > 1):
            return None
    return Piece(lo, hi, source, offset, tuple(strides))


def _radix_box(users, dims, a: int, b: int):
    """The view dimensions sharing one tensor dimension form a mixed radix (each step the
    product of the faster ones' sizes): the interval [a, b) of that tensor dimension as a box of
    digits {view dim: (lo, hi)}: faster digits whole, one digit a range, slower ones fixed (a
    channel shuffle's group; one tap of an unfolded window). None when the view misses the
    interval, False when the interval is no such box."""
    ordered = sorted(users, key=lambda i: dims[i][2])
    expected = 1
    for i in ordered:
        n, _, step = dims[i]
        if step != expected:
            return False
        expected *= n
    a, b = max(a, 0), min(b, expected)
    if a >= b:
        return None
    level = 0
    while level < len(ordered) and a % (dims[ordered[level]][2] * dims[ordered[level]][0]) == 0 \
            and b % (dims[ordered[level]][2] * dims[ordered[level]][0]) == 0:
        level += 1  # the faster digits are whole
    if level == len(ordered):
        return {i: (0, dims[i][0]) for i in ordered}
    n, _, step = dims[ordered[level]]
    if a % step or b % step or a // (step * n) != (b - 1) // (step * n):
        return False  # [a, b) crosses a slower digit or cuts a faster one
    box = {i: (0, dims[i][0]) for i in ordered[:level]}
    box[ordered[level]] = ((a // step) % n, ((b - 1) // step) % n + 1)
    for i in ordered[level + 1:]:
        digit = (a // dims[i][2]) % dims[i][0]
        box[i] = (digit, digit + 1)
    return box


def _unravel(index: int, shape) -> list[int]:
    out = []
    for d in reversed(shape):
        out.append(index % d)
        index //= d
    return list(reversed(out))


def concat(contents: list[Content], shapes: list[tuple], axis: int, out_shape: tuple) -> Content | None:
    """The inputs side by side along `axis`. An input whose pieces only decompose with that axis
    split into digits (a channel shuffle's output: even and odd channels from two sources) is
    placed over the split axis, every input split alike (the digits' row-major order is the
    storage order): the next unit's concat of a shuffled half composes instead of being copied."""
    own = [_own(c, tuple(s)) for c, s in zip(contents, shapes)]
    if any(o is None for o in own):
        return None  # an input does not decompose along its own dimensions
    digits = {o.shape[axis + 1:axis + 1 + len(o.shape) - len(s)] for o, s in zip(own, shapes) if o.shape != tuple(s)}
    if len(digits) > 1:
        return None
    if digits:
        inner = digits.pop()
        if any(s[axis] % prod(inner) for s in shapes):
            return None

        def split(s):
            return tuple(s[:axis]) + (s[axis] // prod(inner),) + inner + tuple(s[axis + 1:])
        shapes, out_shape = [split(s) for s in shapes], split(out_shape)
        own = [_own(c, s) for c, s in zip(contents, shapes)]
        if any(o is None or o.shape != s for o, s in zip(own, shapes)):
            return None
    pieces, at = [], 0
    for content, shape in zip(own, shapes):
        for p in content.pieces:
            lo, hi = list(p.lo), list(p.hi)
            lo[axis] += at
            hi[axis] += at
            pieces.append(replace(p, lo=tuple(lo), hi=tuple(hi), offset=p.offset - at * p.strides[axis]))
        at += shape[axis]
    return Content(tuple(out_shape), tuple(pieces))


def _own(content: Content, shape: tuple) -> Content | None:
    """`content` re-expressed over `shape` read contiguously (finer where a piece needs it)."""
    return reindex(content, 0, shape, contiguous_strides(shape)) if prod(shape) else Content(shape, ())


@dataclass
class Composition:
    contents: dict[str, Content]   # every tensor a movement op produces that composed
    absorbed: list[BasicOp]        # movement ops no longer executed on their own
    written: list[str]             # composed tensors that must exist in DRAM
    aliases: dict[str, str]        # composed tensors that are another tensor's storage as is
    materialized: set[str]         # written compactly so that an expanding layout folds (below)


def compose(graph: BasicGraph, ops: list[BasicOp] | None = None) -> Composition:
    """Compose every movement op of `ops` (default: all) whose inputs' contents are known."""
    ops = graph.ops if ops is None else ops
    contents: dict[str, Content] = {}
    absorbed, needed, materialized = [], set(graph.outputs), set()

    outputs = set(graph.outputs)

    def content_of(name):
        """What a movement op reading `name` reads. A graph output is written anyway: where its
        content is no single view (a KV cache's concat of past and new), a reader takes it
        from the output's storage as one view rather than from its pieces, so that it can
        alias or fold it (GPT-2 decode wrote each layer's keys twice, as present.key and as
        the attention's operand, and its values once more transposed)."""
        c = contents.get(name)
        if c is None or name in outputs and len(c.pieces) > 1 and single_view(c, c.shape, contiguous_strides(c.shape)) is None:
            return identity(name, graph.tensors[name].shape)
        return c

    for op in ops:
        out = op.outputs[0]
        result = None
        if op.kind == "view":
            result = content_of(op.inputs[0])
        elif op.kind == "layout":
            a = op.attrs
            source, shape = content_of(op.inputs[0]), graph.tensors[op.inputs[0]].shape
            if prod(a["shape"]) > prod(shape) and single_view(source, shape, contiguous_strides(shape)) is None:
                # An expanding layout (a broadcast, a conv window) of a tensor that is no single
                # affine view of one source (pieces of a concat; a channel shuffle's mixed-radix
                # channels): composed through, no consumer could fold it and it would be written
                # expanded (a 1x1 conv's window: 58x its input). The input is written compactly
                # instead and the layout reads it through one view that its consumer folds.
                source = identity(op.inputs[0], shape)
                materialized.add(op.inputs[0])
            result = reindex(source, a["offset"], a["shape"], a["strides"])
        elif op.kind == "concat":
            shapes = [graph.tensors[t].shape for t in op.inputs]
            result = concat([content_of(t) for t in op.inputs], shapes, op.attrs["axis"], graph.tensors[out].shape)
        if result is None:
            needed.update(op.inputs)
            continue
        contents[out] = result
        absorbed.append(op)
    needed |= materialized
    absorbed_ids = {id(op) for op in absorbed}
    for op in graph.ops:
        if id(op) not in absorbed_ids:
            needed.update(op.inputs)
    aliases = {t: src for t, c in contents.items()
               if (src := _storage_of(c)) is not None and graph.tensors[src].size == graph.tensors[t].size}
    written = [t for t in contents if t in needed and t not in aliases]
    return Composition(contents, absorbed, written, aliases, materialized)


def _storage_of(content: Content) -> str | None:
    """The tensor whose storage this content starts, element for element (a reshape of it when
    the sizes agree; a prefix of it otherwise)."""
    if len(content.pieces) != 1:
        return None
    p = content.pieces[0]
    whole = p.lo == (0,) * len(p.lo) and p.hi == content.shape
    return p.source if whole and p.offset == 0 and p.strides == contiguous_strides(content.shape) else None


def copy_candidates(graph: BasicGraph, comp: Composition, target: Target, rejected: list) -> list[list[Candidate]]:
    """GIR-Graphs writing the composed tensors: pieces of one coalesced shape whose sources were
    produced at the same point of the program share a kernel (sharing across points could make
    a kernel wait for its own output). Returns, per kernel, its candidates."""
    position = {t: i for i, op in enumerate(graph.ops) for t in op.outputs}
    groups: dict[tuple, list] = {}
    for name in comp.written:
        content = comp.contents[name]
        cstr = contiguous_strides(content.shape)
        for p in content.pieces:
            region = tuple(h - l for l, h in zip(p.lo, p.hi))
            src_off = p.offset + sum(l * s for l, s in zip(p.lo, p.strides))
            dst_off = sum(l * s for l, s in zip(p.lo, cstr))
            dims, (sstr, dstr) = coalesce(region, p.strides, cstr)
            ready = max(position.get(q.source, -1) for q in content.pieces)
            groups.setdefault((dims, ready), []).append((name, p.source, src_off, sstr, dst_off, dstr))
    out = []
    for (dims, _), pieces in groups.items():
        out.append(_group_candidates(graph, dims, pieces, target, rejected))
    return out


def _group_candidates(graph, dims, pieces, target, rejected) -> list[Candidate]:
    padded, strides = Box.pad(dims, [s for p in pieces for s in (p[3], p[5])])
    label = "+".join(sorted({p[0] for p in pieces}))
    # CPU copies keep one placement: their C loops are vectorised by the compiler, not by `vec`
    wide = target.timing.widest_access_bytes >= 16
    widths = lane_widths(graph.tensors, [n for p in pieces for n in p[:2]], target) if wide else []
    cands = []
    for structure, rows, chunk, upb, whole in box_choices(padded, target):
        box = Box.of(padded, structure, rows, chunk, upb, whole)
        # each lane several consecutive elements where every piece runs contiguously on both
        # sides (BERT's head transposes keep rows of 64 whole: 16-byte accesses, not 4-byte)
        for vec in vec_choices(chunk, box.size, strides, target, widths):
            g = GIRGraph(f"copy:{label}:{structure}", box.prim(), target)
            for name in dict.fromkeys([p[1] for p in pieces]):
                t = graph.tensors[name]
                g.buffer(name, "dram", t.shape or (1,), t.dtype, role="const" if t.is_const else "input")
            for name in dict.fromkeys([p[0] for p in pieces]):
                t = graph.tensors[name]
                g.buffer(name, "dram", t.shape or (1,), t.dtype, role="output")
            for i, (name, source, src_off, _, dst_off, _) in enumerate(pieces):
                sstr, dstr = strides[2 * i], strides[2 * i + 1]
                reg = load(g, box.slice(source, src_off, sstr), f"piece{i}", box.size, graph.tensors[source].dtype, vec=vec)
                g.add(Move(src=reg, dst=box.slice(name, dst_off, dstr), vec=vec))
            params = {"rows": rows, "chunk": chunk, "units_per_block": upb, "vec": vec} | ({"whole": whole} if whole else {})
            admit(cands, rejected, label, structure, params, g)
    if len(pieces) == 1 and len(dims) >= 2:  # a true transpose: both sides wide through a shared tile
        name, source, src_off, sstr, dst_off, dstr = pieces[0]
        if sstr[-1] != 1 and 1 in sstr[:-1] and dstr[-1] == 1:
            for g, params in wide_tiles(f"copy:{label}:tile", source, src_off, name, dst_off, dims, sstr, dstr,
                                        graph.tensors, target):
                admit(cands, rejected, label, "tile", params, g)
    return cands
