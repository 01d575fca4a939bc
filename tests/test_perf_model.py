"""The time model (gir/fusion/perf.py): what it must rank the right way round on a GPU whose
kernels this machine cannot time, where its constants come from, and the CPU calibration."""
import json
import re

import numpy as np
import pytest
from onnx import TensorProto, helper

from gir.frontend import load
from gir.fusion.perf import Context, estimate, quick_estimate, sequence
from gir.fusion.plan import plan
from gir.ir import get_target
from gir.ir.target import PRESETS
from gir.ir.vector_access import wide_share
from gir.rewrite import optimize
from gir.templates import candidates
from gir.templates.pointwise import pointwise_candidates

H100 = get_target("cuda:sm_90")


def _single_op(op: str, shape, **attrs):
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], op.lower(), [io("x")], [io("y")])
    return load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def _twin(cands, structure, chunk, units_per_block, vec):
    return next(c for c in cands if c.structure == structure and c.params.get("chunk") == chunk
                and c.params["units_per_block"] == units_per_block and c.params.get("vec", 1) == vec)


@pytest.mark.parametrize("elements", [1 << 18, 1 << 20, 1 << 22, 1 << 24])
def test_256_thread_blocks_with_128_bit_loads_rank_above_32_thread_scalar_ones(elements):
    """Same op, same elements per lane: one 32-thread block per warp with scalar loads against
    8-warp blocks with 16-byte loads. On an H100 the first is held to 32 warps per SM by the
    resident-block limit and issues four times the memory instructions: it must rank below,
    and on kernels of 1 MB or more (all of these) never the other way round."""
    g = _single_op("Sigmoid", (elements // 1024, 1024))
    cands = candidates(g.ops[0], g.tensors, H100).candidates
    for chunk in (128, 256):
        narrow = estimate(optimize(_twin(cands, "chunk", chunk, 1, 1).graph)[0])
        wide_graph = optimize(_twin(cands, "chunk", chunk, 8, 4).graph)[0]
        wide = estimate(wide_graph)
        assert wide_share(wide_graph) == 1.0
        assert wide.seconds < narrow.seconds, (chunk, str(narrow), str(wide))


def test_no_kernel_of_a_megabyte_or_more_ranks_a_narrower_twin_first():
    """Every pointwise structure of a 4 MB elementwise op, against its twin with more threads per
    block and the same or wider accesses: the twin is never modelled slower."""
    g = _single_op("Relu", (1024, 1024))
    cands = candidates(g.ops[0], g.tensors, H100).candidates
    seconds = {(c.structure, c.params.get("rows"), c.params.get("chunk"), c.graph.prim.num_units, c.params["units_per_block"],
                c.params.get("vec", 1)): estimate(optimize(c.graph)[0]).seconds for c in cands}
    for (structure, rows, chunk, units, upb, vec), s in seconds.items():
        for (s2, r2, c2, units2, upb2, vec2), t in seconds.items():
            if (s2, r2, c2, units2) == (structure, rows, chunk, units) and upb2 >= upb and vec2 >= vec and upb2 * vec2 > upb * vec:
                assert t <= s * 1.0001, ((structure, rows, chunk, upb, vec), (upb2, vec2), s, t)


def test_a_64_mb_device_copy_is_modelled_at_85_to_95_percent_of_peak():
    """The range public H100 SXM measurements of a device-to-device copy report. The copy is the
    fastest of the pointwise template's plain-copy structures, as the search would shortlist it."""
    g = _single_op("Relu", (16384, 1024))  # 64 MB of float32
    op = g.ops[0]
    dims = g.tensors["x"].shape
    strides = (dims[1], 1)
    cands = pointwise_candidates(op, g.tensors, H100, dims, [("x", 0, strides)], strides, None, [])
    fastest = min(cands, key=lambda c: quick_estimate(c.graph).seconds)
    best = estimate(optimize(fastest.graph)[0])
    assert best.dram_bytes == 2 * 64 * 2 ** 20
    assert 0.85 <= best.bandwidth_share(H100) <= 0.95, str(best)


def test_the_planner_picks_wide_accesses_and_large_blocks_for_a_big_elementwise_chain():
    """The search itself, not a hand-picked candidate: bias + GELU(tanh form) over 16 MB on
    sm_90 plans one kernel whose every DRAM byte moves in 16-byte accesses, with at least 128
    threads per block and at least two blocks per SM."""
    n, c = 4096, 1024
    rng = np.random.default_rng(0)
    const = lambda name, v: helper.make_tensor(name, TensorProto.FLOAT, np.shape(v), np.ravel(v).astype(np.float32))
    nodes = [helper.make_node("Add", ["x", "bias"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Mul", ["h", "t"], ["y"])]
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [n, c])
    model = helper.make_model(helper.make_graph(nodes, "bias_act", [io("x")], [io("y")], [const("bias", rng.normal(size=c))]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    result = plan(load(model), H100, limit=2)
    (kernel,) = result.kernels
    prim = kernel.graph.prim
    assert wide_share(kernel.graph) > 0.99
    assert prim.units_per_block * H100.lanes_per_unit >= 128
    assert prim.num_blocks >= 2 * H100.processors


def test_every_preset_names_the_source_of_its_timing():
    for name, target in PRESETS.items():
        t = target.timing
        assert t.source and "nominal defaults" not in t.source, name
        assert 0.5 < t.copy_efficiency <= 1.0 and 100e-9 < t.dram_latency_s < 2e-6, name
        assert t.max_blocks_per_processor >= 1 and t.issue_per_clock > 0, name


def test_calibration_is_measured_stored_by_cpu_and_used_by_the_cpu_target(tmp_path, monkeypatch):
    from gir.backends.cpu import calibration
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration, "COPY_BYTES", 4 << 20)
    monkeypatch.setattr(calibration, "STREAM_BYTES", 8 << 20)
    before = get_target("cpu")
    assert "nominal" in before.timing.source
    lines = []
    cal = calibration.measure(repeats=2, progress=lines.append)
    from gir.runtime import onednn
    assert len(lines) == (14 if onednn.library() else 11) and cal.dependent_cycles > 0 and cal.copy_bandwidth > 0 and cal.unit_bandwidth > 0 and cal.launch_s > 0 and cal.issue_per_s > 0
    assert cal.wake_s > 0 and cal.spin_s > 0 and cal.warm_bandwidth > 0 and cal.warm_unit_bandwidth > 0
    assert cal.hot_unit_bandwidth > 0
    assert 1.0 <= cal.stream_gain <= 2.0 and 0.25 <= cal.adjacent_stream_gain <= 2.0
    # every math op the probes cover is measured, and an op the compiler vectorises (div) costs
    # less per element than a libm call it cannot (tanh)
    assert set(cal.op_costs) == set(calibration.OP_PROBES.values())
    assert cal.op_costs["div"] < cal.op_costs["tanh"]
    path = calibration.save(cal)
    assert path.parent == tmp_path / "calibration" and json.loads(path.read_text())["cpu"] == cal.cpu
    after = get_target("cpu")
    assert after.dram_bandwidth == cal.copy_bandwidth and after.launch_latency_s == cal.launch_s
    assert after.timing.unit_bandwidth == cal.unit_bandwidth and "measured" in after.timing.source
    assert after.timing.wake_s == cal.wake_s and dict(after.timing.op_cost) == cal.op_costs
    assert after.timing.spin_s == cal.spin_s and after.timing.warm_bandwidth == cal.warm_bandwidth
    assert after.timing.stream_gain == cal.stream_gain and after.timing.hot_unit_bandwidth == cal.hot_unit_bandwidth
    assert after.timing.adjacent_stream_gain == cal.adjacent_stream_gain
    assert after.extra.get("library_calls") == cal.library_calls  # None without oneDNN: no library model
    assert (cal.library_calls is None) == (onednn.library() is None)
    assert repr(after) != repr(before)  # the plan cache's key changes with the figures
    path.write_text("{not json")
    assert "nominal" in get_target("cpu").timing.source  # unreadable: nominal again, no crash


def test_a_calibration_belongs_to_the_build_flags_it_measured(tmp_path, monkeypatch):
    """Figures measured with one build (256-bit vectors) are not another's (512-bit): the stored
    calibration's key holds the kernels' flags, so other flags find none and plan nominally."""
    from gir.backends.cpu import calibration, compiler
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    mine = calibration._path()
    monkeypatch.setattr(compiler, "FLAGS", tuple(f for f in compiler.FLAGS if "vector-width" not in f) + ("-O2",))
    assert calibration._path() != mine and calibration._path().parent == mine.parent


def test_gir_compile_plans_wide_accesses_end_to_end_and_reports_compiled_occupancy(tmp_path):
    """`gir compile` of a 4 MB bias + tanh-gate model for sm_90: the PTX of the planned kernel
    has 128-bit loads and stores, and plan.json gives each launch ptxas's registers and the
    time model's figures recomputed with them."""
    import onnx
    from gir.cli import main
    rng = np.random.default_rng(1)
    n, c = 1024, 1024
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [c], rng.normal(size=c).astype(np.float32))
    nodes = [helper.make_node("Add", ["x", "bias"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Mul", ["h", "t"], ["y"])]
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [n, c])
    model = helper.make_model(helper.make_graph(nodes, "gate", [io("x")], [io("y")], [bias]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, tmp_path / "gate.onnx")
    assert main(["compile", str(tmp_path / "gate.onnx"), "--target", "cuda:sm_90", "-o", str(tmp_path / "out"), "--quiet"]) == 0
    ptx = "\n".join(p.read_text() for p in (tmp_path / "out").rglob("*.ptx"))
    assert re.search(r"ld\.global(\.nc)?\.v4\.f32", ptx) and "st.global.v4.f32" in ptx
    plan_json = json.loads((tmp_path / "out" / "plan.json").read_text())
    (launch,) = [s for s in plan_json["steps"] if s["kind"] == "launch"]
    assert launch["block"][0] >= 128 and launch["registers"] > 0
    assert launch["modelled_us"] > 0 and 0 < launch["modelled_occupancy"] <= 1 and 0 < launch["modelled_peak_share"] < 1


def test_a_small_constant_every_unit_rereads_costs_the_cpu_no_cache_traffic():
    """A bias (2 KiB) that every unit reads is an L1 hit on a CPU: its re-reads leave the DRAM
    term's cache share, where a GPU's model keeps them (gir/fusion/perf.py _cache_rereads)."""
    from gir.fusion.perf import _cache_rereads
    from gir.ir.cost import accesses, dram_footprint_by_buffer, level_bytes, valid_count
    from gir.ir.dtypes import itemsize
    from gir.ir.target import DRAM
    bias = helper.make_tensor("b", TensorProto.FLOAT, [512], np.random.default_rng(0).standard_normal(512).astype(np.float32))
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [256, 512])
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "bias", [io("x")],
                                                [io("y")], [bias]), opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    for target, bias_rereads_counted in ((get_target("cpu"), False), (H100, True)):
        (kernel,) = plan(load(model), target).kernels
        g = kernel.graph
        footprint = dram_footprint_by_buffer(g)
        rereads = sum(level_bytes(g).values()) - sum(footprint.values())
        bias_reads = sum(valid_count(s, g.prim) * itemsize(buf.dtype) for _, _, s, buf in accesses(g, DRAM) if s.buffer == "b")
        bias_rereads = bias_reads - footprint["read", "b"]
        assert bias_rereads > 0, "every unit reads the bias"
        assert _cache_rereads(g, footprint)[0] == (rereads if bias_rereads_counted else rereads - bias_rereads)


def _cpu_with(**timing):
    from dataclasses import replace
    cpu = get_target("cpu")
    return replace(cpu, timing=replace(cpu.timing, **timing))


def _chain_graph(target, n: int, rewritten: bool):
    """Exp then Neg over n floats as one GIR-Graph: fused into one kernel (rewritten) or two
    kernels joined through a DRAM intermediate (merged, not rewritten)."""
    from gir.fusion.merge import merge_graphs
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [n])
    model = helper.make_model(helper.make_graph([helper.make_node("Exp", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])],
                                                "chain", [io("x")], [io("y")]), opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    g = load(model)
    first = next(c for c in candidates(g.ops[0], g.tensors, target).candidates if c.structure == "chunk")
    second = next(c for c in candidates(g.ops[1], g.tensors, target).candidates if c.graph.prim == first.graph.prim)
    merged = merge_graphs("chain", [first.graph, second.graph], escaping={"y"})
    return optimize(merged)[0] if rewritten else merged


def test_cpu_launch_cost_follows_the_emitters_one_thread_rule_per_kernel():
    """Two kernels that each move under the one-thread bound fork no team even though the
    graph's buffers together exceed it (the emitter decides per kernel: gir/ir/one_thread.py);
    a kernel that forks pays `wake_s` when the team sleeps, and a fork right after it only the
    spinning team's launch latency."""
    small = 48 << 10  # floats: 192 KiB per tensor; each kernel touches two (384 KiB), the graph three (576 KiB)
    per_kernel = _cpu_with(serial_below_bytes=512 << 10, wake_s=40e-6)
    split = _chain_graph(per_kernel, small, rewritten=False)
    assert estimate(split).kernels == 2 and estimate(split).parts["launch"] == 0.0
    fused = _chain_graph(per_kernel, small, rewritten=True)  # one kernel, x and y: 384 KiB
    assert estimate(fused).kernels == 1 and estimate(fused).parts["launch"] == 0.0
    teams = _cpu_with(serial_below_bytes=1, wake_s=40e-6)
    asleep = estimate(_chain_graph(teams, small, rewritten=False), context=Context(idle_s=float("inf")))
    assert asleep.parts["launch"] == pytest.approx(40e-6 + teams.launch_latency_s)
    awake = estimate(_chain_graph(teams, small, rewritten=False))  # alone: a kernel ran just before
    assert awake.parts["launch"] == pytest.approx(2 * teams.launch_latency_s)


def test_the_gpu_presets_keep_the_cpu_only_terms_off():
    assert all(t.timing.wake_s == 0 and not t.timing.op_cost and t.timing.unit_setup is None for t in PRESETS.values())
    assert all(t.timing.cache_bytes == 0 and t.timing.spin_s == 0 and t.timing.unit_bandwidth == 0
               and t.timing.warm_bandwidth == 0 for t in PRESETS.values())

def test_measured_op_costs_replace_the_nominal_table():
    """A target whose calibration measured tanh as a libm call per element (hundreds of
    unit-instructions) models a tanh kernel as compute-bound; the nominal table does not."""
    n = 64 << 10
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [n])
    model = helper.make_model(helper.make_graph([helper.make_node("Tanh", ["x"], ["y"])], "t", [io("x")], [io("y")]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    g = load(model)
    costs = {}
    for label, target in (("nominal", _cpu_with(op_cost=())), ("measured", _cpu_with(op_cost=(("tanh", 800.0),)))):
        cand = next(c for c in candidates(g.ops[0], g.tensors, target).candidates if c.structure == "chunk")
        costs[label] = estimate(optimize(cand.graph)[0])
    assert costs["measured"].parts["compute"] > 10 * costs["nominal"].parts["compute"]
    assert costs["measured"].bound == "compute"


def _chain_kernels(target, n: int):
    """The Exp and the Neg of the chain as two separate graphs (two kernels run in turn)."""
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [n])
    model = helper.make_model(helper.make_graph([helper.make_node("Exp", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])],
                                                "chain", [io("x")], [io("y")]), opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    g = load(model)
    return [optimize(next(c for c in candidates(op, g.tensors, target).candidates if c.structure == "chunk").graph)[0]
            for op in g.ops]


def test_a_kernel_reads_what_the_kernel_before_it_wrote_from_the_last_level_cache():
    """CPU: the Neg after the Exp reads h from the cache (`Context`): its streaming terms fall
    against the Neg estimated alone, by the cache's share of h where h is larger than the
    cache; x, the sequence's input, and the writes stay DRAM's. A GPU preset has no such
    term: its estimates in sequence are the estimates alone."""
    n = 1 << 20  # 4 MiB per tensor
    cached = _cpu_with(cache_bytes=64 << 20, serial_below_bytes=1)
    exp_alone, neg_alone = (estimate(k) for k in _chain_kernels(cached, n))
    exp_seq, neg_seq = sequence(_chain_kernels(cached, n))
    assert exp_seq.parts == exp_alone.parts  # nothing ran before it
    assert neg_seq.parts["dram"] < neg_alone.parts["dram"] and neg_seq.parts["latency"] < neg_alone.parts["latency"]
    reads_from_dram = 4 * n / (cached.dram_bandwidth * cached.timing.copy_efficiency)
    assert neg_alone.parts["dram"] - neg_seq.parts["dram"] == pytest.approx(reads_from_dram - 4 * n / cached.timing.warm_bandwidth)
    small = _cpu_with(cache_bytes=1 << 20, serial_below_bytes=1)  # a quarter of h
    _, neg_part = sequence(_chain_kernels(small, n))
    assert neg_seq.parts["latency"] < neg_part.parts["latency"] < neg_alone.parts["latency"]
    gpu = _chain_kernels(H100, n)
    assert [e.parts for e in sequence(gpu)] == [estimate(k).parts for k in gpu]


def test_a_one_thread_kernel_reads_what_the_one_before_wrote_from_its_own_core_cache():
    """CPU: where both kernels run on one thread and h fits the core's own cache (`hot_bytes`),
    the Neg streams h at `hot_unit_bandwidth` instead of the last-level rate; a larger h, or a
    Neg whose team forks, keeps the last-level rate."""
    n = 1 << 16  # 256 KiB per tensor
    base = dict(cache_bytes=64 << 20, serial_below_bytes=64 << 20, warm_bandwidth=40e9, warm_unit_bandwidth=25e9)
    hot = _cpu_with(**base, hot_bytes=1 << 20, hot_unit_bandwidth=80e9)
    cold = _cpu_with(**base, hot_bytes=0, hot_unit_bandwidth=80e9)
    _, neg_hot = sequence(_chain_kernels(hot, n))
    _, neg_cold = sequence(_chain_kernels(cold, n))
    h = 4 * n
    assert neg_cold.parts["dram"] - neg_hot.parts["dram"] == pytest.approx(h / 40e9 - h / 80e9)
    assert neg_cold.parts["latency"] - neg_hot.parts["latency"] == pytest.approx(h / 25e9 - h / 80e9)
    small = _cpu_with(**base, hot_bytes=h // 2, hot_unit_bandwidth=80e9)  # h does not fit
    assert sequence(_chain_kernels(small, n))[1].parts == neg_cold.parts
    team = _cpu_with(**(base | {"serial_below_bytes": 1}), hot_bytes=1 << 20, hot_unit_bandwidth=80e9)
    team_cold = _cpu_with(**(base | {"serial_below_bytes": 1}), hot_bytes=0, hot_unit_bandwidth=80e9)
    assert sequence(_chain_kernels(team, n))[1].parts == sequence(_chain_kernels(team_cold, n))[1].parts


def test_a_one_thread_kernel_overlaps_streaming_and_compute_unless_its_lanes_reduce_rows_of_their_own():
    """A row max over [128, 768] on one thread: where a unit reduces its rows one at a time
    (unit forms), streaming and arithmetic overlap (the larger of the two); where each lane
    reduces a row of its own (lane forms), the thread waits for the loads and the terms add."""
    from gir.fusion.perf import _program
    cpu = _cpu_with(serial_below_bytes=64 << 20)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 768])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 1])
    g = load(helper.make_model(helper.make_graph([helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=1)],
                                                 "rowmax", [x], [y]), opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    forms = {(c.structure, c.params.get("outputs_per_unit")): c.graph for c in candidates(g.ops[0], g.tensors, cpu).candidates}
    for key, lanes_own_rows in ((("unit", 1), False), (("unit", 4), False), (("lane", 8), True)):
        graph = forms[key]
        e = estimate(graph)
        assert _program(graph).rows_in_lanes is lanes_own_rows
        stream = max(e.parts["dram"], e.parts["latency"])
        core = e.seconds - e.parts["barrier"] - e.parts["launch"] - e.parts["shared"] - e.parts["dispatch"]
        want = stream + e.parts["compute"] if lanes_own_rows else max(stream, e.parts["compute"])
        assert core == pytest.approx(want), key


def test_the_core_cache_is_the_level_below_the_last():
    from gir.backends.cpu import target as cpu_target
    cases = [({1: {"0": 48 << 10, "1": 48 << 10}, 2: {"0": 2 << 20, "1": 2 << 20}, 3: {"0-1": 480 << 20}}, 2 << 20),
             ({1: {"0": 32 << 10}, 2: {"0-3": 4 << 20}}, 0), ({}, 0)]
    for caches, want in cases:
        cpu_target._caches.cache_clear()
        cpu_target.core_cache_bytes.cache_clear()
        original = cpu_target._caches
        try:
            cpu_target._caches = lambda caches=caches: caches
            assert cpu_target.core_cache_bytes() == want
        finally:
            cpu_target._caches = original
            cpu_target.core_cache_bytes.cache_clear()


def test_a_fork_after_long_one_thread_work_pays_the_wake_up():
    """The context carries whether the team still spins: after a one-thread kernel that runs
    longer than the target's spins, the next fork pays `wake_s`; after a short one, the launch
    latency; a team kernel keeps the team awake."""
    n = 1 << 20
    one_thread_first = _cpu_with(serial_below_bytes=9 << 20, wake_s=40e-6, spin_s=1e-9)
    exp, neg = _chain_kernels(one_thread_first, n)
    team = _cpu_with(serial_below_bytes=1, wake_s=40e-6, spin_s=1e-9)
    _, team_neg = _chain_kernels(team, n)
    after_long = estimate(team_neg, context=Context().after(exp, estimate(exp)))
    assert after_long.parts["launch"] == pytest.approx(40e-6)
    spinning = _cpu_with(serial_below_bytes=1, wake_s=40e-6, spin_s=1.0)  # spins outlast the Exp
    _, spinning_neg = _chain_kernels(spinning, n)
    after_short = estimate(spinning_neg, context=Context().after(exp, estimate(exp)))
    assert after_short.parts["launch"] == pytest.approx(team.launch_latency_s)
    after_team = estimate(team_neg, context=Context(idle_s=1.0).after(team_neg, estimate(team_neg)))
    assert after_team.parts["launch"] == pytest.approx(team.launch_latency_s)


def test_a_broadcast_element_is_no_cpu_reread():
    """A row's sum read along a stride-0 axis (softmax's divide) is one load per unit on a
    CPU: no re-read bytes from it, where a GPU's model still counts them."""
    from gir.fusion.perf import _cache_rereads
    from gir.ir.cost import dram_footprint_by_buffer
    io = lambda name, s: helper.make_tensor_value_info(name, TensorProto.FLOAT, s)
    model = helper.make_model(helper.make_graph([helper.make_node("Div", ["x", "s"], ["y"])], "div",
                                                [io("x", [512, 256]), io("s", [512, 1])], [io("y", [512, 256])]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    g = load(model)
    for target, counted in ((get_target("cpu"), False), (H100, True)):
        row = next(c for c in candidates(g.ops[0], g.tensors, target).candidates if c.structure == "row")
        graph = optimize(row.graph)[0]
        rereads, _ = _cache_rereads(graph, dram_footprint_by_buffer(graph))
        assert (rereads > 0) == counted, target.name


def test_a_cpu_unit_gathering_its_elements_costs_an_instruction_per_element():
    """A Move whose offsets are not one run of consecutive addresses (a plane apart: a lowered
    1x1 conv's channels) is a gather on a CPU, an element an instruction; the same Move over
    consecutive addresses is a vector load per SIMD width. A stride-0 axis is a repeat, not a
    gather."""
    from gir.fusion.perf import _gathered, _program
    from gir.ir import DRAM, REGISTER, GIRGraph, Move, ParallelPrimitive, Slice
    cpu = get_target("cpu")

    def unit_instructions(strides):
        g = GIRGraph("g", ParallelPrimitive((4,), 1), cpu)
        g.buffer("x", DRAM, 4096, "float32", "input")
        g.buffer("r", REGISTER, 128, "float32")
        g.add(Move(src=Slice("x", 0, (4, 32), strides), dst=Slice("r", 0, (4, 32), (32, 1))))
        return _program(g).instructions

    assert not _gathered(Slice("x", 0, (4, 32), (32, 1))) and not _gathered(Slice("x", 0, (4, 32), (0, 1)))
    assert _gathered(Slice("x", 0, (4, 32), (1, 16))) and _gathered(Slice("x", 0, (4, 32), (64, 1)))
    contiguous, gathered = unit_instructions((32, 1)), unit_instructions((1, 16))
    lanes = cpu.lanes_per_unit
    assert gathered - contiguous == pytest.approx((128 - 128 / lanes) * 2)  # (1 + ADDRESS) per access


def test_partly_used_sectors_cost_cache_traffic_on_a_gpu():
    """A warp reading a column (32 rows, one float each: a scalar transpose's read) touches 32
    sectors of 32 bytes for 128 bytes it uses; reading a row 16 bytes a lane fills every sector
    it touches. The model charges the difference through the cache (`_unit_sector_waste`)."""
    from gir.fusion.perf import _unit_sector_waste
    from gir.ir import Slice
    column = Slice("x", 0, (32, 1), (768, 1))
    assert _unit_sector_waste(column, 1, 1, 32, 4, 32) == 32 * 32 - 32 * 4
    row = Slice("x", 0, (1, 128), (768, 1))
    assert _unit_sector_waste(row, 4, 4, 32, 4, 32) == 0
    assert _unit_sector_waste(row, 1, 1, 32, 4, 32) == 0  # scalar but coalesced: 128 bytes, 4 sectors
    assert get_target("cpu").timing.sector_bytes == 0  # the CPU's caches move lines its prefetchers fill


def test_a_transposing_copy_ranks_the_shared_tile_first_on_a_gpu():
    """BERT-fp16's K^T copy: the plain copy reads a column per warp (a sector a lane); the tile
    form reads and writes rows 16 bytes a lane. Same DRAM bytes; the model ranks the tile
    first once partly used sectors count."""
    from onnx import numpy_helper
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1])],
                          "kt", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 128, 768])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 12, 64, 128])],
                          [numpy_helper.from_array(np.array([1, 128, 12, 64], np.int64), "s")])
    (k,) = plan(load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)), H100).kernels
    assert ":tile" in k.graph.name and wide_share(k.graph, 16) == 1.0


def test_a_cpu_element_loop_pays_once_for_what_only_a_row_statistic_feeds():
    """x * rsqrt(var + eps): the compiler hoists the rsqrt of the broadcast statistic out of
    the element loop, so the model charges the multiply per element and not the rsqrt."""
    from gir.fusion.perf import _expr_cost
    from gir.ir import Const, Input, call
    expr = call("mul", Input(0), call("rsqrt", call("add", Input(1), Const(1e-5, "float32"))))
    assert _expr_cost(expr, (), frozenset({1})) == _expr_cost(call("mul", Input(0), Input(1)))
    assert _expr_cost(expr) > _expr_cost(expr, (), frozenset({1}))
    assert _expr_cost(expr, (), frozenset({0})) == _expr_cost(expr)  # the element's own value: per element


def test_arrays_the_cpu_emitter_turns_into_scalars_are_no_spills():
    """An elementwise op tiled as 8 whole rows of 768 a unit: its 24 KiB register arrays are
    fused element loops' scalars in the emitted C, not stack arrays past L1: no spill term. A
    reduction's input array, which its own loop reads back, still counts."""
    from gir.backends.cpu.emitter import CpuEmitter
    from gir.backends.kernels import split_kernels
    from gir.fusion.perf import _program, _scalarized
    from gir.ir.validate import register_bytes_per_lane
    cpu = get_target("cpu")
    g = _single_op("Sigmoid", (128, 768))
    rows = [c for c in candidates(g.ops[0], g.tensors, cpu).candidates if c.structure == "rows" and c.params.get("rows", 0) >= 8]
    assert rows
    for cand in rows:
        # without knowing the arrays are scalars, the model would charge them as spills
        assert register_bytes_per_lane(cand.graph) * cpu.lanes_per_unit > cpu.timing.spill_bytes_per_unit
        regs = {n for n, b in cand.graph.buffers.items() if b.level == "register"}
        ops = [op for _, op in cand.graph.ops()]
        assert _scalarized(ops, cand.graph.buffers) == regs and _program(cand.graph).unstored >= regs
        assert estimate(cand.graph).parts["shared"] == 0
        source = "\n".join(CpuEmitter(cpu).kernel_source(k) for k in split_kernels(cand.graph))
        assert not any(re.search(rf"\br_\w*\[[^\]]*k[^\]]*\]", ln) for ln in source.splitlines() if "=" in ln), source
