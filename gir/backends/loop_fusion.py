"""Loop fusion and scalar replacement for the looped-lanes form (a unit is one thread, each
gOperator one element loop over per-unit register arrays: gir/backends/cstyle.py).

Why: a chain of element loops (load, compute, store) over the same elements streams every
value through a stack array between loops: at 768 elements a unit, GPT-2's product kernel
took 3.4 ms against 1.7 ms for the same bytes in 16-element units whose arrays stay in
registers. Fused into one loop, a value passes from one gOperator to the next in a register,
and an array that only that loop touches, always at element k, becomes a scalar.

It works on the emitted C lines because the looped-lanes emitter writes these loops in one
fixed form (the SIMD pragma, `for (int k = 0; k < N; ++k) {`, its body one indent deeper, a
closing brace at the header's indent). Two such loops merge only when nothing but comments
separates them, both carry the pragma (iterations independent), and every array one writes and
the other touches is touched at the same index text everywhere in both (element k of one
iteration is all either loop reads or writes of it), so iteration k of the fused loop runs
the first body's iteration k and then the second's, as the two loops did.
"""
from __future__ import annotations

import re

_HEADER = re.compile(r"^(\s*)for \(int k = 0; k < (\d+); \+\+k\) \{$")
_ACCESS = re.compile(r"\b([rg]_\w+)\[([^\[\]]*)\]")
_WRITE = re.compile(r"\b([rg]_\w+)\[([^\[\]]*)\]\s*=(?!=)")
_DECLARED = re.compile(r"^\s*(\w+) (r_\w+)\[\d+\];$")
_NESTED = re.compile(r"\[[^\]]*\[")
_DRAM_READ = re.compile(r"\bg_\w+\[")


class _Loop:
    def __init__(self, start: int, end: int, count: int, indent: str, body: list[str]):
        self.start, self.end, self.count, self.indent, self.body = start, end, count, indent, body

    def accesses(self) -> tuple[dict, dict]:
        """(array -> index texts written, array -> index texts of every access)."""
        writes, every = {}, {}
        for line in self.body:
            for name, index in _WRITE.findall(line):
                writes.setdefault(name, set()).add(index.strip())
            for name, index in _ACCESS.findall(line):
                every.setdefault(name, set()).add(index.strip())
        return writes, every


def element_loop_at(lines: list[str], i: int, pragma: str) -> _Loop | None:
    """The pragma-marked element loop starting at line i, or None."""
    if i + 1 >= len(lines) or lines[i].strip() != pragma:
        return None
    m = _HEADER.match(lines[i + 1])
    if not m or lines[i] != m.group(1) + pragma:
        return None
    indent = m.group(1)
    for j in range(i + 2, len(lines)):
        if lines[j] == indent + "}":
            body = lines[i + 2:j]
            if any(_NESTED.search(ln) for ln in body):
                return None  # an index that is itself an access (a gather): not analysed, not fused
            return _Loop(i, j, int(m.group(2)), indent, body)
        if lines[j].strip() and not lines[j].startswith(indent + " "):
            return None
    return None


def _can_fuse(a: _Loop, b: _Loop) -> bool:
    if a.count != b.count or a.indent != b.indent:
        return False
    (wa, ea), (wb, eb) = a.accesses(), b.accesses()
    for name in (set(wa) & set(eb)) | (set(wb) & set(ea)):
        if len(ea.get(name, set()) | eb.get(name, set())) != 1:
            return False
    return True


def fuse_element_loops(lines: list[str], pragma: str, declared: list[str] = (), escaping: bool = False) -> list[str]:
    """`lines` with runs of fusable element loops merged, then arrays only a fused loop uses,
    always at [k], turned into scalars of that loop. A run is kept where every register array
    its loops write becomes such a scalar, or, with `escaping`, where some does and no array
    used after the run was computed from DRAM in it (`_gains`): a softmax row's scaled scores or a
    LayerNorm's centred row, still stored for the reduction that follows, had their loads and
    scaling in loops of their own, each through a stack array (ViT's softmax kernels 0.20 -> 0.17
    ms fused, its GIR kernels 1.15x, BERT's 1.07x, AMD EPYC: results/fuse_escaping_ab.md).
    `declared`: lines before `lines` that declare register arrays, which nothing after `lines`
    uses."""
    uses = _register_uses(lines)
    out, i, fused = [], 0, []
    while i < len(lines):
        run = _run_at(lines, i, pragma)
        if not run:
            out.append(lines[i])
            i += 1
            continue
        while len(run) > 1 and not (_closed(run, uses) or escaping and _gains(run, uses)):
            run.pop()
        first, last = run[0], run[-1]
        if len(run) == 1:
            out += lines[first.start:first.end + 1]
        else:
            ind = first.indent
            comments = [ln for a, b in zip(run, run[1:]) for ln in lines[a.end + 1:b.start]]
            merged = [ln for loop in run for ln in [ind + "  {", *["  " + x for x in loop.body], ind + "  }"]]
            fused.append((len(out) + len(comments) + 2, len(merged)))
            out += comments + [ind + pragma, f"{ind}for (int k = 0; k < {first.count}; ++k) {{", *merged, ind + "}"]
        i = last.end + 1
    return _scalars(out, fused, declared)


def _run_at(lines: list[str], i: int, pragma: str) -> list[_Loop]:
    """The loops from line i on that fuse pairwise in order (only comments between them)."""
    loop = element_loop_at(lines, i, pragma)
    run = [loop] if loop else []
    while run:
        k = run[-1].end + 1
        while k < len(lines) and lines[k].strip().startswith("//"):
            k += 1
        nxt = element_loop_at(lines, k, pragma)
        together = _Loop(run[0].start, run[-1].end, run[0].count, run[0].indent, [ln for lp in run for ln in lp.body])
        if nxt is None or not _can_fuse(together, nxt):
            break
        run.append(nxt)
    return run


def _register_uses(lines: list[str]) -> dict[str, list[tuple[int, str]]]:
    """Register array -> (line, index text) of every access, declarations left out."""
    where = {}
    for n, line in enumerate(lines):
        if _DECLARED.match(line):
            continue
        for name, index in _ACCESS.findall(line):
            if name.startswith("r_"):
                where.setdefault(name, []).append((n, index.strip()))
    return where


def _closed(run: list[_Loop], uses: dict) -> bool:
    """Every register array the run writes is used nowhere else, and only at [k]."""
    written, scalar = _written(run, uses)
    return written <= scalar


def _gains(run: list[_Loop], uses: dict) -> bool:
    """Some register array the run writes is used nowhere else and only at [k] (it becomes a
    scalar), and no array that outlives the run is written from DRAM in it: a product of DRAM
    operands still stored for a reduction ran 9% slower fused (GPT-2's GEMV, Intel VM: gcc
    copies the operands with memcpy when they have loops of their own, and that streams the
    weights faster)."""
    written, scalar = _written(run, uses)
    from_dram = {name for loop in run if any(_DRAM_READ.search(line.split("=", 1)[-1]) for line in loop.body)
                 for name in loop.accesses()[0]}  # a loop is one gOperator: what it writes, it computed from DRAM
    return bool(scalar) and not (written - scalar) & from_dram


def _written(run: list[_Loop], uses: dict) -> tuple[set, set]:
    """(register arrays the run writes, those of them used only inside it and only at [k])."""
    span = range(run[0].start, run[-1].end + 1)
    written = {name for loop in run for name in loop.accesses()[0] if name.startswith("r_")}
    return written, {name for name in written if all(n in span and index == "k" for n, index in uses.get(name, ()))}


def _scalars(lines: list[str], fused: list[tuple[int, int]], declared=()) -> list[str]:
    """Register arrays whose every access in the kernel is [k] inside one fused loop become
    scalars (`r_x__k`) declared (zeroed: a masked-off element is read, never stored) at the loop's top."""
    types = {}
    for line in [*declared, *lines]:
        m = _DECLARED.match(line)
        if m:
            types[m.group(2)] = m.group(1)
    where = {}
    for n, line in [*((-1, ln) for ln in declared), *enumerate(lines)]:  # a use before `lines`: never inside
        if _DECLARED.match(line):
            continue
        for name, index in _ACCESS.findall(line):
            if name in types:
                where.setdefault(name, []).append((n, index.strip()))
    for start, size in reversed(fused):
        inside = range(start, start + size)
        names = sorted(name for name, uses in where.items()
                       if all(n in inside and index == "k" for n, index in uses))
        if not names:
            continue
        for n in inside:
            lines[n] = re.sub(r"\b(" + "|".join(names) + r")\[k\]", r"\1__k", lines[n])
        indent = lines[start][:len(lines[start]) - len(lines[start].lstrip())]
        lines[start:start] = [f"{indent}{types[x]} {x}__k = 0;" for x in names]  # `__`: never in an emitted name
    return lines
