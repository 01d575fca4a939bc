"""Partition: which ops go to the vendor library and which to GIR, decided by arithmetic
intensity against the target's ridge point (peak matrix FLOP/s over DRAM bandwidth), not by
op type. A matrix-vector product (GPT-2 decode) or a depthwise convolution falls below the
ridge and is lowered into basic operators; a GEMM above it stays a library call.

Memory-intensive ops then form maximal convex subgraphs: connected through tensors, and no
path leaves a subgraph through a library op and comes back.

On targets that say how their libraries run a call (`Target.extra["library_calls"]`: the GPU
presets) each decision also carries the library call's modelled time, so that the planner can
give back to the library an op whose lowered kernels the time model finds far slower
(plan.py `_back_to_library`; `partition(..., give_back=...)` takes those ops and their reason).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from math import prod

import networkx as nx

from gir.frontend.basic import BasicGraph, BasicOp
from gir.frontend.errors import FrontendError
from gir.frontend.lower import lower_conv, lower_matmul, splice
from gir.ir.dtypes import itemsize
from gir.ir.target import Target

from .compose import MOVEMENT
from .epilogue import absorb_epilogues, describe

LIBRARY_KINDS = ("matmul", "conv")


@dataclass
class Decision:
    op: str
    library: bool
    flops: int
    bytes: int
    reason: str
    epilogue: str = ""  # what the library call absorbed (gir/fusion/epilogue.py), "" for nothing
    library_s: float | None = None  # modelled library call + a round trip of its output (None: no model)
    given_back: bool = False  # below the ridge, in the library by the planner's time check

    @property
    def intensity(self) -> float:
        return self.flops / max(self.bytes, 1)


@dataclass
class Partition:
    graph: BasicGraph                       # with memory-bound matmuls/convs lowered
    decisions: list[Decision]
    library: list[BasicOp]
    subgraphs: list[list[BasicOp]] = field(default_factory=list)


def op_cost(op: BasicOp, graph: BasicGraph) -> tuple[int, int]:
    """(FLOPs, DRAM bytes of inputs + output) of a matmul or convolution."""
    t = graph.tensors
    nbytes = sum(t[n].size * itemsize(t[n].dtype) for n in (*op.inputs, *op.outputs))
    out = t[op.outputs[0]]
    if op.kind == "matmul":
        k = t[op.inputs[0]].shape[-1]
        return 2 * out.size * k, nbytes
    w = t[op.inputs[1]].shape  # (M, C/group, *kernel)
    return 2 * out.size * prod(w[1:]), nbytes


def library_seconds(op: BasicOp, graph: BasicGraph, target: Target) -> float | None:
    """Modelled time of `op` as a library call, plus writing and re-reading its output once (the
    epilogue a fused GIR kernel would have kept in registers), or None where the target does not
    describe its library calls."""
    call = library_call_seconds(op, graph, target)
    return None if call is None else call + round_trip_seconds(op, graph, target)


def round_trip_seconds(op: BasicOp, graph: BasicGraph, target: Target) -> float:
    """Writing `op`'s output and reading it back once at copy bandwidth, plus the launch of the
    kernel that reads it: what a library call costs beyond itself where GIR would have fused."""
    out = graph.tensors[op.outputs[0]]
    return 2 * out.size * itemsize(out.dtype) / _copy_bandwidth(target) + target.launch_latency_s


def _copy_bandwidth(target: Target) -> float:
    """What a copy through DRAM achieves: the nominal bandwidth at the target's copy efficiency."""
    return target.dram_bandwidth * target.timing.copy_efficiency


def library_call_seconds(op: BasicOp, graph: BasicGraph, target: Target) -> float | None:
    """Modelled time of the library call alone (None: the target has no library model): FLOPs
    at the dtype's peak (the ridge point's) times the library's `flop_efficiency` for the op's
    kind (a dense conv's output channels rounded up to the library's `channel_block`), or bytes at
    the achievable copy bandwidth times the kind's `byte_efficiency` (1 where not measured),
    whichever is longer, plus a fixed `call_s` per call (a launch where the target has not
    measured one); grouped convs take their own figures where the target has them (`GROUPED`);
    an im2col conv ("convs": "im2col") also writes and reads its column matrix."""
    how = target.extra.get("library_calls")
    if not how:
        return None
    fixed = _figure(how, "call_s", op, target.launch_latency_s)
    efficiency = _figure(how, "flop_efficiency", op, 1.0)
    byte_share = _figure(how, "byte_efficiency", op, 1.0)
    flops, nbytes = op_cost(op, graph)
    t = graph.tensors
    flops *= padded_channels(op, graph, how.get("channel_block", 1))
    out = t[op.outputs[0]]
    if op.kind == "conv" and how.get("convs") == "im2col":
        x, w = t[op.inputs[0]], t[op.inputs[1]]
        nbytes += 2 * x.shape[0] * x.shape[1] * prod(w.shape[2:]) * prod(out.shape[2:]) * itemsize(out.dtype)
    peak = efficiency * target.ridge_point(t[op.inputs[0]].dtype) * target.dram_bandwidth
    return max(flops / peak, nbytes / (byte_share * _copy_bandwidth(target))) + fixed


def without_library_model(target: Target) -> Target:
    """`target` with the ridge rule alone (no `library_calls`, so no time check): for probes and
    experiments that time GIR's own kernels for ops a calibrated CPU would give to oneDNN."""
    from dataclasses import replace
    if "library_calls" not in target.extra:
        return target
    return replace(target, extra={k: v for k, v in target.extra.items() if k != "library_calls"})


GROUPED = "grouped_conv"  # a `library_calls` figure's key for convs of more than one group


def _figure(how: dict, figure: str, op: BasicOp, default: float) -> float:
    """`how[figure]` for the op's kind: a grouped conv's own entry where the target measured one
    (oneDNN's depthwise convs ran at 10-20% of the copy bandwidth, its dense convs compute-bound),
    else its kind's."""
    table = how.get(figure, {})
    if op.kind == "conv" and op.attrs.get("group", 1) != 1 and GROUPED in table:
        return table[GROUPED]
    return table.get(op.kind, default)


def padded_channels(op: BasicOp, graph: BasicGraph, block: int) -> float:
    """How many times its own FLOPs a dense conv costs a library that computes output channels in
    blocks of `block` (oneDNN's blocked layouts: 16 fp32 channels on AVX-512): SAR-DRN's conv to
    one channel ran 16x its FLOPs (gir/runtime/library_calls.py). Grouped and depthwise convs
    block over groups instead, and matmuls over their own tiles: 1."""
    if op.kind != "conv" or block <= 1 or op.attrs.get("group", 1) != 1:
        return 1.0
    m = graph.tensors[op.inputs[1]].shape[0]
    return -(-m // block) * block / m


def partition(graph: BasicGraph, target: Target, give_back: dict[str, str] | None = None) -> Partition:
    """`give_back`: op name -> why, for ops below the ridge that go to the library anyway."""
    give_back = give_back or {}
    graph = copy.copy(graph)
    graph.ops, graph.tensors = list(graph.ops), dict(graph.tensors)
    decisions, library = [], []
    for op in list(graph.ops):
        if op.kind not in LIBRARY_KINDS:
            continue
        flops, nbytes = op_cost(op, graph)
        intensity = flops / max(nbytes, 1)
        dtype = graph.tensors[op.inputs[0]].dtype
        ridge = target.ridge_point(dtype)
        above = intensity >= ridge
        reason = f"{intensity:.1f} FLOP/B {'>=' if above else '<'} {dtype} ridge {ridge:.1f} FLOP/B of {target.name}"
        library_s = library_seconds(op, graph, target)
        given_back = not above and op.name in give_back
        if given_back:
            above, reason = True, f"{reason}, but {give_back[op.name]}"
        lowered = None
        if not above:
            tensors = dict(graph.tensors)
            try:
                lowered = (lower_matmul if op.kind == "matmul" else lower_conv)(op, graph)
            except FrontendError as err:  # e.g. a half-precision conv just below the matrix-peak ridge whose
                graph.tensors = tensors   # window tensor exceeds the planner's tensor limit: the library keeps it
                above, reason = True, f"{reason}, but lowering it fails ({str(err).rsplit(': ', 1)[-1][:200]})"
        decisions.append(Decision(op.name, above, flops, nbytes, reason, library_s=library_s, given_back=given_back))
        if above:
            library.append(op)
        else:
            splice(graph, op, lowered)
    graph, library = absorb_epilogues(graph, library, target)
    said = {op.name: describe(op) for op in library}
    for d in decisions:
        if said.get(d.op):
            d.epilogue = said[d.op]
            d.reason += f"; epilogue: {d.epilogue}"
    memory = [op for op in graph.ops if op.kind not in LIBRARY_KINDS]
    return Partition(graph, decisions, library, convex_subgraphs(graph, memory))


def convex_subgraphs(graph: BasicGraph, memory: list[BasicOp]) -> list[list[BasicOp]]:
    """Connected components of memory-intensive ops, split where a path leaves through a
    library op and re-enters (each part then runs before or after that library call)."""
    dag = nx.DiGraph()
    producer = {t: op.name for op in graph.ops for t in op.outputs}
    by_name = {op.name: op for op in graph.ops}
    for op in graph.ops:
        dag.add_node(op.name)
        for t in op.inputs:
            if t in producer:
                dag.add_edge(producer[t], op.name)
    mem = {op.name for op in memory}
    depth = _library_depth(dag, mem)
    depth |= _movement_with_readers(dag, graph, by_name, mem, depth)
    undirected = nx.Graph()
    undirected.add_nodes_from(mem)
    undirected.add_edges_from((a, b) for a, b in dag.edges if a in mem and b in mem and depth[a] == depth[b])
    order = {op.name: i for i, op in enumerate(graph.ops)}
    parts = sorted(nx.connected_components(undirected), key=lambda p: min(order[n] for n in p))
    return [[by_name[n] for n in sorted(part, key=order.get)] for part in parts]


def _movement_with_readers(dag: nx.DiGraph, graph: BasicGraph, by_name, mem: set, depth) -> dict[str, int]:
    """Movement ops all of whose readers are memory ops of one later subgraph, with the depth
    of that subgraph: they join their readers instead of writing their result for them.
    RedNet's involution unfold (pad, 49 shifted slices, concat) feeds a multiply that also reads
    a library conv's output: left with its producer, the unfold would be written 49 times the
    size of its input for the next subgraph to read; moved, that subgraph reads the input
    through the window. A movement op that reads a part of a tensor computed where it was stays
    there (moved, the whole tensor would be written instead of the part). Depths stay
    non-decreasing along every edge, so the subgraphs stay convex."""
    producer = {t: op.name for op in graph.ops for t in op.outputs}
    outputs = set(graph.outputs)
    moved: dict[str, int] = {}
    for n in reversed(list(nx.topological_sort(dag))):
        op, readers = by_name[n], list(dag.successors(n))
        if n not in mem or op.kind not in (*MOVEMENT, "pad") or outputs & set(op.outputs) or not readers \
                or any(r not in mem for r in readers):
            continue
        at = {moved.get(r, depth[r]) for r in readers}
        if len(at) == 1 and (d := at.pop()) > depth[n]:
            moved[n] = d
    changed = True
    while changed:
        changed = False
        for n, d in list(moved.items()):
            op = by_name[n]
            shrinks = any(producer.get(x) in mem and producer[x] not in moved and graph.tensors[x].size > graph.tensors[op.outputs[0]].size
                          for x in op.inputs)
            stranded = any(moved.get(r, depth[r]) != d for r in dag.successors(n))
            if shrinks or stranded:
                del moved[n]
                changed = True
    return moved


def _library_depth(dag: nx.DiGraph, mem: set) -> dict[str, int]:
    """Library ops on the longest path to each op. Memory ops joined only at equal depth keep
    every subgraph convex: a path out through a library op and back in raises the depth."""
    depth = {}
    for n in nx.topological_sort(dag):
        depth[n] = max((depth[p] + (p not in mem) for p in dag.predecessors(n)), default=0)
    return depth
