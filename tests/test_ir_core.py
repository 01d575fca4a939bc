"""The GIR core on hand-built graphs: numbers match numpy, races are caught, bytes are exact."""
import numpy as np
import pytest

from gir.ir import (BLOCK, DRAM, LANE, UNIT, GraphError, InterpreterError, RaceError, get_target, required_scope,
                    run, to_dot, to_text, validate)
from handbuilt import relu, softmax_block_per_row, softmax_unit_per_row, transpose_shared

GPU_TARGETS = ["h100", "mi250x"]
rng = np.random.default_rng(0)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("target", GPU_TARGETS + ["cpu"])
@pytest.mark.parametrize("n", [1, 1000, 4096, 12345])
def test_relu_matches_numpy(target, n):
    g = relu(n, get_target(target))
    validate(g)
    x = rng.standard_normal(n).astype(np.float32)
    out = run(g, {"x": x}).outputs["y"]
    np.testing.assert_array_equal(out, np.maximum(x, 0))


@pytest.mark.parametrize("n", [1, 1000, 4096])
def test_relu_moves_exactly_4n_bytes_each_way_at_dram(n):
    stats = run(relu(n, get_target("h100")), {"x": np.ones(n, np.float32)}).stats
    assert stats.bytes[DRAM] == {"read": 4 * n, "write": 4 * n}
    assert set(stats.bytes) == {DRAM, "register"}  # nothing touches shared memory


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (64, 128), (13, 768)])
def test_softmax_unit_per_row(target, rows, cols):
    g = softmax_unit_per_row(rows, cols, get_target(target))
    validate(g)
    x = rng.standard_normal((rows, cols)).astype(np.float32) * 4
    np.testing.assert_allclose(run(g, {"x": x}).outputs["y"], softmax(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("rows,cols", [(1, 5), (3, 1000), (8, 3072), (5, 129)])
def test_softmax_block_per_row(target, rows, cols):
    g = softmax_block_per_row(rows, cols, get_target(target))
    validate(g)
    x = rng.standard_normal((rows, cols)).astype(np.float32) * 4
    res = run(g, {"x": x})
    np.testing.assert_allclose(res.outputs["y"], softmax(x), rtol=1e-5, atol=1e-7)
    assert res.stats.bytes["shared"]["write"] > 0
    assert res.stats.bytes[DRAM] == {"read": 4 * x.size, "write": 4 * x.size}


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("rows,cols", [(32, 32), (33, 70), (5, 3), (100, 64)])
def test_transpose_through_shared(target, rows, cols):
    g = transpose_shared(rows, cols, get_target(target))
    validate(g)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    res = run(g, {"x": x})
    np.testing.assert_array_equal(res.outputs["y"], x.T)
    assert res.stats.bytes[DRAM] == {"read": 4 * x.size, "write": 4 * x.size}


def test_missing_block_sync_is_reported_as_a_race():
    g = softmax_block_per_row(4, 300, get_target("h100"), drop_block_sync=True)
    validate(g)  # structurally fine: only execution shows the race
    with pytest.raises(RaceError, match=r"shared buffer 'sh_m'.*written by gOperator #\d+ Move.*Sync\(block\)"):
        run(g, {"x": np.ones((4, 300), np.float32)})


def test_missing_unit_sync_is_reported_as_a_race():
    g = softmax_unit_per_row(2, 64, get_target("h100"), drop_unit_sync=True)
    with pytest.raises(RaceError, match=r"Reduce.*lane all.*Sync\(unit\)"):
        run(g, {"x": np.ones((2, 64), np.float32)})


def test_race_check_can_be_disabled_and_then_computes_anyway():
    g = softmax_block_per_row(2, 70, get_target("h100"), drop_block_sync=True)
    x = rng.standard_normal((2, 70)).astype(np.float32)
    np.testing.assert_allclose(run(g, {"x": x}, check_races=False).outputs["y"], softmax(x), rtol=1e-5)


def test_sync_scope_is_computed_from_writers_and_readers():
    g = softmax_block_per_row(2, 100, get_target("h100"))
    ops = g.ops()
    load = next(n for n, op in ops if op.kind == "Move")
    first_sync = next(n for n, op in ops if op.kind == "Sync")
    reduce_ = next(n for n, op in ops if op.kind == "Reduce")
    exp = next(n for n, op in ops if op.kind == "Elementwise")
    assert required_scope(g, load, reduce_) == UNIT   # a cooperative reduce reads other lanes' elements
    assert required_scope(g, load, exp) == LANE       # elementwise reads what its own lane loaded
    to_shared = next(n for n, op in ops if op.kind == "Move" and op.dst.buffer == "sh_m")
    from_shared = next(n for n, op in ops if op.kind == "Move" and op.src.buffer == "sh_m")
    assert required_scope(g, to_shared, from_shared) == BLOCK
    assert first_sync in g.producers(reduce_)
    t = transpose_shared(40, 40, get_target("h100"))
    stage, _, out = [n for n, _ in t.ops()]
    assert required_scope(t, stage, out) == BLOCK


def test_scope_across_blocks_is_device():
    from gir.ir import GIRGraph, Move, ParallelPrimitive, Slice, U
    g = GIRGraph("shift", ParallelPrimitive((4,), 1), get_target("h100"))
    g.buffer("x", DRAM, (128,), role="input")
    g.buffer("t", DRAM, (128,))
    g.buffer("y", DRAM, (96,), role="output")
    a = g.add(Move(src=Slice.flat("x", 32 * U, 32), dst=Slice.flat("t", 32 * U, 32)))
    b = g.add(Move(src=Slice.flat("t", 32 * U + 32, 32, limit=96 - 32 * U), dst=Slice.flat("y", 32 * U, 32, limit=96 - 32 * U)))
    assert required_scope(g, a, b) == 3
    with pytest.raises(RaceError, match="Sync\\(device\\)"):
        run(g, {"x": np.arange(128, dtype=np.float32)})


def test_validator_lists_every_problem():
    cpu = get_target("cpu")
    with pytest.raises(GraphError) as err:
        validate(transpose_shared(64, 64, cpu))
    text = str(err.value)
    assert "units per block exceed" in text and "has no shared memory" in text


def test_validator_budgets_registers_by_block_size():
    """A block's lanes share one SM's 64K registers: 512 threads leave 128 a thread (512 bytes),
    although one thread may address 255. EfficientNet-B0's SiLU + squeeze in one 512-thread block
    needed 780 bytes, passed the old per-thread check and spilled in NVRTC."""
    from gir.ir import GIRGraph, Elementwise, Input, Move, ParallelPrimitive, Slice, U, REGISTER, call
    h100 = get_target("h100")
    assert h100.block_register_bytes_per_lane(16) == 512 and h100.block_register_bytes_per_lane(4) == h100.register_bytes_per_lane
    assert get_target("cpu").block_register_bytes_per_lane(64) == get_target("cpu").register_bytes_per_lane

    def held(units_per_block: int, per_lane: int, fn: str = "exp") -> GIRGraph:
        """x loaded, fn of it, stored: `per_lane` floats a lane each, twice."""
        n = 32 * per_lane
        g = GIRGraph("held", ParallelPrimitive((1,), units_per_block), h100)
        g.buffer("x", DRAM, (n * units_per_block,), role="input")
        g.buffer("y", DRAM, (n * units_per_block,), role="output")
        g.buffer("r", REGISTER, n)
        g.buffer("e", REGISTER, n)
        g.add(Move(src=Slice.flat("x", n * U, n), dst=Slice.flat("r", 0, n)))
        g.add(Elementwise(expr=call(fn, Input(0)), inputs=(Slice.flat("r", 0, n),), out=Slice.flat("e", 0, n)))
        g.add(Move(src=Slice.flat("e", 0, n), dst=Slice.flat("y", n * U, n)))
        return g
    validate(held(8, 80))  # 640 bytes a lane in 256 threads: fits
    with pytest.raises(GraphError, match="holds 640 register bytes per lane, H100 has 512 in a block of 512 lanes"):
        validate(held(16, 80))  # exp over all of a lane's elements first: both arrays held
    validate(held(16, 80, "relu"))  # relu streams: load, relu, store an element at a time


def test_validator_keeps_cuda_shared_memory_within_the_static_limit():
    """An H100 block may have 227 KiB of shared memory, but only 48 KiB declared statically,
    which is all the CUDA emitter writes: a fuzzed graph planned a 50,569-byte block reduction
    and failed at build time. HIP's 64 KiB of LDS are all static."""
    from gir.ir import GIRGraph, Move, ParallelPrimitive, Slice, Sync
    from gir.ir.target import SHARED, UNIT

    def staged(target: str, floats: int) -> GIRGraph:
        g = GIRGraph("staged", ParallelPrimitive((1,), 1), get_target(target))
        g.buffer("x", DRAM, (64,), role="input")
        g.buffer("y", DRAM, (64,), role="output")
        g.buffer("%s", SHARED, floats)
        g.add(Move(src=Slice.flat("x", 0, 64), dst=Slice.flat("%s", 0, 64)))
        g.add(Sync(scope=UNIT, slice=Slice.flat("%s", 0, 64)))
        g.add(Move(src=Slice.flat("%s", 0, 64), dst=Slice.flat("y", 0, 64)))
        return g
    with pytest.raises(GraphError, match="needs 50000 bytes of shared memory per block, H100's kernels declare at most 49152"):
        validate(staged("h100", 12_500))
    validate(staged("h100", 12_288))
    validate(staged("mi250x", 12_500))


def test_validator_rejects_register_overflow_and_out_of_bounds():
    with pytest.raises(GraphError, match="register bytes per lane"):
        validate(softmax_unit_per_row(2, 200_000, get_target("h100")))
    from gir.ir import GIRGraph, Move, ParallelPrimitive, Slice, U, REGISTER
    g = GIRGraph("oob", ParallelPrimitive((2,), 1), get_target("h100"))
    g.buffer("x", DRAM, (64,), role="input")
    g.buffer("r", REGISTER, 40)
    g.add(Move(src=Slice.flat("x", 40 * U, 40), dst=Slice.flat("r", 0, 40)))
    with pytest.raises(GraphError, match=r"reaches address 64 outside x\[0:64\] at unit 1"):
        validate(g)
    with pytest.raises(InterpreterError, match="out of bounds"):
        run(g, {"x": np.zeros(64, np.float32)})


def test_unwritten_output_is_an_error():
    from gir.ir import GIRGraph, Move, ParallelPrimitive, Slice
    g = GIRGraph("half", ParallelPrimitive((1,), 1), get_target("h100"))
    g.buffer("x", DRAM, (64,), role="input")
    g.buffer("y", DRAM, (64,), role="output")
    g.add(Move(src=Slice.flat("x", 0, 32), dst=Slice.flat("y", 0, 32)))
    with pytest.raises(InterpreterError, match="32 of 64 elements never written"):
        run(g, {"x": np.zeros(64, np.float32)})


def test_printers_show_every_gop_and_edge():
    g = softmax_block_per_row(2, 100, get_target("h100"))
    text = to_text(g)
    assert text.count("\n  #") == len(g)
    assert "Sync(block) sh_m[w; 1 @ 1]" in text and "Reduce(max)" in text
    dot = to_dot(g)
    assert dot.startswith('digraph "softmax_block"') and dot.count("->") >= g.graph.number_of_edges()
    assert "shape=diamond" in dot


@pytest.mark.parametrize("build", [softmax_block_per_row, softmax_unit_per_row])
def test_appending_gops_gives_the_edges_and_order_a_rebuild_gives(build):
    """Appends add only the new node's edges (graph.py keeps the last writer and readers);
    rebuilding every edge from scratch must find the same edges, kinds and program order."""
    g = build(8, 100, get_target("h100"))
    appended = {(a, b): (d["kind"], d["slice"]) for a, b, d in g.graph.edges(data=True)}
    order = g.order()
    g.replace(order[0], g.op(order[0]))  # a mutation: every edge rebuilt, the order recomputed
    assert {(a, b): (d["kind"], d["slice"]) for a, b, d in g.graph.edges(data=True)} == appended
    assert g.order() == order


def test_same_pattern_compares_masked_slices_dimension_by_dimension():
    """A (1, 32) row and a (32,) vector under the same ragged limit list the same elements, so
    merging may read a store back from registers (a softmax reading the scores it just scaled);
    another limit, or a mask on one side only, is another pattern."""
    from gir.ir import Slice, W
    limit = -32 * W + 128
    row = Slice("s", 128 * W, (1, 32), (128, 1), (None, limit))
    assert row.same_pattern(Slice("s", 128 * W, (32,), (1,), (limit,)))
    assert not row.same_pattern(Slice("s", 128 * W, (32,), (1,), (limit - 1,)))
    assert not row.same_pattern(Slice("s", 128 * W, (32,), (1,)))
    assert not row.same_pattern(Slice("s", 128 * W, (1, 32), (128, 2), (None, limit)))


def test_shared_scopes_from_one_block_equal_the_full_enumeration(monkeypatch):
    """scope.py analyses a shared buffer on one block when nothing of it depends on the block;
    the answers must be those of enumerating every block."""
    from gir.ir import scope
    graphs = [softmax_block_per_row(3, 100, get_target("h100")), softmax_block_per_row(5, 300, get_target("mi250x")),
              transpose_shared(40, 40, get_target("h100")), transpose_shared(64, 64, get_target("mi250x"))]
    pairs = [(g, w, r) for g in graphs for w, wop in g.ops() for r, rop in g.ops()
             if {s.buffer for s in wop.writes() if g.buffers[s.buffer].level == "shared"} & {s.buffer for s in rop.reads()}]
    one_block = []
    real = scope._same_in_every_block
    monkeypatch.setattr(scope, "_same_in_every_block", lambda *a: one_block.append(real(*a)) or one_block[-1])
    scope._required_scope.cache_clear()
    fast = [required_scope(g, w, r) for g, w, r in pairs]
    assert any(one_block)
    monkeypatch.setattr(scope, "_same_in_every_block", lambda *a: False)
    scope._required_scope.cache_clear()
    assert [required_scope(g, w, r) for g, w, r in pairs] == fast
    scope._required_scope.cache_clear()


def test_a_read_of_what_the_unit_wrote_is_unit_scope_without_enumerating(monkeypatch):
    """A DRAM temporary read back with the slice it was written through, by other lanes of the
    writing unit, needs a unit sync; scope.py answers from the slices (GPT-2's lm_head product,
    38.6M elements, took 8.5 s to enumerate). Where two units write one address it enumerates:
    the answers equal the full enumeration's either way."""
    from gir.ir import GIRGraph, Move, ParallelPrimitive, Reduce, Slice, U, scope
    h100 = get_target("h100")

    def graph(step):  # each of 64 units writes 128 floats `step` apart and sums them cooperatively
        g = GIRGraph("rows", ParallelPrimitive((64,), 1), h100)
        g.buffer("x", DRAM, (64 * 128,), role="input")
        g.buffer("t", DRAM, (63 * step + 128,))
        g.buffer("y", DRAM, (64,), role="output")
        w = g.add(Move(src=Slice.flat("x", 128 * U, 128), dst=Slice.flat("t", step * U, 128)))
        r = g.add(Reduce(src=Slice.flat("t", step * U, 128), dst=Slice.flat("y", U, 1), op="sum"))
        return g, w, r

    enumerated = []
    real = scope._same_elements_same_unit
    monkeypatch.setattr(scope, "_same_elements_same_unit",
                        lambda *a: enumerated.append(real(*a) is None) or real(*a))
    scope._required_scope.cache_clear()
    apart, overlapping = graph(128), graph(64)
    fast = [required_scope(g, w, r) for g, w, r in (apart, overlapping)]
    assert fast[0] == UNIT and enumerated == [False, True]  # apart: from the slices; overlapping: enumerated
    monkeypatch.setattr(scope, "_same_elements_same_unit", lambda *a: None)
    scope._required_scope.cache_clear()
    assert [required_scope(g, w, r) for g, w, r in (apart, overlapping)] == fast
    scope._required_scope.cache_clear()


def test_a_read_of_a_temporary_before_anything_writes_it_is_invalid():
    """A rewrite that reorders a writer after its reader (it once happened to a swap past a
    sync) leaves a load of garbage; validation, which the rewrite driver runs on every trial,
    names it."""
    from gir.ir import REGISTER, Elementwise, GIRGraph, Move, ParallelPrimitive, Slice
    from gir.ir.expr import Input, call
    g = GIRGraph("early_read", ParallelPrimitive((1,), 1), get_target("h100"))
    g.buffer("x", DRAM, (32,), role="input")
    g.buffer("y", DRAM, (32,), role="output")
    g.buffer("%in", REGISTER, 32)
    g.buffer("%out", REGISTER, 32)
    g.add(Move(src=Slice.flat("x", 0, 32), dst=Slice.flat("%in", 0, 32)))
    g.add(Move(src=Slice.flat("%out", 0, 32), dst=Slice.flat("y", 0, 32)))
    g.add(Elementwise(expr=call("exp", Input(0)), inputs=(Slice.flat("%in", 0, 32),), out=Slice.flat("%out", 0, 32)))
    with pytest.raises(GraphError, match="reads %out before anything writes it"):
        validate(g)
