"""Lanes that take runs of consecutive outputs (issue 23, items 2 and 3): a lowered 1x1 conv's
product and sum, each lane four consecutive pixels and every input channel in turn, so the
input loads and the result stores are 16 bytes a lane. The group is built as the planner builds
it (scripts/perf_model_rank.py `plan_space`: the candidates plan() offered each op), then run
on the reference interpreter and, emitted as CUDA and HIP, on the CPU harness, against
onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gir.backends.harness.graph_runner import run_on_cpu_harness
from gir.frontend import load
from gir.fusion.perf import estimate
from gir.ir import Move, Slice, get_target, run
from gir.ir.affine import Affine
from gir.ir.validate import register_bytes_per_lane
from gir.ir.vector_access import vector_width


def _conv1x1(cin: int, cout: int, hw: int):
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, hw, hw])
    w = numpy_helper.from_array(rng.normal(0, 0.2, (cout, cin, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.2, (cout,)).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "conv1x1", [x], [y], [w, b]),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("target,dialect", [("cuda:sm_90", "cuda"), ("hip:gfx90a", "hip")])
@pytest.mark.parametrize("hw", [28, 14])
def test_a_1x1_conv_reads_and_writes_four_pixels_a_lane(rank, target, dialect, hw):
    """28x28 and 14x14 pixels do not split into tiles of 128 (256 on HIP) outputs: each output
    channel's tiles restart at its first pixel (the sum's rows and the ReLU's channel view), the
    last one masked on whole vectors."""
    model = _conv1x1(24, 8, hw)
    t = get_target(target)
    space = rank.plan_space(load(model), t)
    runs = [o for o in space.options(0, len(space.ops)) if o.rewritten and "runs4" in space.describe(o)]
    assert runs, [space.describe(o) for o in space.options(0, len(space.ops))]
    graph = space.graph_of(runs[0])
    x_loads = [op for _, op in graph.ops() if isinstance(op, Move) and op.src.buffer == "x"]
    y_stores = [op for _, op in graph.ops() if isinstance(op, Move) and op.dst.buffer == "y"]
    assert x_loads and y_stores
    assert all(vector_width(op, graph.buffers) == 4 for op in x_loads + y_stores)
    assert estimate(graph).kernels == 1  # the ReLU restarts with the sum at each channel: one kernel
    if dialect == "cuda":  # admitted because its loads stream (validate.streamed_loads)
        assert register_bytes_per_lane(graph) > t.register_bytes_per_lane
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 24, hw, hw)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    consts = {n: np.asarray(tensor.value, np.float32) for n, tensor in space.graph.tensors.items()
              if tensor.value is not None and n in graph.buffers}
    feeds |= consts
    interpreted = run(graph, feeds).outputs["y"].reshape(want.shape)
    np.testing.assert_allclose(interpreted, want, rtol=1e-5, atol=1e-5)
    harness = run_on_cpu_harness(graph, feeds, dialect)["y"].reshape(want.shape)
    np.testing.assert_allclose(harness, interpreted, rtol=1e-6, atol=1e-6)


def test_cpu_groups_offer_no_runs(rank):
    """The CPU's units vectorise their own loops: no template offers runs there."""
    space = rank.plan_space(load(_conv1x1(24, 8, 28)), get_target("cpu"))
    assert not any("runs" in c.params for cands in space.per_op for c in cands)


def test_a_load_is_guarded_only_on_axes_it_moves_along(rank):
    """A weight read for each of a ragged tile's pixels (stride 0 along them): its address is
    the in-range pixels' one, so the emitted load has no guard and NVRTC issues it once per
    lane; a bound on an axis it does move along stays."""
    from gir.backends.cuda.emitter import CudaEmitter
    from gir.backends.kernels import split_kernels
    bound = Affine(100, (("b1", -128),))
    s = Slice("w", 0, (24, 128), (1, 0), (None, bound))
    assert not s.unbounded_where_still().is_masked
    moving = Slice("w", 0, (24, 128), (1, 24), (None, bound))
    assert moving.unbounded_where_still() == moving
    model = _conv1x1(24, 8, 28)
    space = rank.plan_space(load(model), get_target("cuda:sm_90"))
    graph = space.graph_of(next(o for o in space.options(0, len(space.ops)) if o.rewritten and "runs4" in space.describe(o)))
    source = "".join(CudaEmitter(graph.target).emit(k) for k in split_kernels(graph))
    weight = [line for line in source.splitlines() if "= g_Conv_0_weight[" in line]
    assert weight and not any(line.lstrip().startswith("if") for line in weight)


def test_the_time_model_counts_a_lanes_repeated_loads_once():
    """A lane's four copies of one weight (runs of four pixels) are one load in NVRTC's PTX;
    the model counts distinct addresses per lane on a GPU."""
    from gir.fusion.perf import _lane_distinct
    op = Move(src=Slice("w", 0, (24, 128), (1, 0)), dst=Slice("%w", 0, (24, 128), (128, 1)), vec=4)
    assert _lane_distinct(op, 32) == 24
    ragged = Slice("w", 0, (24, 128), (1, 0), (None, Affine(100)))
    assert _lane_distinct(Move(src=ragged, dst=op.dst, vec=4), 32) == 24  # loaded unguarded
    assert _lane_distinct(Move(src=ragged, dst=op.dst, vec=4, fill=0.0), 32) == 96  # a fill keeps the guards


def _runs_graph(rank, target: str, hw: int = 28):
    space = rank.plan_space(load(_conv1x1(24, 8, hw)), get_target(target))
    return space.graph_of(next(o for o in space.options(0, len(space.ops)) if o.rewritten and "runs4" in space.describe(o)))


def test_the_runs_kernel_compiles_wide_and_without_spills(rank):
    """NVRTC for sm_80 and sm_90 and hiprtc for gfx908 and gfx90a build the lane-runs kernel with
    no spill; the PTX loads the input and stores the result 16 bytes at a time."""
    import re
    from gir.backends.cuda.compiler import compile_cuda
    from gir.backends.cuda.emitter import CudaEmitter
    from gir.backends.hip.compiler import compile_hip
    from gir.backends.hip.emitter import HipEmitter
    from gir.backends.kernels import split_kernels
    cuda = _runs_graph(rank, "cuda:sm_90")
    source = "".join(CudaEmitter(cuda.target).emit(k) for k in split_kernels(cuda))
    # streamed (each channel's run multiplied and added where it is loaded) and held to 32
    # registers a thread by __launch_bounds__: uncapped, ptxas hoisted every load (124-136)
    assert re.search(r"__launch_bounds__\(\d+, \d+\)", source)
    for arch in ("sm_80", "sm_90"):
        built = compile_cuda(source, arch)
        assert built.resources and not any(r.spilled for r in built.resources.values())
        assert all(r.registers <= cuda.target.timing.streamed_registers for r in built.resources.values())
        assert re.search(r"ld\.global(\.nc)?\.v4\.f32", built.ptx) and "st.global.v4.f32" in built.ptx
    hip = _runs_graph(rank, "hip:gfx90a")
    source = "".join(HipEmitter(hip.target).emit(k) for k in split_kernels(hip))
    for arch in ("gfx908", "gfx90a"):
        built = compile_hip(source, arch)
        assert built.resources and not any(r.spilled for r in built.resources.values())


def test_a_column_sum_streams_its_loads(rank):
    """A sum down 32 rows with four consecutive outputs a lane (no product: the loads feed the
    reduction directly) streams too: each row's four values are loaded where they are added,
    and the kernel holds 32 registers, not the 128 values a lane's runs span."""
    from onnx import TensorProto, helper
    from gir.backends.cuda.compiler import compile_cuda
    from gir.backends.cuda.emitter import CudaEmitter
    from gir.backends.kernels import split_kernels
    model = helper.make_model(helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], "colsum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])],
        [numpy_helper.from_array(np.array([0], np.int64), "axes")]), opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    space = rank.plan_space(load(model), get_target("cuda:sm_90"))
    runs = [c for cands in space.per_op for c in cands if c.params.get("runs") == 4]
    assert runs
    g = runs[0].graph
    source = "".join(CudaEmitter(g.target).emit(k) for k in split_kernels(g))
    assert "acc3" in source  # four accumulators side by side
    built = compile_cuda(source, "sm_90")
    assert not any(r.spilled for r in built.resources.values())
    assert all(r.registers <= g.target.timing.streamed_registers for r in built.resources.values())
    feeds = {"x": np.random.default_rng(3).standard_normal((32, 1024)).astype(np.float32)}
    interpreted = run(g, feeds).outputs["y"]
    exact = feeds["x"].astype(np.float64).sum(0)  # 32 fp32 terms in some order
    np.testing.assert_allclose(interpreted.reshape(-1), exact, rtol=1e-5, atol=5e-4)
    np.testing.assert_allclose(run_on_cpu_harness(g, feeds, "cuda")["y"].reshape(-1), exact, rtol=1e-5, atol=5e-4)
