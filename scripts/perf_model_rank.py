"""Does the analytical performance model (gir/fusion/perf.py) rank candidate kernels the way the
CPU runs them? For one memory-intensive subgraph, candidate kernel sequences are drawn from the
search's own generator, each is estimated by the model for the local CPU target, emitted by the
CPU emitter (all in one C file, one cc call), checked against onnxruntime and timed; the note
gives Kendall tau-b and Spearman between modelled and measured time, and where the model's pick
lands among the measured best.

    python scripts/perf_model_rank.py [--subgraph softmax|layernorm|gelu|dwconv_silu|gemv] [--count 40] [--out results/perf_model_rank]

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

For dwconv_silu and gemv (a conv or matmul below the CPU's ridge point, so `partition` lowers
it into basic ops instead of calling a library: pad and layout ops folded into the reads of a
product and a reduction): `plan()` itself runs with its structure search recorded
(`plan_space`), and the same space is built over the ops of the one kernel it plans (in its
order, a chain or a DAG in topological order), from the candidates the planner offered each op
(they read through the folded layouts). Weights are constants with the graph's values; each
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
from dataclasses import dataclass, replace

import numpy as np
from onnx import TensorProto, helper

from gir.backends.cpu.compiler import build
from gir.backends.cpu.emitter import CpuEmitter
from gir.backends.kernels import split_kernels
from gir.frontend import load
from gir.fusion.group import common_structures, escaping_tensors
from gir.fusion.merge import merge_graphs
from gir.fusion.perf import estimate
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
}
CHAINS = ("softmax", "layernorm", "gelu")  # chains of elementwise and reduce ops: the split space
ROTATE_BYTES = 32 << 20  # input/output sets cycled through per timed call: well above L2 (2 MiB a core here)
PARTS = ("dram", "latency", "shared", "compute", "barrier", "launch")


def subgraph_model(kind: str, shape: tuple[int, ...]):
    """The subgraph as a one-input ONNX model, exported the way the zoo models are (opset 17)."""
    rng, last = np.random.default_rng(0), shape[-1]
    const = lambda name, v: helper.make_tensor(name, TensorProto.FLOAT, np.shape(v), np.ravel(v).astype(np.float32))
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
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
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
    offered, escaped, original, original_best = [], [], planner.common_structures, planner._best

    def recording(per_op):
        offered.append(per_op)
        return original(per_op)

    def best(choices, name, op_names, limit, escaping, lowers):
        escaped.append(set(escaping))
        return original_best(choices, name, op_names, limit, escaping, lowers)
    planner.common_structures, planner._best = recording, best
    try:
        result = planner.plan(graph, target, limit=2)
    finally:
        planner.common_structures, planner._best = original, original_best
    if len(result.kernels) != 1 or len(offered) != 1:
        raise ValueError(f"{graph.model_name}: the plan has {len(result.kernels)} kernels from {len(offered)} fused groups; "
                         "this experiment needs exactly one")
    by_name = {op.name: op for op in result.graph.ops}
    ops = [by_name[name] for name in result.kernels[0].ops]
    return Space(result.graph, target, ops, offered[0], escaped[0])


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
    """Modelled seconds of a sequence (the sum over its graphs) and of each term."""
    ests = [option_estimate(space, o) for o in seq]
    out = {p: sum(e.parts[p] for e in ests) for p in PARTS}
    return out | {"seconds": sum(e.seconds for e in ests), "dram_bytes": sum(e.dram_bytes for e in ests),
                  "kernels": sum(e.kernels for e in ests), "bound": "+".join(e.bound for e in ests)}


def option_estimate(space: Space, o: Option):
    """The model's estimate of one option, computed once per space (candidates share options)."""
    if o not in space.estimates:
        space.estimates[o] = estimate(space.graph_of(o))
    return space.estimates[o]


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


def run(kind: str = "softmax", shape=None, count: int = 40, seed: int = 0, rounds: int = 10, per_round: int = 10) -> dict:
    """The whole experiment; returns everything the note and the JSON report."""
    shape = tuple(shape or SUBGRAPHS[kind][0])
    model, target = subgraph_model(kind, shape), get_target("cpu")
    graph = load(model)
    start = time.perf_counter()
    if kind in CHAINS:
        if any(op.kind not in ("elementwise", "reduce") for op in graph.ops):
            raise ValueError(f"{kind}: expected a chain of elementwise and reduce ops")
        space = Space(graph, target)
        chosen = select(space, count, seed)
    else:
        space = plan_space(graph, target)
        graph = space.graph
        chosen = select(space, count, seed)
    options = list(dict.fromkeys(o for seq in chosen for o in seq))
    fns, failed = build_kernels(space, options, CpuEmitter(target))
    build_s = time.perf_counter() - start
    buffers = Buffers(graph, _sets(graph, chosen, fns), seed)
    reference = _reference(model, buffers)
    rows, skipped = [], []
    for c, seq in enumerate(chosen):
        desc = " | ".join(space.describe(o) for o in seq)
        why = next((failed[o] for o in seq if o in failed), None) or check(buffers, seq, fns, reference)
        if why:
            skipped.append({"id": c, "candidate": desc, "reason": why})
        else:
            rows.append({"id": c, "candidate": desc, "search_pick": c == 0, "model": model_estimate(space, seq), "seq": seq})
    bound = [[buffers.calls_by_option(s, row["seq"], fns) for s in range(len(buffers.sets))] for row in rows]
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    times, per_option = measure(bound, rounds, per_round, seed)
    measure_s, loads = time.perf_counter() - start, (load_before, os.getloadavg()[0])
    for row, t, parts in zip(rows, times, per_option):
        row["options"] = [{"option": space.describe(o), "key": [o.start, o.stop, o.family, o.rewritten],
                           "model_s": option_estimate(space, o).seconds, "median_s": float(np.median(parts[:, i]))}
                          for i, o in enumerate(row.pop("seq"))]
        row["measured"] = {"median_s": float(np.median(t)), "min_s": float(t.min()), "p25_s": float(np.percentile(t, 25)),
                           "p75_s": float(np.percentile(t, 75)), "calls": len(t)}
    modelled = [r["model"]["seconds"] for r in rows]
    measured = [r["measured"]["median_s"] for r in rows]
    for row, m, t in zip(rows, ranks(modelled), ranks(measured)):
        row["model_rank"], row["measured_rank"] = float(m), float(t)
    chain = {op.name for op in space.ops}
    return {"subgraph": kind, "what": SUBGRAPHS[kind][1], "shape": list(shape), "ops": [op.name for op in space.ops],
            "folded_ops": [f"{op.name} ({op.kind})" for op in graph.ops if op.name not in chain],
            "space_size": space.size(), "splits": len(space.splits()),
            "whole_chain_structures": len(space.choices(0, len(space.ops))), "load_average": loads,
            "drawn": len(chosen), "seed": seed, "rotation_sets": len(buffers.sets), "rows": rows, "skipped": skipped,
            "agreement": agreement(rows, times, rounds) if len(rows) > 1 else None,
            "build_seconds": build_s, "measure_seconds": measure_s, "target": _target_facts(target),
            "copy_GBps": copy_bandwidth() / 1e9}


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


def _sets(graph, seqs, fns) -> int:
    """How many rotation sets make every candidate cycle through more than ROTATE_BYTES: the
    bytes a candidate's calls touch (its kernels' arguments: inputs, weights, outputs, the
    intermediates it writes, kernel-local buffers) counted for the candidate touching fewest."""
    def touched(seq) -> int:
        bufs = {(b.name if b.name in graph.tensors else (o, b.name)): b.size * np_dtype(b.dtype).itemsize
                for o in seq for _, k in fns[o] for b in k.params}
        return sum(bufs.values())
    per_set = min((touched(seq) for seq in seqs if all(o in fns for o in seq)), default=ROTATE_BYTES)
    return int(min(64, max(2, -(-ROTATE_BYTES // max(per_set, 1)))))


def _reference(model, buffers: Buffers) -> dict:
    import onnxruntime as ort
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {n: buffers.sets[0][n].reshape(buffers.graph.tensors[n].shape) for n in buffers.graph.inputs}
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _target_facts(t) -> dict:
    return {"name": t.name, "processors": t.processors, "lanes_per_unit": t.lanes_per_unit,
            "dram_bandwidth_GBps": t.dram_bandwidth / 1e9, "peak_GFLOPs": t.peak_flops / 1e9,
            "launch_latency_us": t.launch_latency_s * 1e6, "max_units_per_processor": t.max_units_per_processor,
            "notes": t.notes}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def note(result: dict, command: str) -> str:
    """The Markdown note: setup, agreement, and the table sorted by measured time."""
    a, t = result["agreement"], result["target"]
    lines = [f"# Performance model ranking against measured time: {result['what']} {tuple(result['shape'])}", "",
             f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}: {cpu_name()}, {os.cpu_count()} cores, "
             f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
             f"1-minute load average {result['load_average'][0]:.2f} before the timing, {result['load_average'][1]:.2f} after "
             f"(other jobs share the cores).", f"Command: `{command}`", "",
             f"Target `cpu` as modelled: {t['processors']} processors, {t['lanes_per_unit']} lanes, DRAM "
             f"{t['dram_bandwidth_GBps']:.0f} GB/s, {t['peak_GFLOPs']:.0f} GFLOP/s, launch {t['launch_latency_us']:.0f} us "
             f"({t['notes']}). Here a numpy copy of {ROTATE_BYTES >> 20} MiB on one thread moves "
             f"{result['copy_GBps']:.0f} GB/s (read + write).", "",
             f"Ops: {', '.join(result['ops'])}"
             + (f" (read through, not kernels: {', '.join(result['folded_ops'])})" if result.get("folded_ops") else "")
             + f". Candidate space: {result['space_size']} kernel sequences over "
             f"{result['splits']} splits of the chain into groups sharing a structure ({result['whole_chain_structures']} "
             f"structures for the whole chain fused). {result['drawn']} candidates: the search's pick, each whole-chain "
             f"structure (rewritten), then seeded draws (split uniformly, then one option per group). Time: median of "
             f"{result['rows'][0]['measured']['calls'] if result['rows'] else 0} calls per candidate, interleaved in "
             f"rounds, cycling {result['rotation_sets']} sets of arrays (inputs, weights, outputs, intermediates; each candidate "
             f"touches at least {ROTATE_BYTES >> 20} MiB per cycle). Build {result['build_seconds']:.1f} s, "
             f"measurement {result['measure_seconds']:.1f} s.", ""]
    if a:
        lines += [f"**Kendall tau-b {a['kendall_tau_b']:.3f}, Spearman {a['spearman']:.3f}** over {len(result['rows'])} "
                  f"candidates. Model's pick #{a['model_pick']} ({a['model_ties_at_best']} tied at the modelled best) "
                  f"is measured rank {a['model_pick_measured_rank']} (top-1: {a['top1']}, top-5: {a['top5']}), "
                  f"{a['model_pick_slowdown']:.2f}x the fastest measured. For scale, tau-b of the DRAM bytes alone "
                  f"{a['tau_dram_bytes']:.3f}, of the kernel count alone {a['tau_kernels']:.3f}, of the measurement "
                  f"with itself (even rounds against odd) {a['tau_measurement_halves']:.3f}; tau-b against the "
                  f"fastest call instead of the median {a['kendall_tau_b_min']:.3f}. The search's pick "
                  f"(#0) is measured rank {a['search_pick_measured_rank']}, {a['search_pick_slowdown'] or float('nan'):.2f}x "
                  f"the fastest.", ""]
    lines += ["| id | candidate (groups: ops, structure per op) | kernels | model us | dram | latency | compute | launch "
              "| measured us (p25-p75) | GB/s | model rank | measured rank |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(result["rows"], key=lambda r: r["measured"]["median_s"]):
        m, s = r["model"], r["measured"]
        us = lambda x: f"{x * 1e6:.1f}"
        lines.append(f"| {r['id']}{' (search pick)' if r['search_pick'] else ''} | {r['candidate']} | {m['kernels']} | "
                     f"{us(m['seconds'])} | {us(m['dram'])} | {us(m['latency'])} | {us(m['compute'])} | {us(m['launch'])} | "
                     f"{us(s['median_s'])} ({us(s['p25_s'])}-{us(s['p75_s'])}) | {m['dram_bytes'] / s['median_s'] / 1e9:.1f} | "
                     f"{r['model_rank']:g} | {r['measured_rank']:g} |")
    if result["skipped"]:
        lines += ["", "Skipped (wrong numbers or not emitted):", ""]
        lines += [f"- {s['id']}: {s['candidate']}: {s['reason']}" for s in result["skipped"]]
    lines += ["", "GB/s: the model's DRAM bytes (distinct elements) over the measured time."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subgraph", choices=sorted(SUBGRAPHS), default="softmax")
    ap.add_argument("--shape", type=lambda s: tuple(int(v) for v in s.split(",")), default=None)
    ap.add_argument("--count", type=int, default=40, help="candidates measured (the search's pick included)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = ap.parse_args()
    result = run(args.subgraph, args.shape, args.count, args.seed, args.rounds, args.per_round)
    command = "python " + " ".join(sys.argv)
    text = note(result, command)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump(result | {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.node()}: {cpu_name()}, "
                               f"{os.cpu_count()} cores", "command": command}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
