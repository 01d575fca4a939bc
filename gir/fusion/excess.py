"""Where a subgraph's DRAM bytes above the compulsory bound go, tensor by tensor, and why.

The bound reads each external input once and writes each escaping output once; every byte
GIR moves beyond that belongs to one tensor that a kernel writes and another (or the same one,
past a device sync) reads back, or to an input more than one kernel reads. Naming the tensor
and what kept its writer and reader apart tells a user which fusion is missing: a reader that
needs elements other blocks write (a reduction across blocks, a conv window over a
neighbouring tile), operators with no parallel structure in common, a fusion that would wait
on itself through an op outside it, a standalone copy, a grouping that fused them but was
modelled slower, or the greedy grouping's order.
The per-tensor amounts sum exactly to GIR bytes minus bound bytes (tensors GIR touches less
than the bound does, a pad folded into its reader say, count negative).
"""
from __future__ import annotations

from dataclasses import dataclass

from gir.frontend.basic import BasicGraph, BasicOp
from gir.ir.dtypes import itemsize

REREAD = "input read by several kernels"
DEVICE_SYNC = "device sync inside a kernel: the reader needs elements other blocks write"
NO_STRUCTURE = "writer and reader share no parallel structure"
CYCLE = "fusing would wait on itself through an op outside the kernel"
COPY = "standalone copy kernel"
SLOWER = "fused in the other grouping, which the performance model ranked slower"
ORDER = "the greedy grouping had closed the writer's kernel"
GROUP_LIMIT = "the writer's kernel had reached the group size limit ($GIR_MAX_GROUP_OPS)"
BELOW = "touched less than the bound assumes"
REASONS = (DEVICE_SYNC, NO_STRUCTURE, CYCLE, SLOWER, ORDER, GROUP_LIMIT, COPY, REREAD, BELOW)


@dataclass(frozen=True)
class Excess:
    tensor: str
    bytes: int
    reason: str
    writer: str | None      # kernel writing the tensor (None: an external input)
    readers: tuple[str, ...]  # kernels reading it
    detail: str             # the basic ops on either side, for the user

    def as_dict(self) -> dict:
        return {"tensor": self.tensor, "bytes": self.bytes, "reason": self.reason, "writer": self.writer,
                "readers": list(self.readers), "detail": self.detail}


def attribute(kernels, bound_share: dict[str, int], ops: dict[str, BasicOp], *, reads, writes, why_apart) -> list[Excess]:
    """`bound_share`: bytes the bound gives each tensor; `ops`: the subgraph's basic ops by
    name; `reads(op)`: the DRAM tensors op reads by storage name, each mapped to whether it
    reads it through a layout folded into it; `writes(op)`: those it writes;
    `why_apart(writer_ops, producer, reader)`: SLOWER, NO_STRUCTURE, CYCLE, GROUP_LIMIT or ORDER for two kernels."""
    moved: dict[str, int] = {}
    writers: dict[str, list] = {}
    readers: dict[str, list] = {}
    for k in kernels:
        for (key, name), n in k.estimate.dram_by_buffer.items():
            moved[name] = moved.get(name, 0) + n
            (writers if key == "write" else readers).setdefault(name, []).append(k)
    out = []
    for name in sorted(set(moved) | set(bound_share)):
        extra = moved.get(name, 0) - bound_share.get(name, 0)
        if extra:
            out.append(_explain(name, extra, writers.get(name, []), readers.get(name, []), ops, reads, writes, why_apart))
    return sorted(out, key=lambda e: -e.bytes)


def _explain(name, extra, writers, readers, ops, reads, writes, why_apart) -> Excess:
    reader_names = tuple(k.name for k in readers)
    if extra < 0:
        return Excess(name, extra, BELOW, writers[0].name if writers else None, reader_names, "")
    if not writers:
        return Excess(name, extra, REREAD, None, reader_names, f"read by {len(readers)} kernels")
    w = writers[0]
    producer = next((ops[o] for o in w.ops if o in ops and name in writes(ops[o])), None)
    if any(k is w for k in readers):
        inside = [ops[o] for o in w.ops if o in ops and name in reads(ops[o]) and ops[o] is not producer]
        who = ", ".join(_reading(op, name, reads) for op in inside) or "a later operator"
        return Excess(name, extra, DEVICE_SYNC, w.name, reader_names, f"{who} after the sync")
    if not readers:
        return Excess(name, extra, ORDER, w.name, (), f"written by {len(writers)} kernel(s), read by none")
    other = readers[0]
    reader = next((ops[o] for o in other.ops if o in ops and name in reads(ops[o])), None)
    if w.name.startswith("copy:") or other.name.startswith("copy:"):
        reason = COPY
    elif reader is None or producer is None:
        reason = ORDER
    else:
        reason = why_apart([ops[o] for o in w.ops if o in ops], producer, reader)
    source = producer.name if producer else w.name
    return Excess(name, extra, reason, w.name, reader_names,
                  f"{source} -> {_reading(reader, name, reads) if reader else other.name}")


def _reading(op: BasicOp, name: str, reads) -> str:
    """The reader as a user reads it: its name, its kind, and whether it reads the tensor
    through a layout folded into it (a conv window, a transpose, a broadcast)."""
    return f"{op.name} ({op.kind}{', through a layout' if reads(op)[name] else ''})"


def bound_shares(g0: BasicGraph, escaping: set[str], external: dict[str, int], aliases) -> dict[str, int]:
    """Bytes per tensor of the bound: escaping outputs written once, external inputs read once
    (`external`: their compulsory read bytes)."""
    share: dict[str, int] = {}
    for t in escaping:
        storage = aliases.get(t, t)
        share[storage] = share.get(storage, 0) + g0.tensors[t].size * itemsize(g0.tensors[t].dtype)
    for t, n in external.items():
        share[t] = share.get(t, 0) + n
    return share


def summary(excesses) -> dict[str, int]:
    """Bytes per reason, in REASONS order, reasons with none left out."""
    totals = {r: 0 for r in REASONS}
    for e in excesses:
        totals[e.reason] += e.bytes
    return {r: n for r, n in totals.items() if n}
