"""Valid models the planner once failed on (issue 22, item 1), each run on the CPU against
onnxruntime and planned for cuda:sm_90 (checked there by the reference interpreter, which
runs any target's plan on this machine)."""
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
from gir.frontend import load
from gir.frontend.errors import FrontendError
from gir.fusion.plan import plan
from gir.ir.target import get_target
from gir.runtime import execute

RNG = np.random.default_rng(22)


def _model(node, shapes, opset=18):
    """One node over float inputs ``shapes`` (name -> shape), output y of x's shape."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, next(iter(shapes.values())))
    m = helper.make_model(helper.make_graph([node], "m", inputs, [y]),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _check(model, feeds, want=None):
    if want is None:
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = gir.Session(model, target="cpu").run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    p = plan(load(model), get_target("cuda:sm_90"))
    np.testing.assert_allclose(execute(p, feeds)["y"], want, rtol=1e-4, atol=1e-5)


def _feeds(shapes):
    return {n: RNG.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def _pytorch_converted(name):
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "pytorch-converted", name)


@pytest.mark.parametrize("dims", ["1d", "2d", "3d"])
def test_prelu_opset6_slope_is_per_channel(dims):
    """Before opset 7 a 1-D slope of size C scales channel axis 1 (onnx's expected outputs say
    so; onnxruntime has no PRelu-6 kernel), not the last axis as numpy broadcasting would."""
    folder = _pytorch_converted(f"test_PReLU_{dims}_multiparam")
    model = onnx.load(os.path.join(folder, "model.onnx"))
    x = numpy_helper.to_array(onnx.load_tensor(os.path.join(folder, "test_data_set_0", "input_0.pb")))
    want = numpy_helper.to_array(onnx.load_tensor(os.path.join(folder, "test_data_set_0", "output_0.pb")))
    name, out = model.graph.input[0].name, model.graph.output[0].name
    assert gir.Session(model, target="cpu").run(None, {name: x})[0].shape == want.shape
    np.testing.assert_allclose(gir.Session(model, target="cpu").run(None, {name: x})[0], want, rtol=1e-6)
    # a slope that differs from the channel count shows the axis matters
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(slope, model.graph.initializer[0].name))
    want = np.where(x > 0, x, x * slope.reshape((1, 3) + (1,) * (x.ndim - 2)))
    np.testing.assert_allclose(gir.Session(model, target="cpu").run(None, {name: x})[0], want, rtol=1e-6)
    p = plan(load(model), get_target("cuda:sm_90"))
    np.testing.assert_allclose(execute(p, {name: x})[out], want, rtol=1e-6)


@pytest.mark.parametrize("x,slope", [((2, 3), (3,)), ((2, 3, 4), (3, 1)), ((2, 3, 4, 5), (3, 1, 1)), ((2, 3, 4, 3), (3,))])
def test_prelu_slope_broadcasts_from_the_right(x, slope):
    shapes = {"x": x, "s": slope}
    _check(_model(helper.make_node("PRelu", ["x", "s"], ["y"]), shapes), _feeds(shapes))


def test_prelu_slope_wider_than_x_is_a_clean_error():
    """A slope that does not broadcast to x must be refused, not read out of bounds."""
    m = _model(helper.make_node("PRelu", ["x", "s"], ["y"]), {"x": (2, 1), "s": (2, 3)})
    with pytest.raises(FrontendError, match="do not broadcast"):
        load(m)


@pytest.mark.parametrize("shape", [(1, 512), (1, 1024), (4, 512), (2, 3, 512), (512,), (1000,)])
def test_softmax_with_two_two_phase_reductions(shape):
    """Max and sum both reduce through DRAM partials; each keeps its own (they once shared one
    buffer name, so the merge refused the second writer)."""
    shapes = {"x": shape}
    _check(_model(helper.make_node("Softmax", ["x"], ["y"], axis=1 if len(shape) > 1 else 0), shapes), _feeds(shapes))


@pytest.mark.parametrize("shape,axis", [((1, 512), 1), ((16, 33), 0), ((2, 4, 16, 32), 2)])
def test_layer_normalization_two_phase(shape, axis):
    shapes = {"x": shape, "g": shape[axis:], "b": shape[axis:]}
    _check(_model(helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=axis), shapes), _feeds(shapes))


def test_instance_normalization_two_phase():
    shapes = {"x": (2, 10, 32, 32), "g": (10,), "b": (10,)}
    _check(_model(helper.make_node("InstanceNormalization", ["x", "g", "b"], ["y"]), shapes), _feeds(shapes))


def test_silu_and_squeeze_of_efficientnet_stage6_compile_without_spills():
    """EfficientNet-B0's x * sigmoid(x) and global average pool over (1, 672, 7, 7) fused into one
    512-thread block holding 780 register bytes a lane; NVRTC capped it at 128 registers and
    spilled, and the model failed on an H100 (a spill was an error then). The planner now budgets
    a lane's registers by its block's share of the SM, so every kernel builds without spilling."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs NVRTC (scripts/setup.sh)")
    from gir.backends.errors import SpillWarning
    from gir.build import build_steps
    shape = [1, 672, 7, 7]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    pooled = helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 672, 1, 1])
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"]),
             helper.make_node("GlobalAveragePool", ["y"], ["pooled"])]
    model = helper.make_model(helper.make_graph(nodes, "silu_squeeze", [x], [y, pooled]),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    p = plan(load(model), get_target("cuda:sm_90"), limit=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpillWarning)
        steps = build_steps(p)
    for launch in (k for s in steps for k in s.launches):
        assert launch["registers"] * launch["block"][0] <= 64 * 1024 and "spilled_stack_bytes" not in launch, launch
    feeds = _feeds({"x": shape})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = execute(p, feeds)
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["pooled"], want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["cuda:sm_90", "hip:gfx90a"])
def test_a_step_whose_ops_are_all_dead_builds_for_the_gpus(target):
    """Nodes whose outputs nothing reads leave fused steps with no kernel; the GPU compilers
    named their source after the first kernel and failed with an IndexError (fuzzing)."""
    from gir.build import build_steps
    from gir.backends.registry import compiler
    try:
        compiler(get_target(target)).toolchain_version()
    except Exception as err:  # noqa: BLE001 -- NVRTC or hiprtc missing here
        pytest.skip(f"no {target} compiler: {err}")
    shape = [129]
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "y"))
    nodes = [helper.make_node("Sum", ["x", "x"], ["unused_sum"]), helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("Cos", ["t"], ["unused_cos"]), helper.make_node("Add", ["x", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "dead", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    p = plan(load(model), get_target(target), limit=1)
    steps = build_steps(p)
    assert any(not s.launches for s in steps) and sum(len(s.launches) for s in steps) >= 1
    feeds = _feeds({"x": shape})
    np.testing.assert_allclose(execute(p, feeds)["y"], 2 * feeds["x"], rtol=1e-6)


def _gpu_session_matches(model, target, monkeypatch, feeds):
    """The model on a GPU target without a GPU: every kernel built with the target's real
    compiler (skipped where it is missing), then the Session run on the recording stand-in,
    whose kernels are the emitted source on the CPU harness, against onnxruntime."""
    from gir.backends import device_engine
    from gir.backends.harness.recording import RecordingLauncher, harness_toolchain
    from gir.backends.registry import compiler
    from gir.build import build_steps
    try:
        compiler(get_target(target)).toolchain_version()
    except Exception as err:  # noqa: BLE001 -- NVRTC or hiprtc missing here
        pytest.skip(f"no {target} compiler: {err}")
    build_steps(plan(load(model), get_target(target), limit=1))
    launcher = RecordingLauncher(dialect=target.split(":")[0])
    monkeypatch.setattr(device_engine, "open_launcher", lambda backend: launcher)
    monkeypatch.setattr(device_engine, "_toolchain", harness_toolchain)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = gir.Session(model, target=target, limit=1).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["cuda:sm_90", "hip:gfx90a"])
def test_arithmetic_on_a_reduced_scalar_on_the_gpus(target, monkeypatch):
    """A ReduceMax to one element, then Abs, Add, Reciprocal: the scalar chain is tiled a warp
    wide at stride 0 under `idx < 1`; the emitter counted all 32 lanes as writers of the one
    register element ("written from two lanes by one gOperator", fuzzing)."""
    shape = [3, 33, 7, 33]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1, 1])
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=1), helper.make_node("Abs", ["m"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["s"]), helper.make_node("Reciprocal", ["s"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "scalar_chain", [x], [y], [half]),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    _gpu_session_matches(model, target, monkeypatch, _feeds({"x": shape}))


@pytest.mark.parametrize("target", ["cuda:sm_90", "hip:gfx90a"])
def test_linear_resize_of_a_long_row_on_the_gpus(target, monkeypatch):
    """Resize (linear) of (1, 1, 1000) to 2000 gathers single elements: a 64-lane wavefront's
    unit held 64 indices and 64 values a lane, over MI250X's 512 register bytes, and no gather
    candidate was left (TemplateError, fuzzing). Fewer rows a unit fit."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1000])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2000])
    scales = numpy_helper.from_array(np.array([1, 1, 2], np.float32), "scales")
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")]
    model = helper.make_model(helper.make_graph(nodes, "resize", [x], [y], [scales]),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    _gpu_session_matches(model, target, monkeypatch, _feeds({"x": [1, 1, 1000]}))


@pytest.mark.parametrize("target", ["cuda:sm_90", "hip:gfx90a"])
def test_a_group_no_merged_structure_fits_is_split(target, monkeypatch):
    """ReduceL2 over all of (33, 512, 3, 1), then an Add (fuzzing, seed 16): each op's candidate
    fits a 512-thread block, the merged one would hold 792 register bytes a lane, over the 512
    such a block leaves, and the planner stopped with a GraphError. It now tries the other
    structures, and where none fits, gives each op a kernel of its own."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [33, 512, 3, 1])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1, 1])
    nodes = [helper.make_node("ReduceL2", ["x"], ["n"], keepdims=1), helper.make_node("Add", ["n", "b"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "l2_add", [x, b], [y]), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    _gpu_session_matches(model, target, monkeypatch, _feeds({"x": [33, 512, 3, 1], "b": [1, 1]}))
