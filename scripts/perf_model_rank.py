"""Does the analytical performance model (gir/fusion/perf.py) rank candidate kernels the way the
CPU (or, with --target cuda:sm_90, a GPU) runs them? For one memory-intensive subgraph, candidate kernel sequences are drawn from the
search's own generator, each is estimated by the model for the local CPU target, emitted by the
CPU emitter (all in one C file, one cc call), checked against onnxruntime and timed; the note
gives Kendall tau-b and Spearman between modelled and measured time, and where the model's pick
lands among the measured best.

    python scripts/perf_model_rank.py [--subgraph softmax|layernorm|gelu|dwconv_silu|gemv] [--count 40] [--out results/perf_model_rank]
    python scripts/perf_model_rank.py --target cuda:sm_90 --subgraphs attention softmax layernorm gelu gemv dwconv_silu
    python scripts/perf_model_rank.py --target cuda:sm_90 --dry-run --small --subgraphs softmax attention

With a CUDA target (`--target cuda:sm_90`) the model is `estimate` for that target and the
candidates are the GPU planner's; all of a subgraph's candidates are emitted by the CUDA
emitter into one source (one NVRTC compile), launched through CudaLauncher, checked against
onnxruntime, and timed with CUDA events on the launcher's stream: per round, a batch of calls
of one candidate after a spin kernel (host launch overhead is not timed), each call on the next
of enough device buffer sets to cycle 4x the L2 (`measure_gpu`). `--dry-run` runs the same path
without a GPU: the CUDA source on the CPU stand-in (RecordingLauncher, the C harness), times
from time.perf_counter, which the report says are no GPU times. Results go to
results/perf_model_rank_gpu[_dryrun]_<subgraph>.md/.json and a summary table.

How the candidates are formed, for softmax, layernorm and gelu: the subgraph's basic operators
are a chain in program order.
The search (gir/fusion/plan.py) groups them greedily while they share a parallel structure and
ranks, per group, every structure common to its operators (`common_structures`), rewritten. On
the CPU target that is only a handful (one unit per block, no shared memory), so the set is
widened with what the same machinery builds for every split of the chain into consecutive
groups: per group, each common structure, rewritten, and for groups of several operators also
un-rewritten (merged with device syncs, intermediates through DRAM). First come the search's
pick and every structure of the whole chain fused (when it fuses), then seeded draws (a split
uniformly, then one option per group uniformly), no duplicates.

For dwconv_silu, gemv and attention (convs and matmuls below the target's ridge point, so
`partition` lowers them into basic ops instead of calling a library: pad and layout ops folded
into the reads of a product and a reduction; attention's two batched matmuls on cuda:sm_90
around the softmax): `plan()` itself runs with its structure search recorded (`plan_space`),
and the same space is built over the ops of the one kernel it plans (in its order, a chain or a
DAG in topological order), from the candidates the planner offered each op (they read through
the folded layouts). Weights are constants with the graph's values; each
rotation set holds its own copy, so a large weight is not timed from the cache.
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
from onnx import TensorProto, helper

from gir.backends.cpu.compiler import build
from gir.backends.cpu.target import last_level_cache_bytes
from gir.backends.cpu.emitter import CpuEmitter
from gir.backends.errors import NoDeviceError
from gir.backends.kernels import split_kernels
from gir.frontend import load
from gir.fusion.group import common_structures, escaping_tensors
from gir.fusion.merge import merge_graphs
from gir.fusion.perf import Context, estimate
from gir.fusion.partition import without_library_model
from gir.ir import get_target
from gir.ir.dtypes import np_dtype
from gir.rewrite import optimize
from gir.templates import candidates

SUBGRAPHS = {  # name: (full shape, what it is)
    "softmax": ((1, 12, 128, 128), "BERT-base attention softmax"),
    "layernorm": ((1, 128, 768), "BERT-base LayerNorm"),
    "gelu": ((1, 128, 3072), "BERT-base FFN bias + GELU(erf)"),
    "dwconv_silu": ((1, 144, 56, 56), "EfficientNet-B0 depthwise 3x3 conv + bias + SiLU"),
    "gemv": ((1, 1, 768, 8192), "GPT-2 decode GEMV (x [1, 768] @ W [768, 8192]) + bias"),
    "attention": ((1, 12, 128, 64), "BERT-base self-attention core softmax(Q K^T / 8 + mask) V"),
}
SMALL = {"softmax": (1, 2, 8, 32), "layernorm": (1, 8, 64), "gelu": (1, 8, 64), "dwconv_silu": (1, 8, 12, 12),
         "gemv": (1, 1, 64, 256), "attention": (1, 2, 16, 8)}  # --small: shapes the CPU stand-in runs in seconds
CHAINS = ("softmax", "layernorm", "gelu")  # chains of elementwise and reduce ops: the split space
# input/output sets cycled through per timed call: four times the last-level cache, as on the
# GPU, so a candidate's inputs come from DRAM as the model assumes (with 32 MiB, the size of
# this EPYC's L3, a LayerNorm's 393 KB input was still there half the time and every kernel
# measured 2x faster than DRAM allows)
ROTATE_BYTES = 4 * max(last_level_cache_bytes(), 32 << 20)
PARTS = ("dram", "latency", "shared", "compute", "dispatch", "barrier", "launch")


def subgraph_model(kind: str, shape: tuple[int, ...]):
    """The subgraph as a one-input ONNX model, exported the way the zoo models are (opset 17)."""
    rng, last = np.random.default_rng(0), shape[-1]
    const = lambda name, v: helper.make_tensor(name, TensorProto.FLOAT, np.shape(v), np.ravel(v).astype(np.float32))
    io = lambda name, dims=shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))
    if kind == "attention":  # Q, K, V (batch, heads, seq, head size) and the additive mask, as BERT exports them
        seq = shape[2]
        nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), helper.make_node("MatMul", ["q", "kt"], ["s"]),
                 helper.make_node("Mul", ["s", "scale"], ["ss"]), helper.make_node("Add", ["ss", "mask"], ["sm"]),
                 helper.make_node("Softmax", ["sm"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
        g = helper.make_graph(nodes, kind, [io("q"), io("k"), io("v"), io("mask", (shape[0], 1, 1, seq))], [io("y")],
                              [const("scale", 1 / np.sqrt(shape[3]))])
        return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    if kind == "softmax":
        nodes, inits = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], []
    elif kind == "layernorm":
        nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12)]
        inits = [const("gamma", rng.normal(1, 0.1, last)), const("beta", rng.normal(0, 0.1, last))]
    elif kind == "dwconv_silu":
        c = shape[1]
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1] * 4, group=c),
                 helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
        inits = [const("w", rng.normal(0, 0.3, (c, 1, 3, 3))), const("b", rng.normal(0, 0.1, c))]
    elif kind == "gemv":
        m, k, n = shape[-3:] if len(shape) > 3 else (1, *shape[-2:])
        nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])]
        inits = [const("w", rng.normal(0, 0.05, (k, n))), const("b", rng.normal(0, 0.1, n))]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])
        return helper.make_model(helper.make_graph(nodes, kind, [x], [y], inits), ir_version=10,
                                 opset_imports=[helper.make_opsetid("", 17)])
    else:
        names = [("Add", ["x", "bias"], "h"), ("Div", ["h", "sqrt2"], "d"), ("Erf", ["d"], "e"),
                 ("Add", ["e", "one"], "a"), ("Mul", ["h", "a"], "m"), ("Mul", ["m", "half"], "y")]
        nodes = [helper.make_node(op, ins, [out]) for op, ins, out in names]
        inits = [const("bias", rng.normal(0, 0.1, last)), const("sqrt2", np.sqrt(2.0)), const("one", 1.0), const("half", 0.5)]
    g = helper.make_graph(nodes, kind, [io("x")], [io("y")], inits)
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


@dataclass(frozen=True)
class Option:
    """One GIR-Graph for the consecutive ops [start, stop): the `family`-th common structure."""
    start: int
    stop: int
    family: int
    rewritten: bool


class Space:
    """Every kernel sequence the search's machinery builds for the chain: a split into
    consecutive groups, and per group one of its options. Graphs are built on demand."""

    def __init__(self, graph, target, ops=None, per_op=None, escaping=None):
        """`ops` and `per_op`: a chain inside `graph` and the candidates of its ops (default:
        all of graph's ops, each op's own template candidates). `escaping`: what the planner
        counts as read outside the chain (default: what any other op reads; a layout folded
        into its reader is no reader, which only the planner knows)."""
        self.graph, self.target, self.ops = graph, target, graph.ops if ops is None else ops
        self.per_op = per_op or [candidates(op, graph.tensors, target).candidates for op in self.ops]
        self.estimates = {}  # Option -> the model's estimate (option_estimate)
        self.escaping = escaping
        self._choices, self._graphs = {}, {}

    def choices(self, start: int, stop: int) -> list:
        if (start, stop) not in self._choices:
            self._choices[start, stop] = common_structures(self.per_op[start:stop])
        return self._choices[start, stop]

    def options(self, start: int, stop: int) -> list[Option]:
        modes = (True, False) if stop - start > 1 else (True,)
        return [Option(start, stop, f, rw) for f in range(len(self.choices(start, stop))) for rw in modes]

    def splits(self) -> list[tuple[tuple[int, int], ...]]:
        """Splits of the chain into consecutive groups that each share a parallel structure."""
        n, out = len(self.ops), []
        for cuts in itertools.product((False, True), repeat=n - 1):
            bounds = [0, *(i + 1 for i, cut in enumerate(cuts) if cut), n]
            groups = tuple(zip(bounds, bounds[1:]))
            if all(self.choices(*grp) for grp in groups):
                out.append(groups)
        return out

    def size(self) -> int:
        return sum(int(np.prod([len(self.options(*grp)) for grp in split])) for split in self.splits())

    def graph_of(self, o: Option):
        """What plan._best builds: the chosen candidates merged (device syncs between writer and
        reader), then rewritten by Algorithm 1 when `rewritten`."""
        if o not in self._graphs:
            ops = self.ops[o.start:o.stop]
            name = "+".join(op.name for op in ops)
            escaping = escaping_tensors(self.graph, ops)
            if self.escaping is not None:  # read by another group of the chain, or outside it as the planner says
                escaping = {t for t in escaping if t in self.escaping or t in self._read_by_chain_outside(ops)}
            merged = merge_graphs(name, [c.graph for c in self.choices(o.start, o.stop)[o.family]], escaping)
            self._graphs[o] = optimize(merged)[0] if o.rewritten else merged
        return self._graphs[o]

    def _read_by_chain_outside(self, ops) -> set[str]:
        """Tensors the chain's other ops read, directly or through layouts folded into them."""
        inside, chain = {id(op) for op in ops}, {id(op) for op in self.ops}
        read = {t for op in self.ops if id(op) not in inside for t in op.inputs}
        folded = [op for op in self.graph.ops if id(op) not in chain]
        while True:
            more = {t for op in folded if read & set(op.outputs) for t in op.inputs} - read
            if not more:
                return read
            read |= more

    def describe(self, o: Option) -> str:
        short = [op.name.rsplit("/", 1)[-1].rsplit("_", 1)[0] for op in self.ops[o.start:o.stop]]
        labels = "/".join(_short_label(c) for c in self.choices(o.start, o.stop)[o.family])
        return f"[{'+'.join(short)}] {labels}{'' if o.rewritten else ' (not rewritten)'}"


def plan_space(graph, target) -> "Space":
    """The chain space of a subgraph that is not a plain chain of ops (a conv or matmul lowered
    into layouts folded into a product and a reduction): `plan()` runs once with its structure
    search recorded, and the space is built over the one fused group it forms, from the
    candidates the planner offered each op (reading through folded layouts)."""
    import gir.fusion.plan as planner
    offered, original, original_fuse = [], planner.common_structures, planner._fuse_group

    def recording(per_op):
        offered[-1]["per_op"] = per_op
        return original(per_op)

    def fuse(g, ops, **kw):  # plan() fuses two groupings (through folded layouts and not): note each group's
        offered.append({"ops": [op.name for op in ops], "escaping": set(kw["escaping"])})
        return original_fuse(g, ops, **kw)
    planner.common_structures, planner._fuse_group = recording, fuse
    try:
        result = planner.plan(graph, target, limit=2)
    finally:
        planner.common_structures, planner._fuse_group = original, original_fuse
    found = [o for o in offered if len(result.kernels) == 1 and o["ops"] == list(result.kernels[0].ops) and "per_op" in o]
    if not found:
        raise ValueError(f"{graph.model_name}: the plan has {len(result.kernels)} kernels from {len(offered)} fused groups; "
                         "this experiment needs exactly one")
    by_name = {op.name: op for op in result.graph.ops}
    ops = [by_name[name] for name in result.kernels[0].ops]
    return Space(result.graph, target, ops, found[0]["per_op"], found[0]["escaping"])


def _short_label(cand) -> str:
    keys = {"outputs_per_unit": "o", "chunk": "c", "rows": "r", "vec": "v", "units_per_block": "u",
            "blocks_per_output": "p", "whole": "w"}
    defaults = {"rows": 1, "vec": 1, "units_per_block": 1}
    params = ",".join(f"{keys.get(k, k)}{v}" for k, v in sorted(cand.params.items()) if defaults.get(k) != v)
    return f"{cand.structure}({params})" if params else cand.structure


def search_pick(space: Space) -> tuple[Option, ...]:
    """What plan() builds for the chain: greedy groups in program order (an op joins while the
    group still shares a structure), per group the rewritten structure the model ranks fastest
    (the first on ties, as plan._best keeps it)."""
    split, start = [], 0
    for stop in range(2, len(space.ops) + 1):
        if not space.choices(start, stop):
            split.append((start, stop - 1))
            start = stop - 1
    split.append((start, len(space.ops)))
    return tuple(min((o for o in space.options(*grp) if o.rewritten), key=lambda o: estimate(space.graph_of(o)).seconds)
                 for grp in split)


def select(space: Space, count: int, seed: int) -> list[tuple[Option, ...]]:
    """The search's pick; every structure of the whole chain as one group (rewritten), which the
    search ranks when the chain fuses; then seeded draws: a split uniformly, then one option per
    group uniformly. The whole space when it is no larger than `count`."""
    n = len(space.ops)
    chosen = dict.fromkeys([search_pick(space)] + [(o,) for o in space.options(0, n) if o.rewritten])
    splits = space.splits()
    if space.size() <= count:
        for split in splits:
            chosen.update(dict.fromkeys(itertools.product(*(space.options(*grp) for grp in split))))
        return list(chosen)
    rng = random.Random(seed)
    while len(chosen) < count:
        split = rng.choice(splits)
        chosen.setdefault(tuple(rng.choice(space.options(*grp)) for grp in split))
    return list(chosen)


def model_estimate(space: Space, seq) -> dict:
    """Modelled seconds of a sequence (the sum over its graphs, each in the context the ones
    before it leave: gir.fusion.perf.sequence) and of each term."""
    return summed(sequence_estimates(space, seq))


def summed(ests: list) -> dict:
    """A sequence's estimate from its kernels' (`sequence_estimates`), term by term."""
    out = {p: sum(e.parts[p] for e in ests) for p in PARTS}
    return out | {"seconds": sum(e.seconds for e in ests), "dram_bytes": sum(e.dram_bytes for e in ests),
                  "kernels": sum(e.kernels for e in ests), "bound": "+".join(e.bound for e in ests)}


def option_estimate(space: Space, o: Option, context: Context | None = None):
    """The model's estimate of one option in a context, computed once per space (candidates
    share options)."""
    key = (o, context or Context())
    if key not in space.estimates:
        space.estimates[key] = estimate(space.graph_of(o), context=key[1])
    return space.estimates[key]


def sequence_estimates(space: Space, seq) -> list:
    """Each option's estimate in the context the options before it leave. The first finds what
    the candidate's own previous call left, as `measure` calls it back to back: nothing cached
    (the next call uses the next rotation set) and the team idle for the one-thread work after
    its last fork (a first pass over the sequence finds how long)."""
    def run(context):
        out = []
        for o in seq:
            out.append(option_estimate(space, o, context))
            context = context.after(space.graph_of(o), out[-1])
        return out, context
    _, end = run(Context())
    return run(Context(idle_s=end.idle_s))[0]


def build_kernels(space: Space, options, emitter) -> tuple[dict, dict]:
    """One C file with every option's kernels (one cc call). Returns (option -> [(ctypes fn,
    kernel)]) and (option -> why it could not be emitted)."""
    sources, emitted, failed = [emitter.prelude()], {}, {}
    for i, o in enumerate(options):
        try:
            ks = [replace(k, name=f"o{i}_{k.name}") for k in split_kernels(space.graph_of(o))]
            sources += [emitter.kernel_source(k) for k in ks]
            emitted[o] = ks
        except Exception as err:  # an emitter rejection is a finding to report, not a crash
            failed[o] = f"{type(err).__name__}: {err}"
    lib = build("\n".join(sources), "perf_model_rank")
    fns = {}
    for o, ks in emitted.items():
        fns[o] = []
        for k in ks:
            fn = getattr(lib, k.name)
            fn.argtypes, fn.restype = [ctypes.c_void_p] * len(k.params), None
            fns[o].append((fn, k))
    return fns, failed


class Buffers:
    """Rotation sets of DRAM arrays: per set, one array per tensor of the graph (all candidates
    share them; each writes an intermediate before reading it) and per kernel-local buffer.
    Constants (weights, biases, folded copies of them) hold the graph's values and are never
    poisoned; each set has its own copy, so that a large weight rotates like an input instead of
    staying in the last-level cache between calls."""

    def __init__(self, graph, sets: int, seed: int):
        self.graph, rng = graph, np.random.default_rng(seed)
        consts = {n: np.ascontiguousarray(t.value, np_dtype(t.dtype)).reshape(-1)
                  for n, t in graph.tensors.items() if t.value is not None}
        self.sets = []
        for _ in range(sets):
            arrays = {n: np.empty(t.size, np_dtype(t.dtype)) for n, t in graph.tensors.items() if t.value is None}
            for n in graph.inputs:
                arrays[n][:] = rng.normal(0, 2, arrays[n].size)
            self.sets.append(arrays | {n: v.copy() for n, v in consts.items()})
        self.consts = set(consts)
        self.poison(0)

    def poison(self, s: int) -> None:
        """NaN in every non-input of set `s`: an element no kernel writes shows up in the check."""
        for n, a in self.sets[s].items():
            if n not in self.graph.inputs and n not in self.consts:
                a.fill(np.nan)

    def array(self, s: int, owner, buf) -> np.ndarray:
        arrays = self.sets[s]
        if buf.name in arrays:
            return arrays[buf.name]
        key = (owner, buf.name)  # kernel-local (two-phase partials)
        if key not in arrays:
            arrays[key] = np.empty(buf.size, np_dtype(buf.dtype))
        return arrays[key]

    def calls(self, s: int, seq, fns) -> list:
        """(fn, pointers) of every kernel of the sequence, bound to set `s`."""
        return [call for group in self.calls_by_option(s, seq, fns) for call in group]

    def calls_by_option(self, s: int, seq, fns) -> list[list]:
        """`calls`, one list per option of the sequence (what `measure` times one by one)."""
        return [[(fn, tuple(self.array(s, o, b).ctypes.data for b in k.params)) for fn, k in fns[o]] for o in seq]


def check(buffers: Buffers, seq, fns, reference: dict) -> str | None:
    """None when the sequence's outputs on set 0 match onnxruntime's, else what differs."""
    buffers.poison(0)
    for fn, args in buffers.calls(0, seq, fns):
        fn(*args)
    for name, want in reference.items():
        got = buffers.sets[0][name].reshape(want.shape)
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
            bad = ~np.isclose(got, want, rtol=1e-4, atol=1e-5)
            return f"{name}: {bad.sum()} of {bad.size} elements wrong, max error {np.nanmax(np.abs(got - want)):.3g}, {np.isnan(got).sum()} NaN"
    return None


def measure(bound: list[list], rounds: int, per_round: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Seconds of each call of every candidate, and of each of its options within the call
    (calls x options). `bound[c][s]` is candidate c's calls on set s, one list per option.
    Rounds interleave the candidates (in a seeded order each round) so that load from other
    processes spreads over all of them; each call uses the next set (continuing across rounds,
    so every set is used), so caches hold little. Each option is clocked on its own: a
    candidate's time is the sum, and the per-option times are what `scripts/perf_model_fit.py`
    fits the model's terms against."""
    times = [[] for _ in bound]
    clock, rng = time.perf_counter, random.Random(seed)
    for sets in bound:  # warm-up: page faults, OpenMP pool, instruction cache
        for groups in sets:
            for group in groups:
                for fn, args in group:
                    fn(*args)
    for _ in range(rounds):
        order = list(range(len(bound)))
        rng.shuffle(order)
        for c in order:
            sets = bound[c]
            for _ in range(per_round):
                groups = sets[len(times[c]) % len(sets)]
                parts = []
                for group in groups:
                    start = clock()
                    for fn, args in group:
                        fn(*args)
                    parts.append(clock() - start)
                times[c].append(parts)
    per_option = [np.array(t) for t in times]
    return [t.sum(axis=1) for t in per_option], per_option


def ranks(values) -> np.ndarray:
    """1-based ranks, tied values sharing their average rank."""
    v = np.asarray(values, float)
    r = np.empty(len(v))
    r[np.argsort(v, kind="stable")] = np.arange(1, len(v) + 1)
    for value in np.unique(v):
        r[v == value] = r[v == value].mean()
    return r


def kendall_tau_b(x, y) -> float:
    """(concordant - discordant) / sqrt(pairs untied in x * pairs untied in y)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    i, j = np.triu_indices(len(x), 1)
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    denominator = np.sqrt(np.count_nonzero(dx) * np.count_nonzero(dy))
    return float(np.sum(dx * dy) / denominator) if denominator else float("nan")


def spearman(x, y) -> float:
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def agreement(rows: list[dict], times: list[np.ndarray], rounds: int) -> dict:
    """Tau-b, Spearman, and where the model's pick (its fastest; ties: the first) lands. For
    scale: tau-b of the DRAM bytes and of the kernel count alone, of the measurement with itself
    (medians of the even rounds against the odd ones: the noise floor), and against the fastest
    call instead of the median (less sensitive to other jobs on the cores)."""
    modelled = [r["model"]["seconds"] for r in rows]
    measured = [r["measured"]["median_s"] for r in rows]
    pick = int(np.argmin(modelled))
    measured_ranks = ranks(measured)
    searched = next((i for i, r in enumerate(rows) if r["search_pick"]), None)
    halves = [[np.median(t.reshape(rounds, -1)[parity::2]) for t in times] for parity in (0, 1)]
    return {"kendall_tau_b": kendall_tau_b(modelled, measured), "spearman": spearman(modelled, measured),
            "tau_dram_bytes": kendall_tau_b([r["model"]["dram_bytes"] for r in rows], measured),
            "tau_kernels": kendall_tau_b([r["model"]["kernels"] for r in rows], measured),
            "tau_measurement_halves": kendall_tau_b(*halves) if rounds > 1 else float("nan"),
            "kendall_tau_b_min": kendall_tau_b(modelled, [r["measured"]["min_s"] for r in rows]),
            "model_pick": rows[pick]["id"], "model_pick_measured_rank": float(measured_ranks[pick]),
            "top1": measured_ranks[pick] == 1, "top5": measured_ranks[pick] <= 5,
            "model_pick_slowdown": float(measured[pick] / np.min(measured)),
            "model_ties_at_best": int(np.sum(np.asarray(modelled) == modelled[pick])),
            "search_pick_measured_rank": None if searched is None else float(measured_ranks[searched]),
            "search_pick_slowdown": None if searched is None else float(measured[searched] / np.min(measured))}


def candidate_space(kind: str, shape, count: int, seed: int, target):
    """(ONNX model, graph the kernels read, Space, drawn candidates, their distinct options)."""
    model = subgraph_model(kind, shape)
    graph = load(model)
    if kind in CHAINS:
        if any(op.kind not in ("elementwise", "reduce") for op in graph.ops):
            raise ValueError(f"{kind}: expected a chain of elementwise and reduce ops")
        space = Space(graph, target)
    else:
        space = plan_space(graph, target)
        graph = space.graph
    chosen = select(space, count, seed)
    return model, graph, space, chosen, list(dict.fromkeys(o for seq in chosen for o in seq))


def run(kind: str = "softmax", shape=None, count: int = 40, seed: int = 0, rounds: int = 10, per_round: int = 10) -> dict:
    """The whole experiment; returns everything the note and the JSON report."""
    shape = tuple(shape or SUBGRAPHS[kind][0])
    target = without_library_model(get_target("cpu"))  # GIR's kernels of the GEMV and conv are ranked
    start = time.perf_counter()
    model, graph, space, chosen, options = candidate_space(kind, shape, count, seed, target)
    fns, failed = build_kernels(space, options, CpuEmitter(target))
    build_s = time.perf_counter() - start
    buffers = Buffers(graph, _sets(graph, chosen, fns), seed)
    reference = _reference(model, buffers)
    rows, skipped = checked_rows(space, chosen, failed, lambda seq: check(buffers, seq, fns, reference))
    bound = [[buffers.calls_by_option(s, row["seq"], fns) for s in range(len(buffers.sets))] for row in rows]
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    times, per_option = measure(bound, rounds, per_round, seed)
    measure_s, loads = time.perf_counter() - start, (load_before, os.getloadavg()[0])
    for row, t, parts in zip(rows, times, per_option):
        seq = row.pop("seq")
        row["options"] = [{"option": space.describe(o), "key": [o.start, o.stop, o.family, o.rewritten],
                           "model_s": e.seconds, "median_s": float(np.median(parts[:, i]))}
                          for i, (o, e) in enumerate(zip(seq, sequence_estimates(space, seq)))]
        row["measured"] = {"median_s": float(np.median(t)), "min_s": float(t.min()), "p25_s": float(np.percentile(t, 25)),
                           "p75_s": float(np.percentile(t, 75)), "calls": len(t)}
    return finish(kind, shape, space, graph, chosen, rows, skipped, times, rounds, seed) | {
        "mode": "cpu", "load_average": loads, "rotation_sets": len(buffers.sets), "build_seconds": build_s,
        "measure_seconds": measure_s, "target": _target_facts(target), "copy_GBps": copy_bandwidth() / 1e9}


def checked_rows(space: Space, chosen, failed: dict, check_seq) -> tuple[list[dict], list[dict]]:
    """Rows of the candidates that were emitted and compute the reference's numbers (with their
    modelled estimate), and what was skipped and why: a wrong candidate is reported, not timed."""
    rows, skipped = [], []
    for c, seq in enumerate(chosen):
        desc = " | ".join(space.describe(o) for o in seq)
        why = next((failed[o] for o in seq if o in failed), None) or check_seq(seq)
        if why:
            skipped.append({"id": c, "candidate": desc, "reason": why})
        else:
            rows.append({"id": c, "candidate": desc, "search_pick": c == 0, "model": model_estimate(space, seq), "seq": seq})
    return rows, skipped


def finish(kind, shape, space: Space, graph, chosen, rows, skipped, times, rounds, seed) -> dict:
    """Ranks and agreement of timed rows, and the facts of the space, for the note and the JSON."""
    modelled = [r["model"]["seconds"] for r in rows]
    measured = [r["measured"]["median_s"] for r in rows]
    for row, m, t in zip(rows, ranks(modelled), ranks(measured)):
        row["model_rank"], row["measured_rank"] = float(m), float(t)
    chain = {op.name for op in space.ops}
    return {"subgraph": kind, "what": SUBGRAPHS[kind][1], "shape": list(shape), "ops": [op.name for op in space.ops],
            "folded_ops": [f"{op.name} ({op.kind})" for op in graph.ops if op.name not in chain],
            "space_size": space.size(), "splits": len(space.splits()),
            "candidates_per_op": [len(c) for c in space.per_op],
            "whole_chain_structures": len(space.choices(0, len(space.ops))),
            "drawn": len(chosen), "seed": seed, "rows": rows, "skipped": skipped,
            "agreement": agreement(rows, times, rounds) if len(rows) > 1 else None}


L2_BYTES = 50 << 20  # the H100's L2 (the target describes no L2 level)
GPU_ROTATE_BYTES = 4 * L2_BYTES  # what a GPU candidate cycles through between two uses of a set
SHARED_ABOVE = L2_BYTES // 4  # intermediates this large: one device buffer for all sets (DeviceSets)
SPIN_SOURCE = """
extern "C" __global__ void gir_spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {}
}
"""


class GpuRig:
    """How the cuda mode launches and clocks: CudaLauncher, the CUDA emitter, NVRTC and CUDA
    events on the launcher's stream; or, with `dry_run`, the CPU stand-in (RecordingLauncher
    running the same CUDA source through the C harness) and time.perf_counter, so that every
    step but the GPU's clock runs without a GPU (the times are then no GPU times)."""

    def __init__(self, target, dry_run: bool):
        self.target, self.dry_run, self.arch, self._events = target, dry_run, target.arch, []
        if dry_run:
            from gir.backends.harness.recording import RecordingLauncher, harness_toolchain
            self.launcher = RecordingLauncher("cuda")
            self.emitter, self.compile, self.static_shared = harness_toolchain("cuda")
            self.clock, self.rotate_bytes, self.max_sets = "time.perf_counter around the CPU stand-in (no GPU times)", 0, 3
            return
        from gir.backends.cuda.compiler import compile_cuda
        from gir.backends.cuda.emitter import STATIC_SHARED, CudaEmitter
        from gir.backends.cuda.launcher import CudaLauncher
        self.launcher = CudaLauncher()  # NoDeviceError without a GPU: run with --dry-run there
        self.emitter, self.compile, self.static_shared = CudaEmitter, compile_cuda, STATIC_SHARED
        self.clock, self.rotate_bytes, self.max_sets = "CUDA events on the launcher's stream", GPU_ROTATE_BYTES, 1024
        d = self._d = self.launcher._d
        err, khz = d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, self.launcher._dev)
        self.clock_hz = 1e3 * khz if err == d.CUresult.CUDA_SUCCESS and khz > 0 else 2e9  # the spin's cycles per second
        self.device = self.launcher._ck(d.cuDeviceGetName(128, self.launcher._dev)).split(b"\0")[0].decode()

    def source(self, sources: list[str]) -> str:
        return "\n".join(sources) + ("" if self.dry_run else SPIN_SOURCE)

    def load(self, binary, names) -> dict:
        self.spin = None if self.dry_run else self.launcher.load(binary, "gir_spin")
        return {n: self.launcher.load(binary, n) for n in names}

    def events(self, n: int) -> None:
        """At least n (start, stop) event pairs, created once (host clock readings in a dry run)."""
        while len(self._events) < n:
            self._events.append([0.0, 0.0] if self.dry_run else [self.launcher._ck(self._d.cuEventCreate(0)) for _ in range(2)])

    def start(self, slot: int, spin_s: float) -> None:
        """Before a timed batch: a spin kernel of spin_s, so that the launches after it are queued
        before the GPU reaches them (host launch overhead is then not what is timed)."""
        if self.dry_run:
            self._events[slot][0] = time.perf_counter()
            return
        self.launcher.launch(self.spin, 1, 1, 0, [np.int64(spin_s * self.clock_hz)])
        self.launcher._ck(self._d.cuEventRecord(self._events[slot][0], self.launcher.stream_handle))

    def stop(self, slot: int) -> None:
        if self.dry_run:
            self._events[slot][1] = time.perf_counter()
        else:
            self.launcher._ck(self._d.cuEventRecord(self._events[slot][1], self.launcher.stream_handle))

    def elapsed(self, slot: int) -> float:
        """Seconds between start and stop of the slot (after wait())."""
        if self.dry_run:
            return self._events[slot][1] - self._events[slot][0]
        return self.launcher._ck(self._d.cuEventElapsedTime(*self._events[slot])) / 1e3

    def wait(self) -> None:
        self.launcher.sync()

    def close(self) -> None:
        if not self.dry_run:
            for pair in self._events:
                for e in pair:
                    self._d.cuEventDestroy(e)
            self.launcher.close()


_FORKED = None  # (space, options) a forked worker of build_graphs reads


def _graphs_of(indices: list[int]) -> list:
    space, options = _FORKED
    return [space.graph_of(options[i]) for i in indices]


def build_graphs(space: Space, options, jobs: int) -> None:
    """Every option's GIR-Graph (merge and Algorithm 1's rewrite, most of the host's time for
    attention's hundred options), built over `jobs` forked processes into space's cache. The
    workers touch no GPU; the graphs come back pickled."""
    global _FORKED
    todo = [i for i, o in enumerate(options) if o not in space._graphs]
    if jobs <= 1 or len(todo) < 8:
        return
    import multiprocessing
    chunks = [todo[j::jobs] for j in range(jobs)]
    _FORKED = (space, options)
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            for chunk, graphs in zip(chunks, pool.map(_graphs_of, chunks)):
                space._graphs.update((options[i], g) for i, g in zip(chunk, graphs))
    finally:
        _FORKED = None


def build_gpu_kernels(space: Space, options, rig: GpuRig) -> tuple[dict, dict, object]:
    """Every option's kernels in one CUDA source and one compile (NVRTC; the stand-in keeps the
    source). A source the compiler rejects is compiled once per option to find the options to
    blame, then the rest once more. Returns (option -> [(function, kernel)]), (option -> why it
    could not be emitted or compiled) and the binary (its `resources` per kernel)."""
    from gir.backends.kernels import check_resources, check_shared
    emitter, sources, failed = rig.emitter(rig.target), {}, {}
    for i, o in enumerate(options):
        try:
            ks = [replace(k, name=f"o{i}_{k.name}") for k in split_kernels(space.graph_of(o))]
            if any(k.gathers for k in ks):
                raise ValueError("a kernel that gathers takes an index flag this experiment does not pass")
            check_shared(ks, rig.target, rig.static_shared)
            sources[o] = (ks, [emitter.kernel_source(k) for k in ks])
        except Exception as err:  # an emitter rejection is a finding to report, not a crash
            failed[o] = f"{type(err).__name__}: {err}"
    prelude = emitter.prelude()
    try:
        binary = rig.compile(rig.source([prelude] + [src for _, srcs in sources.values() for src in srcs]), rig.arch)
    except Exception:  # noqa: BLE001 -- find the options whose source the compiler rejects
        for o, (_, srcs) in list(sources.items()):
            try:
                rig.compile(rig.source([prelude] + srcs), rig.arch)
            except Exception as err:  # noqa: BLE001
                failed[o] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
                del sources[o]
        binary = rig.compile(rig.source([prelude] + [src for _, srcs in sources.values() for src in srcs]), rig.arch)
    for o, (ks, _) in list(sources.items()):
        try:
            check_resources(ks, binary.resources, rig.target)
        except Exception as err:  # a spilling kernel is what the device engine refuses to run
            failed[o] = f"{type(err).__name__}: {err}"
            del sources[o]
    loaded = rig.load(binary, [k.name for ks, _ in sources.values() for k in ks])
    return {o: [(loaded[k.name], k) for k in ks] for o, (ks, _) in sources.items()}, failed, binary


class DeviceSets:
    """Rotation sets in device memory: per set, a buffer for every tensor or kernel-local buffer
    an emitted kernel reads or writes; inputs random, constants the graph's values (a copy per
    set, so a weight rotates like an input). Intermediates above a quarter of the L2 are one
    buffer for all sets, as the runtime's arena reuses one address per run: every call writes
    them before reading them, and a copy per set of attention's 48 MiB broadcast products
    would take 13 GB."""

    def __init__(self, graph, launcher, fns: dict, sets: int, seed: int):
        self.graph, self.launcher, rng = graph, launcher, np.random.default_rng(seed)
        keys = {}  # key -> (elements, numpy dtype)
        for o, ks in fns.items():
            for _, k in ks:
                for b in k.params:
                    key = buffer_key(graph, o, b)
                    t = graph.tensors.get(b.name)
                    keys[key] = (t.size if t is not None else b.size, np_dtype(b.dtype))
        inputs, consts = set(graph.inputs), {n for n, t in graph.tensors.items() if t.value is not None}
        self.poisoned = [k for k in keys if k not in inputs and k not in consts]
        self.host_inputs, self.sets, self.bufs, shared = {}, [], [], {}
        for s in range(sets):
            arrays = {}
            for key, (size, dt) in keys.items():
                nbytes = max(1, size * dt.itemsize)
                if key in self.poisoned and nbytes > SHARED_ABOVE and key in shared:
                    arrays[key] = shared[key]
                    continue
                arrays[key] = buf = launcher.alloc(nbytes)
                self.bufs.append(buf)
                if key in inputs:
                    value = rng.normal(0, 2, size).astype(dt)
                    self.host_inputs.setdefault(key, value)
                    launcher.upload(buf, value)
                elif key in consts:
                    launcher.upload(buf, np.ascontiguousarray(graph.tensors[key].value, dt).reshape(-1))
                elif nbytes > SHARED_ABOVE:
                    shared[key] = buf
            self.sets.append(arrays)
        self.keys = keys
        launcher.synchronize()  # synchronous copies from pageable memory may still be in flight to the device

    def calls(self, s: int, seq, fns) -> list[tuple]:
        """(function, grid, block, dynamic shared bytes, args) of every kernel of the sequence on
        set `s`: as the device engine launches a plan's kernels, but with no dynamic shared
        memory (the CUDA emitter declares its shared arrays statically)."""
        arrays = self.sets[s]
        return [(fn, k.num_blocks, k.block_threads, 0,
                 [arrays[buffer_key(self.graph, o, b)] for b in k.params])
                for o in seq for fn, k in fns[o]]

    def check(self, seq, fns, reference: dict, rtol=1e-4, atol=1e-4) -> str | None:
        """None when the sequence's outputs on set 0 match the reference's, else what differs.
        Every non-input is NaN first, so an element no kernel writes shows up."""
        launcher, arrays, calls = self.launcher, self.sets[0], self.calls(0, seq, fns)
        touched = {buf: key for key, buf in arrays.items()}
        for key in dict.fromkeys(touched[buf] for call in calls for buf in call[4]):
            if key in self.poisoned:
                size, dt = self.keys[key]
                launcher.upload(arrays[key], np.full(size, np.nan if dt.kind == "f" else -1, dt))
        launcher.synchronize()  # the poison is on the device before the kernels (on another stream) run
        for call in calls:
            launcher.launch(*call)
        launcher.synchronize()
        for name, want in reference.items():
            got = np.empty(want.size, np_dtype(self.graph.tensors[name].dtype))
            launcher.download(arrays[name], got)
            got = got.reshape(want.shape)
            if not np.allclose(got, want, rtol=rtol, atol=atol):
                bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
                return (f"{name}: {bad.sum()} of {bad.size} elements wrong, max error "
                        f"{np.nanmax(np.abs(got - want)) if not np.isnan(got).all() else float('nan'):.3g}, {np.isnan(got).sum()} NaN")
        return None

    def close(self) -> None:
        for buf in self.bufs:
            self.launcher.free(buf)
        self.bufs.clear()


def measure_gpu(rig: GpuRig, bound: list[list], rounds: int, per_round: int, seed: int) -> list[np.ndarray]:
    """Seconds per call of every candidate, one value per round: a batch of `per_round` calls
    between two events, divided by `per_round`. Every call, whichever candidate's, uses the
    next rotation set, so no call finds the previous calls' data in the L2. Rounds take the
    candidates in a seeded order. Before each batch a spin kernel lasting twice the host's time
    to queue that batch (seen after a warm-up batch; 0.2 to 20 ms), so the GPU does not wait
    for the host inside a timed batch."""
    launcher, rng, used = rig.launcher, random.Random(seed), [0]
    rig.events(len(bound))

    def batch(c: int) -> None:
        sets = bound[c]
        for j in range(per_round):
            for call in sets[(used[0] + j) % len(sets)]:
                launcher.launch(*call)
        used[0] += per_round
    spin = []
    for c in range(len(bound)):  # warm-up (lazy module loading, first touch of the sets), then the host's queueing time
        batch(c)
        rig.wait()
        start = time.perf_counter()
        batch(c)
        spin.append(min(0.02, max(2e-4, 2 * (time.perf_counter() - start))))
        rig.wait()
    times = [[] for _ in bound]
    for _ in range(rounds):
        order = list(range(len(bound)))
        rng.shuffle(order)
        for c in order:
            rig.start(c, spin[c])
            batch(c)
            rig.stop(c)
        rig.wait()
        for c in order:
            times[c].append(rig.elapsed(c) / per_round)
    return [np.array(t) for t in times]


def run_gpu(kind: str, rig: GpuRig, shape=None, count: int = 24, seed: int = 0, rounds: int = 10, per_round: int = 20,
            jobs: int = 1) -> dict:
    """The experiment on a CUDA target: modelled by `estimate` for rig.target, emitted by the CUDA
    emitter (one source, one compile), checked against onnxruntime, timed per `measure_gpu`."""
    shape = tuple(shape or SUBGRAPHS[kind][0])
    start = time.perf_counter()
    model, graph, space, chosen, options = candidate_space(kind, shape, count, seed, rig.target)
    space_s = time.perf_counter() - start
    build_graphs(space, options, jobs)
    fns, failed, binary = build_gpu_kernels(space, options, rig)
    build_s = time.perf_counter() - start
    nsets = _sets(graph, chosen, fns, rig.rotate_bytes, rig.max_sets)
    sets = DeviceSets(graph, rig.launcher, fns, nsets, seed)
    try:
        reference = onnx_outputs(model, {n: sets.host_inputs[n].reshape(graph.tensors[n].shape) for n in graph.inputs})
        def check_seq(seq) -> str | None:  # a launch the stand-in or the driver rejects is a finding too
            try:
                return sets.check(seq, fns, reference)
            except Exception as err:  # noqa: BLE001
                return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        rows, skipped = checked_rows(space, chosen, failed, check_seq)
        check_s = time.perf_counter() - start - build_s
        bound = [[sets.calls(s, row["seq"], fns) for s in range(nsets)] for row in rows]
        start = time.perf_counter()
        times = measure_gpu(rig, bound, rounds, per_round, seed)
        measure_s = time.perf_counter() - start
    finally:
        sets.close()
    for row, t in zip(rows, times):
        seq = row.pop("seq")
        row["options"] = [{"option": space.describe(o), "key": [o.start, o.stop, o.family, o.rewritten],
                           "model_s": e.seconds} for o, e in zip(seq, sequence_estimates(space, seq))]
        row["registers"] = [getattr(binary.resources.get(k.name), "registers", None) for o in seq for _, k in fns[o]]
        row["touched_bytes"] = touched_bytes(graph, seq, fns)
        row["measured"] = {"median_s": float(np.median(t)), "min_s": float(t.min()), "p25_s": float(np.percentile(t, 25)),
                           "p75_s": float(np.percentile(t, 75)), "calls": len(t) * per_round, "rounds": len(t)}
    return finish(kind, shape, space, graph, chosen, rows, skipped, times, rounds, seed) | {
        "mode": "dry-run" if rig.dry_run else "cuda", "clock": rig.clock, "device": getattr(rig, "device", "CPU stand-in"),
        "per_round": per_round, "rotation_sets": nsets, "space_seconds": space_s, "build_seconds": build_s,
        "check_seconds": check_s, "measure_seconds": measure_s, "kernels_compiled": sum(len(v) for v in fns.values()),
        "target": _target_facts(rig.target)}


def copy_bandwidth() -> float:
    """Bytes read plus written per second by a numpy copy of ROTATE_BYTES on one thread: what the
    memory system here gives at the size the timing cycles through, next to the target's figure."""
    a = np.ones(ROTATE_BYTES // 4, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(6):
        start = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - start)
    return 2 * a.nbytes / best


def buffer_key(graph, option, buf):
    """A kernel argument's buffer: the graph tensor of that name, else the option's own local."""
    return buf.name if buf.name in graph.tensors else (option, buf.name)


def touched_bytes(graph, seq, fns) -> int:
    """Bytes a candidate's calls touch: its kernels' arguments (inputs, weights, outputs, the
    intermediates it writes, kernel-local buffers), each buffer once."""
    bufs = {buffer_key(graph, o, b): b.size * np_dtype(b.dtype).itemsize for o in seq for _, k in fns[o] for b in k.params}
    return sum(bufs.values())


def _sets(graph, seqs, fns, rotate_bytes: int = ROTATE_BYTES, most: int = 256) -> int:
    """How many rotation sets make every candidate cycle through more than `rotate_bytes`, by
    the bytes of the candidate touching fewest (`touched_bytes`)."""
    per_set = min((touched_bytes(graph, seq, fns) for seq in seqs if all(o in fns for o in seq)), default=rotate_bytes)
    return int(min(most, max(2, -(-rotate_bytes // max(per_set, 1)))))


def _reference(model, buffers: Buffers) -> dict:
    return onnx_outputs(model, {n: buffers.sets[0][n].reshape(buffers.graph.tensors[n].shape) for n in buffers.graph.inputs})


def onnx_outputs(model, feeds: dict) -> dict:
    """The model's outputs by onnxruntime, or by onnx's reference evaluator where onnxruntime
    is not installed (a GPU machine's image need not have it)."""
    try:
        import onnxruntime as ort
    except ImportError:
        from onnx.reference import ReferenceEvaluator
        return dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, feeds)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _target_facts(t) -> dict:
    """The target as ranked, with every timing figure: perf_model_fit.py re-scores a run with
    the calibration it was measured under, not the one the machine holds later."""
    return {"name": t.name, "processors": t.processors, "lanes_per_unit": t.lanes_per_unit,
            "dram_bandwidth_GBps": t.dram_bandwidth / 1e9, "peak_GFLOPs": t.peak_flops / 1e9,
            "launch_latency_us": t.launch_latency_s * 1e6, "max_units_per_processor": t.max_units_per_processor,
            "notes": t.notes, "timing": asdict(t.timing)}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def note(result: dict, command: str) -> str:
    """The Markdown note: setup, agreement, and the table sorted by measured time."""
    a, t = result["agreement"], result["target"]
    gpu = result.get("mode", "cpu") != "cpu"
    lines = [f"# Performance model ranking against measured time{' on a GPU' if gpu else ''}: {result['what']} "
             f"{tuple(result['shape'])}", ""]
    if not gpu:
        lines += [f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}: {cpu_name()}, {os.cpu_count()} cores, "
                  f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
                  f"1-minute load average {result['load_average'][0]:.2f} before the timing, {result['load_average'][1]:.2f} after "
                  f"(other jobs share the cores).", f"Command: `{command}`", "",
                  f"Target `cpu` as modelled: {t['processors']} processors, {t['lanes_per_unit']} lanes, DRAM "
                  f"{t['dram_bandwidth_GBps']:.0f} GB/s, {t['peak_GFLOPs']:.0f} GFLOP/s, launch {t['launch_latency_us']:.0f} us "
                  f"({t['notes']}). Here a numpy copy of {ROTATE_BYTES >> 20} MiB on one thread moves "
                  f"{result['copy_GBps']:.0f} GB/s (read + write).", ""]
        timing = (f"Time: median of {result['rows'][0]['measured']['calls'] if result['rows'] else 0} calls per candidate, "
                  f"interleaved in rounds, cycling {result['rotation_sets']} sets of arrays (inputs, weights, outputs, "
                  f"intermediates; each candidate touches at least {ROTATE_BYTES >> 20} MiB per cycle). Build "
                  f"{result['build_seconds']:.1f} s, measurement {result['measure_seconds']:.1f} s.")
    else:
        dry = result["mode"] == "dry-run"
        lines += [f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}: {result['device']}"
                  + (" -- DRY RUN: the CUDA source ran on the CPU stand-in (RecordingLauncher, C harness); the "
                     "measured times are host perf_counter times of that, NOT GPU times." if dry else "") + "",
                  f"Command: `{command}`", "",
                  f"**Modelled**: `estimate` (gir/fusion/perf.py, what the planner ranks by) for target `{t['name']}` "
                  f"({t['notes']}): {t['processors']} SMs, DRAM {t['dram_bandwidth_GBps']:.0f} GB/s, "
                  f"{t['peak_GFLOPs']:.0f} GFLOP/s, launch {t['launch_latency_us']:.0f} us. **Measured**: {result['clock']}.", ""]
        timing = (f"Emitted by the CUDA emitter, all candidates in one source and one compile ({result['kernels_compiled']} "
                  f"kernels), each checked against onnxruntime before timing. Time: per round, {result['per_round']} "
                  f"back-to-back calls of one candidate between two events (after a GPU spin, so host launch overhead "
                  f"is not timed) divided by {result['per_round']}; median over {result['rows'][0]['measured']['rounds'] if result['rows'] else 0} "
                  f"rounds (candidates in a seeded order per round); calls cycle {result['rotation_sets']} sets of device "
                  f"buffers (each candidate touches at least {GPU_ROTATE_BYTES >> 20} MiB per cycle, 4x the {L2_BYTES >> 20} MiB L2; "
                  f"intermediates above {SHARED_ABOVE >> 20} MiB are one buffer for all sets). Space {result['space_seconds']:.1f} s, "
                  f"build {result['build_seconds']:.1f} s, check {result['check_seconds']:.1f} s, measurement "
                  f"{result['measure_seconds']:.1f} s.")
    lines += [f"Ops: {', '.join(result['ops'])}"
              + (f" (read through, not kernels: {', '.join(result['folded_ops'])})" if result.get("folded_ops") else "")
              + f". Candidate space: {result['space_size']} kernel sequences over "
              f"{result['splits']} splits of the chain into groups sharing a structure ({result['whole_chain_structures']} "
              f"structures for the whole chain fused; candidates per op: {result.get('candidates_per_op')}). "
              f"{result['drawn']} candidates: the search's pick, each whole-chain "
              f"structure (rewritten), then seeded draws (split uniformly, then one option per group). " + timing, ""]
    if a:
        lines += [f"**Kendall tau-b {a['kendall_tau_b']:.3f}, Spearman {a['spearman']:.3f}** over {len(result['rows'])} "
                  f"candidates. Model's pick #{a['model_pick']} ({a['model_ties_at_best']} tied at the modelled best) "
                  f"is measured rank {a['model_pick_measured_rank']} (top-1: {a['top1']}, top-5: {a['top5']}), "
                  f"{a['model_pick_slowdown']:.2f}x the fastest measured. **Noise floor: tau-b of the measurement with "
                  f"itself (even rounds against odd) {a['tau_measurement_halves']:.3f}**. For scale, tau-b of the DRAM bytes alone "
                  f"{a['tau_dram_bytes']:.3f}, of the kernel count alone {a['tau_kernels']:.3f}; tau-b against the "
                  f"fastest call instead of the median {a['kendall_tau_b_min']:.3f}. The search's pick "
                  f"(#0) is measured rank {a['search_pick_measured_rank']}, {a['search_pick_slowdown'] or float('nan'):.2f}x "
                  f"the fastest.", ""]
    lines += ["| id | candidate (groups: ops, structure per op) | kernels | modelled us | dram | latency | compute | launch "
              "| measured us (p25-p75) | GB/s | modelled rank | measured rank |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(result["rows"], key=lambda r: r["measured"]["median_s"]):
        m, s = r["model"], r["measured"]
        us = lambda x: f"{x * 1e6:.1f}"
        lines.append(f"| {r['id']}{' (search pick)' if r['search_pick'] else ''} | {r['candidate'].replace('|', '&#124;')} | {m['kernels']} | "
                     f"{us(m['seconds'])} | {us(m['dram'])} | {us(m['latency'])} | {us(m['compute'])} | {us(m['launch'])} | "
                     f"{us(s['median_s'])} ({us(s['p25_s'])}-{us(s['p75_s'])}) | {m['dram_bytes'] / s['median_s'] / 1e9:.1f} | "
                     f"{r['model_rank']:g} | {r['measured_rank']:g} |")
    if result["skipped"]:
        lines += ["", "Skipped (wrong numbers or not emitted):", ""]
        lines += [f"- {s['id']}: {s['candidate']}: {s['reason']}" for s in result["skipped"]]
    lines += ["", "modelled: the time model's estimate and its terms; measured: the clock above. GB/s: the model's "
              "DRAM bytes (distinct elements) over the measured time."]
    return "\n".join(lines) + "\n"


def summary_row(result: dict) -> dict:
    """One line of the final table: the subgraph's agreement and its fastest measured candidate."""
    rows, a = result["rows"], result["agreement"] or {}
    best = min(rows, key=lambda r: r["measured"]["median_s"]) if rows else None
    return {"subgraph": result["subgraph"], "candidates": f"{len(rows)} timed of {result['drawn']} "
            f"({len(result['skipped'])} skipped; space {result['space_size']:.3g})",
            "tau_b": a.get("kendall_tau_b"), "noise_tau_b": a.get("tau_measurement_halves"),
            "pick_over_fastest": a.get("model_pick_slowdown"),
            "fastest": best and f"#{best['id']} {best['candidate']}".replace("|", "&#124;"),
            "fastest_us": best and best["measured"]["median_s"] * 1e6,
            "fastest_GBps": best and best["model"]["dram_bytes"] / best["measured"]["median_s"] / 1e9}


def summary(results: list[dict], errors: dict, measured: str) -> str:
    f = lambda v, fmt: "-" if v is None else format(v, fmt)
    lines = [f"measured: {measured}", "", "| subgraph | candidates | tau-b (modelled vs measured) | noise tau-b (measured vs "
             "itself) | pick / fastest | fastest measured candidate | its measured us | GB/s (modelled bytes) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in map(summary_row, results):
        lines.append(f"| {r['subgraph']} | {r['candidates']} | {f(r['tau_b'], '.3f')} | {f(r['noise_tau_b'], '.3f')} | "
                     f"{f(r['pick_over_fastest'], '.2f')} | {r['fastest'] or '-'} | {f(r['fastest_us'], '.1f')} | "
                     f"{f(r['fastest_GBps'], '.0f')} |")
    lines += [f"| {kind} | failed: {why} | | | | | | |" for kind, why in errors.items()]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subgraph", choices=sorted(SUBGRAPHS), default="softmax")
    ap.add_argument("--subgraphs", nargs="+", choices=sorted(SUBGRAPHS), default=None,
                    help="several subgraphs in one run (one device, one summary table)")
    ap.add_argument("--target", default="cpu", help="cpu (default) or a CUDA target such as cuda:sm_90")
    ap.add_argument("--dry-run", action="store_true", help="CUDA target without a GPU: the CPU stand-in runs the "
                    "CUDA source; times are host times, not GPU times")
    ap.add_argument("--small", action="store_true", help="each subgraph at a small shape (for --dry-run and tests)")
    ap.add_argument("--shape", type=lambda s: tuple(int(v) for v in s.split(",")), default=None)
    ap.add_argument("--count", type=int, default=None, help="candidates measured (the search's pick included); "
                    "default 40 on the CPU, 24 on a GPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None, help="default 10")
    ap.add_argument("--per-round", type=int, default=None, help="calls per candidate and round: default 10 on the "
                    "CPU, 20 on a GPU (one batch between two events)")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="processes that build the candidates' graphs (GPU targets; the CPU mode times on these cores)")
    ap.add_argument("--out", default=None, help="write OUT.md and OUT.json (one subgraph on the CPU)")
    ap.add_argument("--out-dir", default=None, help="write perf_model_rank[_gpu|_gpu_dryrun]_<subgraph>.md/.json and "
                    "the summary there (default results/ with a CUDA target)")
    args = ap.parse_args()
    kinds, gpu = args.subgraphs or [args.subgraph], args.target != "cpu"
    count = args.count or (24 if gpu else 40)
    rounds, per_round = args.rounds or 10, args.per_round or (20 if gpu else 10)
    if args.shape and len(kinds) > 1:
        ap.error("--shape takes one subgraph")
    command = "python " + " ".join(sys.argv)
    out_dir = args.out_dir or ("results" if gpu else None)
    prefix = "perf_model_rank" + ("_gpu_dryrun" if args.dry_run else "_gpu" if gpu else "")
    try:
        rig = GpuRig(get_target(args.target), args.dry_run) if gpu else None
    except NoDeviceError as err:
        sys.exit(f"{err}; --dry-run runs the same path on the CPU stand-in (no GPU times)")
    results, errors, started = [], {}, time.perf_counter()
    try:
        for kind in kinds:
            shape = args.shape or (SMALL[kind] if args.small else None)
            try:
                if gpu:
                    result = run_gpu(kind, rig, shape, count, args.seed, rounds, per_round, args.jobs)
                else:
                    result = run(kind, shape, count, args.seed, rounds, per_round)
            except Exception as err:  # noqa: BLE001 -- one subgraph's failure is reported; the others still run
                if len(kinds) == 1:
                    raise
                errors[kind] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                print(f"{kind}: {errors[kind]}", file=sys.stderr)
                continue
            results.append(result)
            text = note(result, command)
            print(text)
            outs = [args.out] if args.out and len(kinds) == 1 else []
            if out_dir:
                outs.append(os.path.join(out_dir, f"{prefix}_{kind}"))
            for out in outs:
                os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
                with open(out + ".md", "w") as f:
                    f.write(text)
                with open(out + ".json", "w") as f:
                    json.dump(result | {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.node()}: {cpu_name()}, "
                                       f"{os.cpu_count()} cores", "command": command}, f, indent=1, default=str)
    finally:
        if rig is not None:
            rig.close()
    if len(kinds) > 1 or gpu:
        table = summary(results, errors, rig.clock if rig else "time.perf_counter on the CPU")
        table += f"\nTotal {time.perf_counter() - started:.0f} s. Command: `{command}`\n"
        print(table)
        if out_dir:
            with open(os.path.join(out_dir, f"{prefix}_summary.md"), "w") as f:
                f.write(table)


if __name__ == "__main__":
    main()
