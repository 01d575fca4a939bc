"""Wide DRAM accesses (issue 23, item 3): where gir.ir.vector_access proves a Move's DRAM side
consecutive, aligned and unmasked, the CUDA and HIP emitters issue one 16-byte access per lane;
ragged or misaligned slices keep the scalar path. Checked on the CPU harness against the
interpreter and in NVRTC's PTX."""
import re
from types import SimpleNamespace

import numpy as np
import pytest

import test_templates as tt
from gir.backends.cuda.emitter import CudaEmitter
from gir.backends.harness.graph_runner import run_on_cpu_harness
from gir.backends.hip.emitter import HipEmitter
from gir.backends.kernels import split_kernels
from gir.ir import Move, get_target, run
from gir.ir.expr import Input
from gir.ir.vector_access import vector_width, wide_share
from gir.rewrite import optimize
from gir.templates import candidates


def _candidates(shape, target):
    """The template's candidates as the planner sees them: rewritten (tidy drops the masks of
    edges a shape does not have)."""
    ts = {"a": tt.T("a", shape), "b": tt.T("b", shape), "y": tt.T("y", shape)}
    op = tt.ew("add_mul", (Input(0) + Input(1)) * Input(0), [ts["a"], ts["b"]], shape)
    cands = candidates(op, ts, get_target(target)).candidates
    return op, ts, [SimpleNamespace(graph=optimize(c.graph)[0], params=c.params) for c in cands]


def _source(graph, emitter):
    return "".join(emitter(graph.target).emit(k) for k in split_kernels(graph))


@pytest.mark.parametrize("target,dialect,emitter", [("h100", "cuda", CudaEmitter), ("mi250x", "hip", HipEmitter)])
def test_vector_candidates_match_the_interpreter(target, dialect, emitter):
    op, ts, cands = _candidates((4, 512), target)
    wide = [c for c in cands if "const float4 v = *(const float4*)" in _source(c.graph, emitter)]
    assert wide, "no candidate of a (4, 512) elementwise op got 16-byte accesses"
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((4, 512)).astype(np.float32), "b": rng.standard_normal((4, 512)).astype(np.float32)}
    for c in wide[:3]:  # one per structure family is enough; each harness build costs seconds
        assert c.params["vec"] == 4 and wide_share(c.graph) == 1.0
        want = run(c.graph, feeds).outputs["y"]
        np.testing.assert_array_equal(run_on_cpu_harness(c.graph, feeds, dialect)["y"], want)


def test_ragged_and_scalar_slices_stay_scalar():
    """(3, 33), 99 elements read as one flat run: the last unit's edge falls inside a lane's four
    elements, so every candidate reports width 1 and emits no vector type."""
    _, _, cands = _candidates((3, 33), "h100")
    for c in cands:
        assert all(vector_width(o, c.graph.buffers) == 1 for _, o in c.graph.ops() if isinstance(o, Move))
        assert "float4" not in _source(c.graph, CudaEmitter).split("__global__", 1)[1]


def test_misaligned_offset_is_refused():
    """A slice starting one element past a multiple of 4 cannot be read 16 bytes at a time."""
    _, _, cands = _candidates((4, 512), "h100")
    c = next(c for c in cands if c.params["vec"] == 4)
    op = next(o for _, o in c.graph.ops() if isinstance(o, Move))
    assert vector_width(op, c.graph.buffers) == 4
    shifted = op.__class__(src=op.src.__class__(op.src.buffer, op.src.offset + 1, op.src.shape, op.src.strides),
                           dst=op.dst, fill=op.fill, vec=op.vec, uniform=op.uniform)
    assert vector_width(shifted, c.graph.buffers) == 1


def test_nvrtc_issues_128_bit_loads_and_stores():
    from gir.backends.cuda.compiler import compile_cuda
    _, _, cands = _candidates((4, 512), "h100")
    c = next(c for c in cands if "const float4 v" in _source(c.graph, CudaEmitter))
    ptx = compile_cuda(_source(c.graph, CudaEmitter), "sm_90").ptx
    assert re.search(r"ld\.global(\.nc)?\.v4\.f32", ptx) and "st.global.v4.f32" in ptx


def test_hiprtc_compiles_the_vector_path():
    from gir.backends.hip.compiler import compile_hip
    _, _, cands = _candidates((4, 512), "mi250x")
    c = next(c for c in cands if "const float4 v" in _source(c.graph, HipEmitter))
    assert compile_hip(_source(c.graph, HipEmitter), "gfx90a").code


def test_a_broadcast_operand_counts_its_distinct_elements_once_per_unit():
    """x * scale[row] with 16-byte accesses for x and y: the row's scale is one address per
    unit, so the wide share is x's and y's bytes over those plus one scale element per unit."""
    shape = (4, 512)
    ts = {"a": tt.T("a", shape), "s": tt.T("s", (4, 1)), "y": tt.T("y", shape)}
    op = tt.ew("scale", Input(0) * Input(1), [ts["a"], ts["s"]], shape)
    checked = 0
    for c in candidates(op, ts, get_target("h100")).candidates:
        graph = optimize(c.graph)[0]
        moves = [o for _, o in graph.ops() if isinstance(o, Move)]
        widths = {(o.src if o.src.buffer in ("a", "s") else o.dst).buffer: vector_width(o, graph.buffers) for o in moves}
        if widths != {"a": 4, "s": 1, "y": 4}:
            continue
        per_unit = c.params["chunk"] * c.params.get("rows", 1)
        assert wide_share(graph) == pytest.approx(2 * per_unit / (2 * per_unit + 1))
        checked += 1
    assert checked


@pytest.mark.parametrize("target,dialect,emitter", [("h100", "cuda", CudaEmitter), ("mi250x", "hip", HipEmitter)])
def test_block_reductions_load_16_bytes_a_lane(target, dialect, emitter):
    """A row of 4096 split over a block's units, each lane loading 4 consecutive floats at a
    time (GPT-2 decode's c_proj GEMV reads its weight rows this way): 16-byte loads in the
    source, the interpreter's sum on the CPU harness."""
    from gir.frontend.basic import BasicOp
    ts = {"x": tt.T("x", (3, 4096)), "y": tt.T("y", (3,))}
    op = BasicOp("r", "reduce", ["x"], ["y"], {"op": "sum", "axes": (1,), "keepdims": False}, "r")
    wide = [c for c in candidates(op, ts, get_target(target)).candidates
            if c.structure == "block" and c.params.get("vec") == 4]
    assert wide
    c = wide[0]
    graph = optimize(c.graph)[0]
    (load,) = [o for _, o in graph.ops() if isinstance(o, Move) and o.src.buffer == "x"]
    assert vector_width(load, graph.buffers) == 4 and "float4" in _source(graph, emitter)
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 4096)).astype(np.float32)}
    want = run(graph, feeds).outputs["y"]
    np.testing.assert_allclose(want, feeds["x"].sum(axis=1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(run_on_cpu_harness(graph, feeds, dialect)["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target,dialect,emitter", [("h100", "cuda", CudaEmitter), ("mi250x", "hip", HipEmitter)])
def test_a_ragged_last_block_of_whole_rows_keeps_16_byte_accesses(target, dialect, emitter):
    """5 rows of 512, a row per unit and several units per block: the last block's extra units
    are masked as a whole (the bound is on a dimension of extent 1), so each unit's accesses
    stay 16 bytes wide under one guard; a reduction's load takes its fill where the unit is
    out. Both against the interpreter on the CPU harness."""
    from gir.frontend.basic import BasicOp
    rng = np.random.default_rng(4)
    feeds = {"a": rng.standard_normal((5, 512)).astype(np.float32), "b": rng.standard_normal((5, 512)).astype(np.float32)}
    op, ts, cands = _candidates((5, 512), target)
    from gir.ir.vector_access import unit_uniform_mask

    def ragged(c):  # masked per unit: the bound is on the rows, not within a row
        return any(isinstance(o, Move) and o.src.buffer == "a" and o.src.is_masked and unit_uniform_mask(o.src)
                   for _, o in c.graph.ops())
    ew = [c for c in cands if c.params.get("chunk") == 512 and c.params["vec"] == 4 and ragged(c)]
    red_ts = {"a": tt.T("a", (5, 512)), "y": tt.T("y", (5,))}
    red = BasicOp("r", "reduce", ["a"], ["y"], {"op": "max", "axes": (1,), "keepdims": False}, "r")
    maxes = [SimpleNamespace(graph=optimize(c.graph)[0]) for c in candidates(red, red_ts, get_target(target)).candidates
             if c.structure == "unit" and c.params.get("vec") == 4]
    maxes = [c for c in maxes if ragged(c)]
    assert ew and maxes
    for c in (ew[0], maxes[0]):
        moves = [o for _, o in c.graph.ops() if isinstance(o, Move) and o.src.buffer == "a"]
        assert moves and all(o.src.is_masked and vector_width(o, c.graph.buffers) == 4 for o in moves)
        assert "float4" in _source(c.graph, emitter)
        want = run(c.graph, feeds).outputs
        got = run_on_cpu_harness(c.graph, feeds, dialect)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize("target,dialect,emitter", [("h100", "cuda", CudaEmitter), ("mi250x", "hip", HipEmitter)])
@pytest.mark.parametrize("structure,plane", [("unit", 28), ("unit", 14), ("block", 100), ("two_phase", 112), ("row", 28)])
def test_a_partial_last_round_of_lanes_keeps_16_byte_accesses(target, dialect, emitter, structure, plane):
    """A channel of 28x28 floats is 196 vectors: over 32 or 64 lanes the last round is partial.
    A unit per channel (EfficientNet's squeeze pools), a block per channel (10,000 floats over
    its units), several blocks per channel (12,544 floats, partials through DRAM: the pool that
    fuses with its SiLU) and an elementwise row per unit (its SE scale) still load 16 bytes a lane: the
    lanes past the end are guarded, a reduction's skipped lanes add nothing. Against the
    interpreter on the CPU harness."""
    from gir.frontend.basic import BasicOp
    size = plane * plane
    lanes = get_target(target).lanes_per_unit
    # whole vectors, a partial round (two_phase: 16 units of 784 floats, the last ones' chunks partial)
    assert size % 4 == 0 and (size % (4 * lanes) or structure == "two_phase")
    rng = np.random.default_rng(8)
    if structure == "row":
        op, ts, cands = _candidates((6, size), target)
        feeds = {"a": rng.standard_normal((6, size)).astype(np.float32), "b": rng.standard_normal((6, size)).astype(np.float32)}
        wide = [c for c in cands if c.params.get("chunk") == size and c.params.get("vec") == 4]
        name = "a"
    else:
        ts = {"x": tt.T("x", (6, size)), "y": tt.T("y", (6,))}
        op = BasicOp("r", "reduce", ["x"], ["y"], {"op": "sum", "axes": (1,), "keepdims": False}, "r")
        wide = [SimpleNamespace(graph=optimize(c.graph)[0], params=c.params)
                for c in candidates(op, ts, get_target(target)).candidates
                if c.structure == structure and c.params.get("vec") == 4 and c.params.get("outputs_per_unit", 1) == 1]
        feeds = {"x": rng.standard_normal((6, size)).astype(np.float32)}
        name = "x"
    assert wide
    graph = wide[0].graph
    moves = [o for _, o in graph.ops() if isinstance(o, Move) and o.src.buffer == name]
    assert moves and all(vector_width(o, graph.buffers) == 4 for o in moves)
    assert "float4" in _source(graph, emitter)
    want = run(graph, feeds).outputs
    got = run_on_cpu_harness(graph, feeds, dialect)
    for out, value in want.items():
        np.testing.assert_allclose(got[out], value, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target,dialect,emitter", [("h100", "cuda", CudaEmitter), ("mi250x", "hip", HipEmitter)])
def test_a_ragged_edge_on_a_whole_vector_keeps_16_byte_accesses(target, dialect, emitter):
    """(4, 97) read as 388 consecutive floats, four a lane: the last unit's edge falls between
    two lanes' vectors, so its lanes are guarded one by one (`run_uniform_mask`) and
    every access stays 16 bytes wide. Against the interpreter on the CPU harness."""
    from gir.ir.vector_access import run_uniform_mask, unit_uniform_mask
    _, _, cands = _candidates((4, 97), target)
    wide = [c for c in cands if c.params["vec"] == 4 and c.params["chunk"] == 4 * get_target(target).lanes_per_unit]
    assert wide
    c = wide[0]
    moves = [o for _, o in c.graph.ops() if isinstance(o, Move)]
    ragged = [o for o in moves if o.src.buffer == "a"]
    assert ragged and all(not unit_uniform_mask(o.src) and run_uniform_mask(o.src, 4) for o in ragged)
    assert all(vector_width(o, c.graph.buffers) == 4 for o in moves)
    assert "float4" in _source(c.graph, emitter)
    rng = np.random.default_rng(5)
    feeds = {"a": rng.standard_normal((4, 97)).astype(np.float32), "b": rng.standard_normal((4, 97)).astype(np.float32)}
    np.testing.assert_array_equal(run_on_cpu_harness(c.graph, feeds, dialect)["y"], run(c.graph, feeds).outputs["y"])


@pytest.mark.parametrize("target,dialect,emitter", [("h100", "cuda", CudaEmitter), ("mi250x", "hip", HipEmitter)])
def test_two_half_rows_a_unit_load_eight_halves_a_lane(target, dialect, emitter):
    """Rows of 128 halves (a softmax over 128 keys in fp16) are too short to give every lane
    eight halves, so a unit takes two rows, half of its lanes each: 16-byte loads, each row's
    max over its own lanes; or one row a unit, half of its lanes idle. Against the interpreter
    on the CPU harness."""
    from gir.frontend.basic import BasicOp
    lanes = get_target(target).lanes_per_unit
    rows = 2 * lanes * 8 // 128  # a unit's worth of rows: 2 on 32-lane warps, 4 on 64-lane wavefronts
    ts = {"x": tt.T("x", (3 * rows, 128), "float16"), "y": tt.T("y", (3 * rows,), "float16")}
    op = BasicOp("r", "reduce", ["x"], ["y"], {"op": "max", "axes": (1,), "keepdims": False}, "r")
    cands = candidates(op, ts, get_target(target)).candidates
    wide = [c for c in cands if c.structure == "unit" and c.params.get("vec") == 8]
    several = [c for c in wide if c.params["outputs_per_unit"] > 1]
    assert several and all(c.params["outputs_per_unit"] * 128 % (8 * lanes) == 0 for c in several)
    one = [c for c in wide if c.params["outputs_per_unit"] == 1]
    assert one
    feeds = {"x": np.random.default_rng(6).standard_normal((3 * rows, 128)).astype(np.float16)}
    for c in (several[0], one[0]):
        graph = optimize(c.graph)[0]
        (load,) = [o for _, o in graph.ops() if isinstance(o, Move) and o.src.buffer == "x"]
        assert vector_width(load, graph.buffers) == 8 and "uint4" in _source(graph, emitter)
        np.testing.assert_array_equal(run_on_cpu_harness(graph, feeds, dialect)["y"], run(graph, feeds).outputs["y"])


@pytest.mark.parametrize("target,dialect,emitter", [("h100", "cuda", CudaEmitter), ("mi250x", "hip", HipEmitter)])
def test_a_cast_from_half_places_eight_elements_a_lane(target, dialect, emitter):
    """fp16 -> fp32 (a LayerNorm's cast in a half model): eight elements a lane, so the halves
    load 16 bytes at a time and the floats store as two 16-byte accesses."""
    from gir.ir.expr import Input as In
    shape = (4, 512)
    ts = {"a": tt.T("a", shape, "float16"), "y": tt.T("y", shape)}
    op = tt.ew("cast", In(0), [ts["a"]], shape)
    wide = [c for c in candidates(op, ts, get_target(target)).candidates if c.params["vec"] == 8]
    assert wide
    graph = optimize(wide[0].graph)[0]
    widths = {(o.src if o.src.buffer == "a" else o.dst).buffer: vector_width(o, graph.buffers)
              for _, o in graph.ops() if isinstance(o, Move)}
    assert widths == {"a": 8, "y": 4}
    src = _source(graph, emitter)
    loads = src.count("const uint4 v = *(const uint4*)")
    assert loads and src.count("*(float4*)") == 2 * loads
    feeds = {"a": np.random.default_rng(7).standard_normal(shape).astype(np.float16)}
    np.testing.assert_array_equal(run_on_cpu_harness(graph, feeds, dialect)["y"], run(graph, feeds).outputs["y"])


def _head_transpose(shape, perm, dtype):
    """x (B, S, H*D) reshaped to (B, S, H, D) and transposed by `perm`: a view the planner
    writes out in a copy kernel (BERT's q/k/v and context transposes)."""
    from onnx import TensorProto, helper, numpy_helper
    from gir.frontend import load as load_model
    b, s, h, d = shape
    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    out = tuple(shape[p] for p in perm)
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Transpose", ["r"], ["y"], perm=list(perm))],
                          "heads", [helper.make_tensor_value_info("x", elem, [b, s, h * d])],
                          [helper.make_tensor_value_info("y", elem, list(out))],
                          [numpy_helper.from_array(np.array(shape, np.int64), "s")])
    return load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


@pytest.mark.parametrize("target,dialect", [("h100", "cuda"), ("mi250x", "hip")])
@pytest.mark.parametrize("shape,dtype,vec", [((2, 12, 4, 64), "float32", 4), ((1, 10, 3, 64), "float16", 8),
                                             ((2, 32, 4, 12), "float32", 4)])
def test_head_transpose_copies_move_whole_rows_16_bytes_at_a_time(target, dialect, shape, dtype, vec):
    """A transposed view whose innermost dimension stays contiguous on both sides (each head's
    row of D elements) is copied with 16-byte loads and stores: the planner's copy kernel, and
    every such candidate, against the interpreter on the CPU harness. D = 12 still splits into
    whole vectors of four floats."""
    from gir.fusion.plan import plan
    graph = _head_transpose(shape, (0, 2, 1, 3), dtype)
    p = plan(graph, get_target(target))
    (k,) = p.kernels
    assert k.name.startswith("copy:") and wide_share(k.graph, 16) == 1.0
    x = np.random.default_rng(7).standard_normal((shape[0], shape[1], shape[2] * shape[3])).astype(dtype)
    want = x.reshape(shape).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(run(k.graph, {"x": x}).outputs["y"].reshape(want.shape), want)
    np.testing.assert_array_equal(run_on_cpu_harness(k.graph, {"x": x}, dialect)["y"].reshape(want.shape), want)
    moves = [o for _, o in k.graph.ops() if isinstance(o, Move)]
    assert {vector_width(o, k.graph.buffers) for o in moves} == {vec}


def test_a_transpose_of_rows_that_do_not_split_into_vectors_stays_scalar():
    """D = 6 floats: a row is not a whole number of 16-byte vectors, so no candidate offers
    four a lane and the copy stays scalar (correct, narrow)."""
    from gir.fusion.plan import plan
    graph = _head_transpose((1, 8, 4, 6), (0, 2, 1, 3), "float32")
    (k,) = plan(graph, get_target("h100")).kernels
    assert wide_share(k.graph, 16) == 0.0
    x = np.random.default_rng(8).standard_normal((1, 8, 24)).astype(np.float32)
    want = x.reshape(1, 8, 4, 6).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(run_on_cpu_harness(k.graph, {"x": x}, "cuda")["y"].reshape(want.shape), want)


def test_a_head_merge_copy_is_wide_and_fills_the_machine():
    """ViT's context merge, (1, 12, 197, 64) -> (1, 197, 768): many structures tie (the copy is
    launch-bound); the plan takes one that is 16 bytes a lane, 128 threads or more a block
    and two blocks or more per SM (the shortlist breaks near-ties like the final ranking:
    wider accesses, then the launch's shortfalls, `plan._launch_shortfalls`)."""
    from onnx import TensorProto, helper, numpy_helper
    from gir.frontend import load as load_model
    from gir.fusion.plan import _launch_shortfalls, plan
    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["r"], perm=[0, 2, 1, 3]),
                           helper.make_node("Reshape", ["r", "s"], ["y"])], "merge",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, 197, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 197, 768])],
                          [numpy_helper.from_array(np.array([1, 197, 768], np.int64), "s")])
    target = get_target("h100")
    (k,) = plan(load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)), target).kernels
    assert wide_share(k.graph, 16) == 1.0 and _launch_shortfalls(k.graph) == 0
    assert k.graph.prim.units_per_block * target.lanes_per_unit >= 128 and k.graph.prim.num_blocks >= 2 * target.processors
    x = np.random.default_rng(9).standard_normal((1, 12, 197, 64)).astype(np.float32)
    np.testing.assert_array_equal(run_on_cpu_harness(k.graph, {"x": x}, "cuda")["y"].reshape(1, 197, 768),
                                  x.transpose(0, 2, 1, 3).reshape(1, 197, 768))


def test_launch_shortfalls_say_nothing_on_the_cpu():
    """The CPU's blocks are one unit of SIMD lanes: every candidate would fall short alike, so
    the tie-break leaves CPU plans to the other keys."""
    from gir.fusion.plan import _launch_shortfalls
    _, _, cands = _candidates((4, 512), "cpu")
    assert cands and all(_launch_shortfalls(c.graph) == 0 for c in cands)
    _, _, gpu = _candidates((4, 512), "h100")
    assert {_launch_shortfalls(c.graph) for c in gpu} >= {1}  # 2048 elements: never 264 blocks


def test_rows_that_start_misaligned_are_counted_apart():
    """The static reports' "where the extent allows": a max over rows of 197 floats (ViT's
    softmax) cannot read 16 bytes at a time (rows start at every 4-byte offset), so its bytes
    are counted apart; an elementwise op over (8, 49) read as one flat run of 392 floats is
    allowed and moves 16 bytes at a time."""
    from gir.frontend.basic import BasicOp
    from gir.ir.vector_access import access_census, extent_allows
    ts = {"x": tt.T("x", (24, 197)), "y": tt.T("y", (24,))}
    op = BasicOp("r", "reduce", ["x"], ["y"], {"op": "max", "axes": (1,), "keepdims": False}, "r")
    graphs = [optimize(c.graph)[0] for c in candidates(op, ts, get_target("h100")).candidates]
    loads = {id(g): [o for _, o in g.ops() if isinstance(o, Move) and o.src.buffer == "x"] for g in graphs}
    # a unit that takes one row (a block of 32 rows is 6304 floats: whole aligned vectors, allowed)
    graph = next(g for g in graphs if all(o.src.size % 4 for o in loads[id(g)]))
    census = access_census(graph)
    assert not any(extent_allows(o, graph.buffers) for o in loads[id(graph)])
    assert census["narrow"]["innermost extent not whole 16-byte vectors"] == 24 * 197 * 4
    assert census["allowed"] == census["total"] - 24 * 197 * 4
    _, _, flat = _candidates((8, 49), "h100")
    wide = [c for c in flat if wide_share(c.graph, 16) == 1.0]
    assert wide
    census = access_census(wide[0].graph)
    assert census["wide"] == census["allowed"] == census["total"] > 0


@pytest.mark.parametrize("target,dialect", [("h100", "cuda"), ("mi250x", "hip")])
@pytest.mark.parametrize("shape,dtype", [((1, 128, 12, 64), "float32"), ((1, 100, 3, 36), "float32"),
                                         ((1, 128, 12, 64), "float16"), ((1, 72, 3, 40), "float16")])
def test_a_true_transpose_goes_16_bytes_wide_through_a_shared_tile(target, dialect, shape, dtype):
    """K^T, (B, S, H*D) -> (B, H, D, S): the inner dimensions differ, so a plain copy reads a
    column (a sector per lane, which the time model charges: `perf._unit_sector_waste`). The
    copy's tile candidates (`layout.wide_tiles`) load 16 bytes along D into registers, stage
    them in a shared tile and store 16 bytes along S; ragged tiles (S = 100, 72; D = 36, 40)
    are masked on whole vectors. Every tile candidate, rewritten, against numpy through the
    interpreter, the first also on the CPU harness; at full BERT size the planner takes one."""
    from gir.fusion.compose import compose, copy_candidates
    from gir.fusion.plan import plan
    graph = _head_transpose(shape, (0, 2, 3, 1), dtype)
    (cands,) = copy_candidates(graph, compose(graph, graph.ops), get_target(target), [])
    tiles = [c for c in cands if c.structure == "tile"]
    assert tiles
    b, s, h, d = shape
    x = np.random.default_rng(10).standard_normal((b, s, h * d)).astype(dtype)
    want = x.reshape(shape).transpose(0, 2, 3, 1)
    for i, c in enumerate(tiles):
        g = optimize(c.graph)[0]
        assert wide_share(g, 16) == 1.0
        np.testing.assert_array_equal(run(g, {"x": x}).outputs["y"].reshape(want.shape), want)
        if i == 0:  # the harness build costs seconds; the units per block change no emitter path
            np.testing.assert_array_equal(run_on_cpu_harness(g, {"x": x}, dialect)["y"].reshape(want.shape), want)
    if h == 12:  # BERT's size; small copies are launch-bound ties either way
        (k,) = plan(graph, get_target(target)).kernels
        assert ":tile" in k.graph.name and wide_share(k.graph, 16) == 1.0


def test_the_tile_transpose_compiles_with_128_bit_accesses():
    """NVRTC's PTX for the fp16 K^T tile has 128-bit global loads and stores; hiprtc builds it
    for gfx90a."""
    from gir.backends.cuda.compiler import compile_cuda
    from gir.backends.hip.compiler import compile_hip
    from gir.fusion.plan import plan
    graph = _head_transpose((1, 128, 12, 64), (0, 2, 3, 1), "float16")
    (k,) = plan(graph, get_target("h100")).kernels
    ptx = compile_cuda(_source(k.graph, CudaEmitter), "sm_90").ptx
    assert re.search(r"ld\.global(\.nc)?\.v4\.u32", ptx) and re.search(r"st\.global\.v4\.u32", ptx)
    (k,) = plan(graph, get_target("mi250x")).kernels
    assert compile_hip(_source(k.graph, HipEmitter), "gfx90a").code


def test_a_megabyte_layernorm_keeps_128_thread_blocks_and_16_byte_accesses():
    """ViT's LayerNorm, 197 rows of 768 floats (1.2 MB): two units of four floats a lane and
    six units of four tie in the model; a kernel of a megabyte or more takes blocks of 128
    threads or more first (`plan._small_big_blocks`), then the wider access."""
    from onnx import TensorProto, helper, numpy_helper
    from gir.frontend import load as load_model
    from gir.fusion.plan import plan
    rng = np.random.default_rng(11)
    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-12)], "ln",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 197, 768])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 197, 768])],
                          [numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), "g"),
                           numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), "b")])
    target = get_target("h100")
    (k,) = plan(load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)), target).kernels
    assert k.estimate.dram_bytes >= 1 << 20
    assert k.graph.prim.units_per_block * target.lanes_per_unit >= 128 and wide_share(k.graph, 16) == 1.0


def test_a_half_layernorm_under_a_megabyte_keeps_eight_halves_a_lane():
    """BERT-fp16's LayerNorm (fp16 in and out, fp32 between its casts; 128 rows of 768: 0.4 MB
    fused): each op alone moves up to 1.2 MB of fp32, but the fused kernel is small, so the
    megabyte rule (`plan._fused_bytes`) leaves the tie to the wider access: three units of
    eight halves a lane, every DRAM byte 16 bytes at a time."""
    from onnx import TensorProto, helper, numpy_helper
    from gir.frontend import load as load_model
    from gir.fusion.plan import plan
    rng = np.random.default_rng(12)
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
             helper.make_node("LayerNormalization", ["xf", "g", "b"], ["yf"], axis=-1, epsilon=1e-12),
             helper.make_node("Cast", ["yf"], ["y"], to=TensorProto.FLOAT16)]
    g = helper.make_graph(nodes, "ln16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 128, 768])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 128, 768])],
                          [numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), "g"),
                           numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), "b")])
    (k,) = plan(load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)),
                get_target("h100")).kernels
    assert k.estimate.dram_bytes < 1 << 20 and wide_share(k.graph, 16) == 1.0


def _depthwise_then_pointwise(c: int = 232, hw: int = 14, dtype=np.float32):
    """ShuffleNet-v2's stage-4 downsampling branch: a 3x3 stride-2 depthwise conv, then a 1x1
    conv over its 7x7 result, then ReLU."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    inits = [numpy_helper.from_array(rng.normal(0, .3, (c, 1, 3, 3)).astype(dtype), "dw"),
             numpy_helper.from_array(rng.normal(0, .1, (c,)).astype(dtype), "db"),
             numpy_helper.from_array(rng.normal(0, .1, (c, c, 1, 1)).astype(dtype), "pw"),
             numpy_helper.from_array(rng.normal(0, .1, (c,)).astype(dtype), "pb")]
    nodes = [helper.make_node("Conv", ["x", "dw", "db"], ["d"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], group=c),
             helper.make_node("Conv", ["d", "pw", "pb"], ["p"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["p"], ["y"])]
    return helper.make_model(helper.make_graph(
        nodes, "dw_pw", [helper.make_tensor_value_info("x", elem, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", elem, [1, c, hw // 2, hw // 2])], inits),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_a_weight_row_loads_16_bytes_while_the_input_is_gathered():
    """A 1x1 conv over a 7x7 map, one output a unit: its input is 49 floats a channel apart
    (no 16-byte access can read it), its weight row 232 contiguous floats. The lanes take four
    consecutive channels each, so the weight row loads 16 bytes a lane while the input is
    gathered element by element (before, every one of the 11,368 units read the weight row a
    float a lane). The kernel matches onnxruntime on the interpreter and the emitted CUDA
    matches the interpreter on the CPU harness."""
    import onnxruntime as ort
    from gir.frontend import load
    from gir.fusion.plan import plan
    model = _depthwise_then_pointwise()
    x = np.random.default_rng(1).standard_normal((1, 232, 14, 14)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    planned = plan(load(model), get_target("cuda:sm_90"), limit=2)
    (kernel,) = planned.kernels
    g = kernel.graph
    moves = [op for _, op in g.ops() if isinstance(op, Move)]
    weight = [op for op in moves if op.src.buffer.endswith("Conv_1/weight")]
    gathered = [op for op in moves if op.src.buffer == "d"]  # the depthwise result, through DRAM
    assert weight and all(vector_width(op, g.buffers) == 4 for op in weight)
    assert gathered and all(op.vec == 4 and vector_width(op, g.buffers) == 1 for op in gathered)
    feeds = {"x": x} | {n: np.asarray(t.value, np.float32) for n, t in planned.graph.tensors.items()
                        if t.value is not None and n in g.buffers}
    interpreted = run(g, feeds).outputs["y"].reshape(want.shape)
    np.testing.assert_allclose(interpreted, want, rtol=1e-5, atol=1e-5)
    harness = run_on_cpu_harness(g, feeds, "cuda")["y"].reshape(want.shape)
    np.testing.assert_allclose(harness, interpreted, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels,dtype,vec", [(116, np.float32, 4), (232, np.float16, 8)])
def test_a_weight_row_of_three_quarters_of_the_lanes_vectors_loads_16_bytes(channels, dtype, vec):
    """The same 1x1 conv where the weight row fills three quarters of the lanes' 16-byte vectors
    or more: 116 floats are 29 vectors of four, 232 halves 29 of eight, over 32 lanes. The row
    loads 16 bytes on 29 lanes while the input is gathered; the last three lanes idle, as 3 of
    32 idle in the one-element-a-lane form's last round. The interpreter matches onnxruntime on
    the fp32 model (the fp16 one with its inputs in fp32: onnxruntime has no fp16 depthwise conv
    on the CPU), and the emitted CUDA matches the interpreter on the CPU harness. (HIP's 64-lane
    units need 48 such vectors, which neither row makes.)"""
    import onnxruntime as ort
    from onnx import numpy_helper
    from gir.frontend import load
    from gir.fusion.plan import plan
    model = _depthwise_then_pointwise(channels, 14, dtype)
    x = np.random.default_rng(1).standard_normal((1, channels, 14, 14)).astype(dtype)
    reference = _depthwise_then_pointwise(channels, 14, np.float32)
    if dtype != np.float32:  # the same weights, rounded to fp16, in an fp32 model
        for t in reference.graph.initializer:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(dtype).astype(np.float32), t.name))
    want = ort.InferenceSession(reference.SerializeToString()).run(None, {"x": x.astype(np.float32)})[0]
    planned = plan(load(model), get_target("cuda:sm_90"), limit=2)
    (kernel,) = planned.kernels
    g = kernel.graph
    moves = [op for _, op in g.ops() if isinstance(op, Move)]
    weight = [op for op in moves if op.src.buffer.endswith("Conv_1/weight")]
    gathered = [op for op in moves if op.src.buffer in ("d", "Conv_0/sum")]  # the depthwise result, through DRAM
    assert weight and all(vector_width(op, g.buffers) == vec for op in weight)
    assert gathered and all(op.vec == vec and vector_width(op, g.buffers) == 1 for op in gathered)
    feeds = {"x": x} | {n: np.asarray(t.value) for n, t in planned.graph.tensors.items()
                        if t.value is not None and n in g.buffers}
    interpreted = run(g, feeds).outputs["y"].reshape(want.shape)
    tol = 1e-5 if dtype == np.float32 else 2e-2
    np.testing.assert_allclose(interpreted.astype(np.float32), want, rtol=tol, atol=tol)
    harness = run_on_cpu_harness(g, feeds, "cuda")["y"].reshape(want.shape)
    np.testing.assert_allclose(harness.astype(np.float32), interpreted.astype(np.float32), rtol=tol, atol=tol)
