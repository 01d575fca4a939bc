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
    max over its own lanes. Against the interpreter on the CPU harness."""
    from gir.frontend.basic import BasicOp
    lanes = get_target(target).lanes_per_unit
    rows = 2 * lanes * 8 // 128  # a unit's worth of rows: 2 on 32-lane warps, 4 on 64-lane wavefronts
    ts = {"x": tt.T("x", (3 * rows, 128), "float16"), "y": tt.T("y", (3 * rows,), "float16")}
    op = BasicOp("r", "reduce", ["x"], ["y"], {"op": "max", "axes": (1,), "keepdims": False}, "r")
    cands = candidates(op, ts, get_target(target)).candidates
    wide = [c for c in cands if c.structure == "unit" and c.params.get("vec") == 8]
    assert wide and all(c.params["outputs_per_unit"] * 128 % (8 * lanes) == 0 for c in wide)
    c = wide[0]
    graph = optimize(c.graph)[0]
    (load,) = [o for _, o in graph.ops() if isinstance(o, Move) and o.src.buffer == "x"]
    assert vector_width(load, graph.buffers) == 8 and "uint4" in _source(graph, emitter)
    feeds = {"x": np.random.default_rng(6).standard_normal((3 * rows, 128)).astype(np.float16)}
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
