"""Lanes on channels: the form of an across-units kernel whose rows are short and strided.

A stride-2 depthwise conv over a 14x14 plane has rows of 7 output units, 5 of them interior:
shorter than a vector, so the row form (gir/backends/across_units.py) leaves every unit scalar.
Neighbouring channels are independent and as many as a vector is wide, but their elements lie a
plane apart. So each block of CHANNEL_LANES channels copies the planes it reads into a local
array with the channel innermost, runs the plane's positions as plain loops and the block's
channels as the SIMD loop (every access contiguous), and copies its outputs back. Which kernels
take the form, and what each block copies, is the IR's rule (gir/ir/across_units.py
channel_lanes, `Staging`), shared with the time model. EfficientNet-B0's 5x5 stride-2 depthwise
conv + SiLU over 672x14x14, one thread: 600 us in the row form, 74 us here (onnxruntime's Conv
alone: 54 us).

The copies move whole 16x16 tiles of floats as register transposes where the dialect's prelude
defines GIR_TILE16 (4x the scalar copy's rate), element by element otherwise. An input read
through a window's padding is staged as the padded plane, its halo holding the fill
(gir/ir/across_units.py `Padding`), so that every tap loads without a mask. Where the masks
are not the plane's bounds, a mask that depends only on the position picks, once per
position, whether a tap reads the stage or a row of fill values.
"""
from __future__ import annotations

from math import prod

import numpy as np

from gir.ir.across_units import CHANNEL_LANES
from gir.ir.affine import Affine, var

from .cstyle import Idx, add_c, affine_c, block
from .kernels import Kernel


class ChannelLanes:
    """The channel-lane half of AcrossUnits (its base): active while `self.staging` is set."""
    staging = None  # gir.ir.across_units.Staging of the kernel being emitted, or None

    def _staged_load(self, s, i: Idx) -> tuple[str, list[str]]:
        """A staged element whose mask depends only on the plane (a conv's padding): which of
        the stage or a row of fill values it reads is chosen once per output position, as a
        pointer outside the SIMD loop, so that the lanes load contiguously without a mask
        (with the mask inside, gcc 12 turned the loads into gathers: 376 against 162 us with
        no mask at all, a 5x5 stride-2 conv over 672x14x14)."""
        if s.buffer in self.staging.pads:
            return self._staged_ref(s, i), []  # the halo holds the fill (Padding)
        conditions = self._conditions(s, i)
        if conditions is None or conditions[1] and not conditions[0] and self._fill is not None:
            held = None if conditions is None else tuple(conditions[1])  # None: never (the fill)
            rows = self.fill_rows.setdefault((s.buffer, self._fill), f"fill{len(self.fill_rows)}")
            key = (held, s.buffer, self._staged_row(s, i), rows)
            if key not in self.pointers:
                self.pointers[key] = f"p{len(self.pointers)}"
            return f"{self.pointers[key]}[{self._last} - c_lo]", []
        return self._staged_ref(s, i), self.mask(s, i)

    def _channel_frame(self, k: Kernel, head: list[str], body: list[str]) -> list[str]:
        """The channel-lane form (`Staging`): the OpenMP loop over the outer axes and blocks of
        CHANNEL_LANES channels; per block, each staged buffer's span copied in per channel
        (zero outside the buffer: a masked load never uses it), the plane's axes as plain
        loops, the channels as the SIMD loop, and the written spans copied back."""
        grid, st, lanes = k.prim.grid, self.staging, CHANNEL_LANES
        a, c = st.axis, f"b{st.axis}"
        blocks, bands = -(-grid[a] // lanes), grid[a + 1] // st.rows
        outer = [*grid[:a], blocks, bands]
        nest = []
        for i, size in enumerate(outer):
            inner = prod(outer[i + 1:])
            expr = "r" if inner == 1 else f"r / {inner}"
            name = "cb" if i == a else "band" if i == a + 1 else f"b{i}"
            nest.append(f"const int {name} = {0 if size == 1 else expr if i == 0 else f'({expr}) % {size}'};")
        nest += [f"const int c_lo = cb * {lanes}, c_hi = c_lo + {lanes} < {grid[a]} ? c_lo + {lanes} : {grid[a]};"]
        copy_in, copy_out = [], []
        for buf in st.spans:
            b, pad = k.buffers[buf], st.pads.get(buf)
            size = pad.pitch * pad.height if pad else st.spans[buf][1] - st.spans[buf][0] + 1
            start = f"band * {pad.band_rows}L;  /* the band's first row */" if pad else \
                f"band * {st.rows * st.row_steps[buf]}L;  /* the band's start */"
            nest += [f"{self.types[b.dtype]} st_{self.names[buf]}[{size * lanes}];", f"const long bo_{self.names[buf]} = {start}"]
            copies = self._padded_copy(k, buf, pad) if pad else self._copy_loops(k, buf)
            (copy_out if buf in st.written else copy_in).extend(copies)
        for (buf, literal), name in self.fill_rows.items():
            nest += [f"{self.types[k.buffers[buf].dtype]} {name}[{lanes}];",
                     f"for (int l = 0; l < {lanes}; ++l) {name}[l] = {literal};"]
        inner = [f"const long {name} = {text};" for text, name in self.offsets.values()]
        inner += [f"const int {name} = ({text}) ? {grid[a]} : 0;" for text, name in self.row_conditions.items()]
        inner += self._positions(k, body)
        for i in reversed(range(a + 2, len(grid))):
            inner = block(f"for (int b{i} = 0; b{i} < {grid[i]}; ++b{i}) {{", inner)
        inner = block(f"for (int b{a + 1} = band * {st.rows}; b{a + 1} < band * {st.rows} + {st.rows}; ++b{a + 1}) {{", inner)
        nest += [*copy_in, *inner, *copy_out]
        loop = f"  for (int r = 0; r < {prod(outer)}; ++r) {{"
        return [*head, self.team_pragma(k), *block(loop, ["  " + ln for ln in nest], "  }"), "}"]

    def _positions(self, k: Kernel, body: list[str]) -> list[str]:
        """One position's pointers and SIMD loop over the block's channels. Where some tap's
        pointer depends on a mask, the position runs one of two copies: inside the window's
        interior (every condition holds) the pointers are the stage's plain offsets, and only
        border positions select between the stage and the fill rows (one branch on all the
        conditions, `&` so that it is one). The selects were a few instructions per tap and
        position: RedNet-50's 7x7 involution over 128x28x28 295 -> 245 us on one thread, the
        5x5 stride-2 conv + SiLU over 672x14x14 74 -> 66 us; over 64x56x56 in bands 444 -> 460
        (within noise of even), EfficientNet-B0's other depthwise convs even."""
        c, lanes = f"b{self.staging.axis}", CHANNEL_LANES
        loop = ["#define GIR_EDGE(c) (c)", self.simd_pragma,
                *block(f"for (int {c} = c_lo; {c} < c_lo + {lanes}; ++{c}) {{", body), "#undef GIR_EDGE"]

        def pointers(interior: bool) -> list[str]:
            out = []
            for (held, buf, at, rows), name in self.pointers.items():
                stage = f"st_{self.names[buf]} + ({at})"
                cond = "false" if held is None else " && ".join(f"({c})" for c in held)
                value = (stage if held is not None else rows) if interior else f"({cond}) ? {stage} : {rows}"
                out.append(f"const {self.types[k.buffers[buf].dtype]}* {name} = {value};")
            return out
        atoms = list(dict.fromkeys(a for held, *_ in self.pointers if held for a in held))
        if not atoms:
            return pointers(False) + loop
        return [*block(f"if ({' & '.join(f'({a})' for a in atoms)}) {{", pointers(True) + loop, "} else {"),
                *block("", pointers(False) + loop)[1:]]

    def _copy_loops(self, k: Kernel, buf: str) -> list[str]:
        """The copy of buffer buf's band span into its stage (read) or out of it (written), in
        pieces of 16 elements: a whole piece of 16 channels as a register transpose where the
        prelude defines GIR_TILE16, element by element otherwise."""
        lanes, c, (lo, hi) = CHANNEL_LANES, self._last, self.staging.spans[buf]
        b, stage, g, span = k.buffers[buf], f"st_{self.names[buf]}", self.names[buf], hi - lo + 1
        rest = self.staging.rests[buf] + var(f"bo_{self.names[buf]}")
        at = lambda ch: affine_c(rest.substitute({c: var(ch)}) + lo)  # noqa: E731  (the span's start for channel ch)
        step = dict(rest.terms).get(c, 0)  # elements between two channels' spans
        tiled = self.types[b.dtype] == "float" and step > 0
        e_end = f"(e0 + {lanes} < {span} ? e0 + {lanes} : {span})"
        whole = f"e0 + {lanes} <= {span} && c_hi - c_lo == {lanes}"
        if buf in self.staging.written:  # each channel's span written out contiguously
            tile = [f"if ({whole}) {{ gir_tile16({stage} + e0 * {lanes}, {lanes}, {g} + {at('c_lo')} + e0, {step}); continue; }}"]
            scalar = block("for (int l = 0; l < c_hi - c_lo; ++l) {", [
                "const int ch = c_lo + l;", f"const long base = {at('ch')};",
                *block(f"for (int e = e0; e < {e_end}; ++e) {{", [f"{g}[base + e] = {stage}[e * {lanes} + l];"])])
        else:  # element-major: the stage is written contiguously, each channel read as a stream
            tile = [f"const long first = {at('c_lo')} + e0, last = first + {step * (lanes - 1) + lanes - 1};",
                    f"if ({whole} && first >= 0 && last < {b.size}) {{",
                    f"  gir_tile16({g} + first, {step}, {stage} + e0 * {lanes}, {lanes});", "  continue;", "}"]
            scalar = block(f"for (int e = e0; e < {e_end}; ++e) {{", [
                f"{self.scalar_barrier}  /* scalar: gcc 12 miscompiled masked gathers */",
                *block(f"for (int l = 0; l < {lanes}; ++l) {{", [
                    "const int ch = c_lo + l;", f"const long x = {at('ch')} + e;",
                    f"{stage}[e * {lanes} + l] = ch < c_hi && x >= 0 && x < {b.size} ? {g}[x] : 0;"])])
        moves = [*(["#ifdef GIR_TILE16", *block("{", tile), "#endif"] if tiled else []), *scalar]
        return block(f"for (int e0 = 0; e0 < {span}; e0 += {lanes}) {{", moves)

    def _padded_copy(self, k: Kernel, buf: str, pad) -> list[str]:
        """The band's padded plane copied into its stage (`Padding`): the halo (rows outside
        the plane, columns beside it) set to the fill, then the band's rows of the tensor,
        which lie contiguously, in pieces of 16 elements (a register transpose into a tile
        where the prelude defines GIR_TILE16, element by element otherwise), each element's
        16 channels stored at its padded place: whole pieces also where rows are shorter than
        16 (copied row by row, a 14x14 plane's rows left every copy scalar: ShuffleNet-v2's
        stride-2 depthwise convs ran 1.3-1.8x slower, `scripts/loop_forms_ab.py --baseline halos`)."""
        lanes, c, n = CHANNEL_LANES, self._last, pad.row_length
        b, stage, g, t = k.buffers[buf], f"st_{self.names[buf]}", self.names[buf], self.types[k.buffers[buf].dtype]
        rest = self.staging.rests[buf]
        at = lambda ch: affine_c(rest.substitute({c: var(ch)}))  # noqa: E731  (channel ch's plane)
        step = dict(rest.terms).get(c, 0)
        fill, bo = self.storage_literal(pad.fill, b.dtype), f"bo_{g}"
        lo, hi = -pad.left, n - pad.left  # the tensor's columns in a stage row: all of them (Padding)
        def place(e: str) -> str:  # where tensor element e of the channel's plane sits in the stage
            return f"({add_c(f'({e} / {n} - {bo}) * {pad.pitch} + {e} % {n}', str(-pad.top * pad.pitch - pad.left))}) * {lanes}"
        halo = block(f"for (int i = 0; i < {pad.height}; ++i) {{", [
            f"const long row = {add_c(bo, str(pad.top))} + i;", f"{t}* dst = {stage} + i * {pad.pitch * lanes};",
            f"const int inside = row >= 0 && row < {pad.plane_rows};",
            f"for (int e = 0; e < (inside ? {lo * lanes} : {pad.pitch * lanes}); ++e) dst[e] = {fill};",
            f"if (inside) for (int e = {hi * lanes}; e < {pad.pitch * lanes}; ++e) dst[e] = {fill};"])
        top, bottom = add_c(bo, str(pad.top)), add_c(bo, str(pad.top + pad.height))  # the band's rows [top, bottom)
        first, last = f"({top} > 0 ? {top} : 0) * {n}", f"({bottom} < {pad.plane_rows} ? {bottom} : {pad.plane_rows}) * {n}"
        tile = [f"{t} piece[{lanes * lanes}];", f"if (e0 + {lanes} <= e1 && c_hi - c_lo == {lanes}) {{",
                *([f"  if (e0 % {n} + {lanes} <= {n}) {{  /* within one row: straight into place */",
                   f"    gir_tile16({g} + {at('c_lo')} + e0, {step}, {stage} + {place('e0')}, {lanes});", "    continue;", "  }"]
                  if n >= lanes else []),
                f"  gir_tile16({g} + {at('c_lo')} + e0, {step}, piece, {lanes});",
                *["  " + ln for ln in block(f"for (int j = 0; j < {lanes}; ++j) {{", [
                    "const long e = e0 + j;", f"memcpy({stage} + {place('e')}, piece + j * {lanes}, sizeof piece / {lanes});"])],
                "  continue;", "}"]
        scalar = block(f"for (long e = e0; e < (e0 + {lanes} < e1 ? e0 + {lanes} : e1); ++e) {{", [
            f"{self.scalar_barrier}  /* scalar: gcc 12 miscompiled masked gathers */",
            *block(f"for (int l = 0; l < {lanes}; ++l) {{", [
                "const int ch = c_lo + l;",
                f"{stage}[{place('e')} + l] = ch < c_hi ? {g}[{at('ch')} + e] : {fill};"])])
        body = [*(["#ifdef GIR_TILE16", *block("{", tile), "#endif"] if t == "float" and step > 0 else []), *scalar]
        return [*halo, *block(f"for (long e0 = {first}, e1 = {last}; e0 < e1; e0 += {lanes}) {{", body)]

    def _staged_ref(self, s, i: Idx) -> str:
        """Element i of staged slice s in its block's local array."""
        return f"st_{self.names[s.buffer]}[{self._staged_row(s, i)} + {self._last} - c_lo]"

    def _staged_row(self, s, i: Idx) -> str:
        """Where element i of staged slice s starts its row of lanes in the local array: its
        offset over the plane axes less the span's start, times the lanes."""
        plane = {f"b{d}" for d in range(self.staging.axis + 1, len(self.k.prim.grid))}
        inside, rest = self.k.prim.normalize(s.offset).substitute({"w": Affine(0)}).split(plane)
        pad = self.staging.pads.get(s.buffer)
        if pad:  # (row - the band's first row) * pitch + column - left, split as Padding.split does
            at = np.unravel_index(min(int(i.lanes[0]), s.size - 1), s.shape)
            parts = [pad.split(rest.const), *(tuple(int(n) * x for x in pad.split(st)) for n, st in zip(at, s.strides))]
            row, col = (sum(p[j] for p in parts) for j in (0, 1))
            steps = {n: pad.split(x) for n, x in inside.terms}  # each plane axis' step as (rows, columns)
            terms = sum((var(n) * (r * pad.pitch + c) for n, (r, c) in steps.items()), Affine.of(0))
            index = add_c(affine_c(terms - var(f"bo_{self.names[s.buffer]}") * pad.pitch),
                          str((row - pad.top) * pad.pitch + col - pad.left))
            return f"({index}) * {CHANNEL_LANES}"
        element = int(s.pattern[min(int(i.lanes[0]), s.size - 1)]) + rest.const - self.staging.spans[s.buffer][0]
        index = add_c(affine_c(inside - var(f"bo_{self.names[s.buffer]}")), str(element))
        return f"({index}) * {CHANNEL_LANES}"
