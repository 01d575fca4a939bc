"""Reblocking (gir/fusion/reblock.py): a GPU kernel whose units never meet inside a block runs
the same units in blocks of another size, computing exactly what it did (reference interpreter
with its race check, and the emitted CUDA and HIP on the CPU harness), and the planner takes
the regrouping where the launch fell short of the device (issue 23, item 4)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from gir.backends.harness.graph_runner import run_on_cpu_harness
from gir.frontend import load
from gir.fusion.plan import plan
from gir.fusion.reblock import merge_blocks, reblock_choices, shortfalls, split_blocks, units_meet_in_blocks
from gir.ir import BLOCK, SHARED, Sync, get_target, run

CUDA, HIP = get_target("cuda:sm_90"), get_target("hip:gfx90a")


def _model(nodes, inputs, outputs):
    io = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph(nodes, "reblock", [io(n, s) for n, s in inputs], [io(n, s) for n, s in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _relu_pool(c: int, h: int):
    """ReLU whose result escapes, then a 2x2 average pool of it (RedNet-50's stride-2 blocks)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("AveragePool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    return _model(nodes, [("x", [1, c, h, h])], [("y", [1, c, h // 2, h // 2]), ("r", [1, c, h, h])])


def _scale_rows(rows: int, n: int):
    """x * sigmoid(x) then each row's sum: a SiLU and a reduction over a row per unit."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["m"]),
             helper.make_node("ReduceSum", ["m", "axes"], ["y"], keepdims=0)]
    model = _model(nodes, [("x", [rows, n])], [("y", [rows]), ("m", [rows, n])])
    model.graph.initializer.append(helper.make_tensor("axes", TensorProto.INT64, [1], [1]))
    return model


def _kernels(model, target, limit=2):
    return [s.graph for s in plan(load(model), target, limit=limit).steps if hasattr(s, "graph")]


def _feeds(model, graph, seed=0):
    """Random values for each DRAM input of `graph` (a model input or another kernel's
    result), the model's constants for its constants."""
    rng = np.random.default_rng(seed)
    consts = {n: np.asarray(t.value) for n, t in load(model).tensors.items() if t.value is not None}
    return {n: consts[n] if n in consts else rng.standard_normal(b.shape or (b.size,)).astype(np.float32)
            for n, b in graph.buffers.items() if b.role in ("input", "const")}


def _same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_a_one_warp_block_kernel_runs_in_128_thread_blocks():
    """The ReLU + pool kernel's units are output rows, one to a block as the pool's template
    tiles it (32 threads: half an H100 SM's warps under its 32-block limit). The planner
    regroups them into blocks of 128 threads or more, and the result still matches onnxruntime
    on the interpreter and the emitted CUDA on the CPU harness."""
    model = _relu_pool(128, 56)
    (g,) = _kernels(model, CUDA)
    assert g.prim.units_per_block * CUDA.lanes_per_unit >= 128 and shortfalls(g.prim, CUDA) == 0
    feeds = _feeds(model, g)
    want = dict(zip(["y", "r"], ort.InferenceSession(model.SerializeToString()).run(None, {"x": feeds["x"]})))
    got = run(g, feeds).outputs
    for name, w in want.items():
        np.testing.assert_allclose(got[name].reshape(w.shape), w, rtol=1e-6, atol=1e-6)
    harness = run_on_cpu_harness(g, feeds, "cuda")
    np.testing.assert_allclose(harness["y"].reshape(want["y"].shape), want["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("target,dialect", [(CUDA, "cuda"), (HIP, "hip")])
def test_split_and_merged_blocks_compute_what_the_kernel_did(target, dialect):
    """Every regrouping of each planned kernel that validates: same outputs, bit for bit, on
    the interpreter (which checks each sync's scope against the new blocks), and on the harness
    for the emitted source of the first."""
    checked = 0
    for model in (_relu_pool(16, 24), _scale_rows(96, 200)):
        for g in _kernels(model, target):
            if units_meet_in_blocks(g):
                continue
            feeds = _feeds(model, g)
            want = run(g, feeds).outputs
            upb = g.prim.units_per_block
            variants = [split_blocks(g, f) for f in range(2, upb + 1)]
            one_unit = split_blocks(g, upb)  # one unit a block, then merged again along the last axis
            variants += [merge_blocks(one_unit, f) for f in (2, 4, 8)] if one_unit is not None else []
            variants = [v for v in variants if v is not None]
            assert any(v.prim.grid[-1] != g.prim.grid[-1] and v.prim.units_per_block > 1 for v in variants)  # a merge
            assert variants, g.name
            for v in variants:
                assert v.prim.num_units == g.prim.num_units
                _same(run(v, feeds).outputs, want)
            harness = run_on_cpu_harness(variants[0], feeds, dialect)
            for name, w in want.items():
                np.testing.assert_allclose(harness[name].reshape(w.shape), w, rtol=1e-6, atol=1e-6)
            checked += 1
    assert checked >= 2


def test_kernels_whose_units_meet_in_a_block_are_left_alone():
    """A row reduced by the units of a block together (shared memory, a block barrier): its
    blocks are the reduction's scope, so no regrouping is offered."""
    model = _scale_rows(8, 65536)
    shared = [g for g in _kernels(model, CUDA, limit=4)
              if any(b.level == SHARED for b in g.buffers.values()) or any(isinstance(op, Sync) and op.scope == BLOCK for _, op in g.ops())]
    assert shared, "expected a block-cooperative row reduction"
    for g in shared:
        assert units_meet_in_blocks(g) and reblock_choices(g) == []


def test_only_gpu_launches_that_fall_short_are_regrouped():
    """The CPU's one-unit blocks say nothing about a launch: never regrouped there. A GPU kernel
    whose launch is full is offered nothing; one that falls short is offered only forms that
    fall short less, each the same units."""
    model = _relu_pool(128, 56)
    for g in _kernels(model, get_target("cpu"), limit=1):
        assert reblock_choices(g) == []
    (g,) = _kernels(model, CUDA)
    assert shortfalls(g.prim, CUDA) == 0 and reblock_choices(g) == []
    one_warp = split_blocks(g, g.prim.units_per_block)  # back to 32-thread blocks
    assert one_warp is not None and shortfalls(one_warp.prim, CUDA) == 1
    choices = reblock_choices(one_warp)
    assert choices and all(shortfalls(c.graph.prim, CUDA) == 0 for c in choices)
    assert all(c.graph.prim.num_units == g.prim.num_units for c in choices)
    assert max(c.graph.prim.units_per_block for c in choices) >= 4
    # blocks of two units (64 threads): split into one-unit blocks, then merged along the old
    # last grid axis, the same units again
    two = merge_blocks(one_warp, 2)
    assert two is not None and two.prim.units_per_block == 2
    choices = reblock_choices(two)
    assert choices and all(shortfalls(c.graph.prim, CUDA) == 0 for c in choices)
    feeds = _feeds(model, g)
    want = run(g, feeds).outputs
    for c in choices:
        _same(run(c.graph, feeds).outputs, want)


def test_regrouped_kernels_compile_without_spills():
    """NVRTC (sm_80, sm_90) and hiprtc (gfx908, gfx90a) build the regrouped kernels: the new
    grid axis is one more block coordinate, the block size one more launch bound."""
    from gir.backends.cuda.compiler import compile_cuda
    from gir.backends.cuda.emitter import CudaEmitter
    from gir.backends.hip.compiler import compile_hip
    from gir.backends.hip.emitter import HipEmitter
    from gir.backends.kernels import split_kernels
    for target, emitter, compile_for, archs in ((CUDA, CudaEmitter, compile_cuda, ("sm_80", "sm_90")),
                                                (HIP, HipEmitter, compile_hip, ("gfx908", "gfx90a"))):
        graphs = [g for model in (_relu_pool(128, 56), _scale_rows(96, 200)) for g in _kernels(model, target)]
        regrouped = [v for g in graphs if not units_meet_in_blocks(g)
                     for v in (split_blocks(g, g.prim.units_per_block), *(c.graph for c in reblock_choices(g))) if v is not None]
        assert regrouped
        source = "".join(emitter(target).emit(k) for g in regrouped for k in split_kernels(g))
        for arch in archs:
            built = compile_for(source, arch)
            assert built.resources and not any(r.spilled for r in built.resources.values())


@pytest.mark.parametrize("target", [CUDA, HIP])
def test_too_few_rows_for_the_device_spread_over_more_blocks(target):
    """197 rows of 768 (ViT's residual add + LayerNorm shape), each reduced by one unit: no
    block size gives two blocks per SM / CU, so the rows go in blocks of 128 threads, the most
    blocks a full-warp launch can have, and the planner's log says so."""
    model = _scale_rows(197, 768)
    steps = [s for s in plan(load(model), target, limit=2).steps if hasattr(s, "graph")]
    (step,) = steps
    g = step.graph
    assert g.prim.units_per_block * target.lanes_per_unit == 128
    assert any(str(x).startswith("reblock: blocks of 128 threads") for x in step.log)
    feeds = _feeds(model, g)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": feeds["x"]})
    got = run(g, feeds).outputs
    np.testing.assert_allclose(got["y"].reshape(want[0].shape), want[0], rtol=1e-5, atol=1e-4)
