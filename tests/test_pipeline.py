"""Whole models through the graph level: partition, movement composition, view folding,
grouping, merging, rewriting, structural reuse; every kernel run in the reference interpreter
and the model's outputs compared with onnxruntime."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from backend_cases import attention_model
from gir.frontend import load
from gir.fusion.partition import partition
from gir.fusion.plan import plan
from gir.ir import get_target
from gir.runtime import execute


def ort_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_tiny_model_through_the_plan_matches_onnxruntime(name):
    model = models.load_bundled(name)
    feeds = models.example_inputs(model, 0)
    graph = load(model)
    result = plan(graph, get_target("h100"), limit=2)
    got = execute(result, feeds, check_races=True)
    for out, want in zip(graph.outputs, ort_outputs(model, feeds)):
        np.testing.assert_allclose(got[out], want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    for sub in result.subgraphs:
        assert sub.gir_bytes > 0 and sub.bound_bytes > 0


@pytest.mark.parametrize("name", ["bert", "shufflenet_v2"])
def test_tiny_model_plan_on_amd_and_cpu_targets(name):
    model = models.load_bundled(name)
    feeds = models.example_inputs(model, 0)
    graph = load(model)
    want = ort_outputs(model, feeds)
    for target in ("mi250x", "cpu"):
        got = execute(plan(graph, get_target(target), limit=1), feeds)
        for out, w in zip(graph.outputs, want):
            np.testing.assert_allclose(got[out], w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())))


def test_repeated_layers_are_planned_once():
    graph = load(models.load_bundled("bert"))
    result = plan(graph, get_target("h100"), limit=1)
    assert sum(k.reused for k in result.kernels) >= 5


def _matmul_model(k: int):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [256, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])
    w = numpy_helper.from_array(np.ones((k, 256), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "mm", [a], [y], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_partition_follows_the_targets_ridge_point():
    """A matmul with inner dimension 16 has about 7 FLOP per byte: below the H100's fp32 ridge
    (about 20), above the local CPU's (about 4.8): GIR on one, the library on the other."""
    graph = load(_matmul_model(16))
    h100, cpu = get_target("h100"), get_target("cpu")
    assert cpu.ridge_point() < 7 < h100.ridge_point()
    on_gpu, on_cpu = partition(graph, h100), partition(graph, cpu)
    assert not on_gpu.library and on_gpu.decisions[0].reason.startswith("7.1 FLOP/B < float32 ridge")
    assert [op.name for op in on_cpu.library] == [graph.ops[0].name]
    x = np.random.default_rng(0).standard_normal((256, 16)).astype(np.float32)
    for target in (h100, cpu):
        got = execute(plan(graph, target, limit=1), {"a": x})["y"]
        np.testing.assert_allclose(got, x @ np.ones((16, 256), np.float32), rtol=1e-5)


def _conv_model(cin, cout, size, kernel, stride, pad, group):
    rng = np.random.default_rng(1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size + 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(rng.standard_normal((cout, cin // group, kernel, kernel)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[kernel] * 2, strides=[stride] * 2,
                              pads=[pad] * 4, group=group),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [x], [y], [w, b])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


@pytest.mark.parametrize("cin,cout,size,kernel,stride,pad,group", [
    (12, 12, 14, 3, 1, 1, 12),   # depthwise, padded on every side
    (12, 12, 14, 3, 2, 1, 12),   # depthwise, strided
    (8, 8, 9, 5, 1, 2, 8),       # depthwise 5x5
    (8, 16, 9, 3, 1, 1, 2),      # grouped: a window of channels x rows x columns per output
])
def test_memory_bound_conv_is_one_kernel_at_the_bound(cin, cout, size, kernel, stride, pad, group):
    """A lowered conv (pad, window, product, sum, bias, ReLU) becomes one kernel: the pad folds
    into masked loads of the input, the product stays in registers, the epilogue fuses; its DRAM
    footprint equals the compulsory bound and its outputs match onnxruntime."""
    model = _conv_model(cin, cout, size, kernel, stride, pad, group)
    graph = load(model)
    x = np.random.default_rng(2).standard_normal(graph.tensors["x"].shape).astype(np.float32)
    for target in ("a100", "mi250x"):
        p = plan(graph, get_target(target), limit=2)
        assert not p.partition.library and len(p.kernels) == 1
        assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
        assert not any(s.excess for s in p.subgraphs)
        np.testing.assert_allclose(execute(p, {"x": x})["y"], ort_outputs(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_lowered_batched_matmul_is_one_kernel():
    """Attention-sized batched matmul below the H100 fp32 ridge: the product over a (12, 32, 32)
    grid and the sum over a flat grid fuse (grid refinement); nothing but the operands and the
    result touches DRAM."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [12, 32, 16])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [12, 16, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph_proto = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "bmm", [a, b], [y])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    p = plan(load(model), get_target("h100"), limit=2)
    assert not p.partition.library and len(p.kernels) == 1
    assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((12, 32, 16)).astype(np.float32), "b": rng.standard_normal((12, 16, 32)).astype(np.float32)}
    np.testing.assert_allclose(execute(p, feeds)["y"], feeds["a"] @ feeds["b"], rtol=1e-4, atol=1e-5)


def test_conv_over_a_channel_shuffle_reads_the_split_compactly():
    """ShuffleNet's concat -> channel shuffle -> split -> 1x1 conv: the split half is no single
    affine view of one tensor (mixed-radix channels), so the conv's window cannot fold through
    it. The half is written once, compactly, and the conv reads it through its window; nothing
    writes the window expanded over output channels (8x the half), and the numbers match."""
    c, hw = 8, 6
    rng = np.random.default_rng(4)
    a, b = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, hw, hw]) for n in "ab")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(rng.standard_normal((c, c, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, 2, c, hw, hw]), "s5"),
             numpy_helper.from_array(np.array([1, 2 * c, hw, hw]), "s4")]
    nodes = [helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
             helper.make_node("Reshape", ["cat", "s5"], ["r5"]),
             helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t5", "s4"], ["shuffled"]),
             helper.make_node("Split", ["shuffled"], ["half0", "half1"], axis=1, num_outputs=2),
             helper.make_node("Conv", ["half1", "w"], ["conv"]),
             helper.make_node("Relu", ["conv"], ["y"])]
    graph_proto = helper.make_graph(nodes, "shuffle", [a, b], [y], inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    graph = load(model)
    p = plan(graph, get_target("h100"), limit=2)
    half = c * hw * hw * 4
    assert not p.partition.library
    assert max(b.nbytes for k in p.kernels for b in k.graph.buffers.values() if b.role == "output") <= half
    assert sum(s.gir_bytes for s in p.subgraphs) <= sum(s.bound_bytes for s in p.subgraphs) + 2 * half
    feeds = {n: rng.standard_normal((1, c, hw, hw)).astype(np.float32) for n in "ab"}
    np.testing.assert_allclose(execute(p, feeds)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)


def _shuffle_nodes(cat: str, out: str, shapes: tuple[str, str]) -> list:
    return [helper.make_node("Reshape", [cat, shapes[0]], [f"{out}.r5"]),
            helper.make_node("Transpose", [f"{out}.r5"], [f"{out}.t5"], perm=[0, 2, 1, 3, 4]),
            helper.make_node("Reshape", [f"{out}.t5", shapes[1]], [out])]


def test_concat_of_a_shuffled_half_composes_into_the_next_shuffle():
    """Two ShuffleNet units: the second concat joins the first shuffle's passthrough half (even
    channels from one tensor, odd from the other) with the branch output. Placed over the
    channel axis split into (channel pair, parity), it composes: neither that half nor the
    second concat is written, the second shuffle's output is copied straight from the sources,
    and the numbers match."""
    c, hw = 8, 5
    rng = np.random.default_rng(5)
    a, b = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, hw, hw]) for n in "ab")
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    shapes = ("s5", "s4")
    inits = [numpy_helper.from_array(np.array([1, 2, c, hw, hw]), "s5"),
             numpy_helper.from_array(np.array([1, 2 * c, hw, hw]), "s4")]
    nodes = [helper.make_node("Concat", ["a", "b"], ["cat"], axis=1), *_shuffle_nodes("cat", "shuffled", shapes),
             helper.make_node("Split", ["shuffled"], ["half0", "half1"], axis=1, num_outputs=2),
             helper.make_node("Relu", ["half1"], ["branch"]),
             helper.make_node("Concat", ["half0", "branch"], ["cat2"], axis=1), *_shuffle_nodes("cat2", "z", shapes)]
    graph_proto = helper.make_graph(nodes, "two_units", [a, b], [z], inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("h100"), limit=2)
    written = {b.name for k in p.kernels for b in k.graph.buffers.values() if b.role == "output"}
    assert not written & {"cat2", "half0", "shuffled"}
    feeds = {n: rng.standard_normal((1, c, hw, hw)).astype(np.float32) for n in "ab"}
    np.testing.assert_allclose(execute(p, feeds)["z"], ort_outputs(model, feeds)[0], rtol=1e-6)


def test_unfold_taps_merge_into_one_strided_view_only_when_affine():
    """The 49 taps of a 7x7 unfold (one piece each, along the tap dimension) read over the taps
    split 7x7 are one affine view of the padded source: tap (i, j) at i rows and j columns. One
    tap moved elsewhere breaks the affinity, and the pieces must then not merge."""
    from gir.fusion.compose import Content, Piece, single_view
    c, hw, k, row = 2, 4, 7, 10
    src_strides = (0, row * row, 0, row, 1)
    pieces = [Piece((0, 0, t, 0, 0), (1, c, t + 1, hw, hw), "padded", (t // k) * row + t % k, src_strides)
              for t in range(k * k)]
    shape = (1, c, k, k, hw, hw)
    strides = (0, k * k * hw * hw, k * hw * hw, hw * hw, hw, 1)
    assert single_view(Content((1, c, k * k, hw, hw), tuple(pieces)), shape, strides) == ("padded", 0, (0, row * row, row, 1, row, 1))
    moved = pieces[:10] + [Piece(pieces[10].lo, pieces[10].hi, "padded", pieces[10].offset + 1, src_strides)] + pieces[11:]
    assert single_view(Content((1, c, k * k, hw, hw), tuple(moved)), shape, strides) is None


@pytest.mark.parametrize("keepdims", [0, 1])
def test_involution_sums_its_unfolded_window_in_place(keepdims):
    """RedNet's involution: a 7x7 unfold (pad, 49 shifted slices, concat) times a per-pixel
    kernel, summed over the 49 taps, which sit between channels and pixels. The product and the
    sum are reordered taps-last with the taps split 7x7, where the unfold is one strided view of
    the padded input: one kernel, neither the unfold nor the product (49x the input) written."""
    c, hw, k = 16, 8, 7
    rng = np.random.default_rng(6)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, k * k, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(np.array([0, 0, 3, 3, 0, 0, 3, 3]), "pads"),
             numpy_helper.from_array(np.array([2, 3]), "axes"), numpy_helper.from_array(np.array([2]), "at"),
             numpy_helper.from_array(np.array([1, 1, 1, k * k, hw, hw]), "wshape"),
             numpy_helper.from_array(np.array([1, 1, c, k * k, hw, hw]), "ushape"),
             numpy_helper.from_array(np.array([3]), "taps")]
    nodes = [helper.make_node("Pad", ["x", "pads"], ["xp"], mode="constant")]
    for i in range(k):
        for j in range(k):
            inits.append(numpy_helper.from_array(np.array([i, j]), f"s{i}{j}"))
            inits.append(numpy_helper.from_array(np.array([i + hw, j + hw]), f"e{i}{j}"))
            nodes += [helper.make_node("Slice", ["xp", f"s{i}{j}", f"e{i}{j}", "axes"], [f"sl{i}{j}"]),
                      helper.make_node("Unsqueeze", [f"sl{i}{j}", "at"], [f"un{i}{j}"])]
    nodes += [helper.make_node("Concat", [f"un{i}{j}" for i in range(k) for j in range(k)], ["cat"], axis=2),
              helper.make_node("Reshape", ["cat", "ushape"], ["unfold"]),
              helper.make_node("Reshape", ["w", "wshape"], ["kernel"]),
              helper.make_node("Mul", ["kernel", "unfold"], ["prod"]),
              helper.make_node("ReduceSum", ["prod", "taps"], ["sum"], keepdims=keepdims),
              helper.make_node("Relu", ["sum"], ["y"])]
    graph_proto = helper.make_graph(nodes, "involution", [x, w], [y], inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("h100"), limit=2)
    padded = c * (hw + 6) ** 2 * 4
    assert max(b.nbytes for k_ in p.kernels for b in k_.graph.buffers.values() if b.role == "output") <= padded
    assert sum(s.gir_bytes for s in p.subgraphs) <= sum(s.bound_bytes for s in p.subgraphs) + 2 * padded
    feeds = {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32),
             "w": rng.standard_normal((1, k * k, hw, hw)).astype(np.float32)}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_bias_adds_are_recomputed_in_the_attention_product():
    """BERT's attention: the q and k bias adds are read through head transposes and the lowered
    QK^T's broadcasts, which would send each add through DRAM (written, read back). The adds are
    recomputed in the product's loads instead: no kernel writes them, the plan reads the matmul
    outputs and biases once and writes the scores once (the bound), and the numbers match."""
    seq, heads, dim = 8, 2, 16
    rng = np.random.default_rng(7)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, seq, heads * dim]) for n in ("xq", "xk")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(rng.standard_normal(heads * dim).astype(np.float32), n) for n in ("bq", "bk")]
    inits.append(numpy_helper.from_array(np.array([1, seq, heads, dim]), "split_heads"))
    nodes = [helper.make_node("Add", ["xq", "bq"], ["q"]), helper.make_node("Add", ["xk", "bk"], ["k"]),
             helper.make_node("Reshape", ["q", "split_heads"], ["q4"]), helper.make_node("Reshape", ["k", "split_heads"], ["k4"]),
             helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["qt", "kt"], ["y"])]
    graph_proto = helper.make_graph(nodes, "attention_scores", inputs, [y], inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("h100"), limit=2)
    assert not p.partition.library
    assert not {"q", "k", "qt", "kt"} & {t for k_ in p.kernels for t in k_.writes}
    assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
    feeds = {n: rng.standard_normal((1, seq, heads * dim)).astype(np.float32) for n in ("xq", "xk")}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_bias_add_is_computed_where_the_head_transpose_writes_for_the_library():
    """BERT on A100: the attention products go to the library, so q's bias add is read only
    through the head transpose that copies it out of the subgraph. The copy becomes a view and
    takes the add: one kernel reads the matmul output and bias once and writes the transposed
    q once (the bound), instead of an add kernel and a copy kernel (twice the bytes)."""
    seq, heads, dim = 64, 2, 64
    rng = np.random.default_rng(11)
    x = helper.make_tensor_value_info("xq", TensorProto.FLOAT, [1, seq, heads * dim])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(rng.standard_normal(heads * dim).astype(np.float32), "bq"),
             numpy_helper.from_array(np.array([1, seq, heads, dim]), "split_heads"),
             numpy_helper.from_array(rng.standard_normal((dim, 256)).astype(np.float32), "w")]
    nodes = [helper.make_node("Add", ["xq", "bq"], ["q"]), helper.make_node("Reshape", ["q", "split_heads"], ["q4"]),
             helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]), helper.make_node("MatMul", ["qt", "w"], ["y"])]
    model = onnx.shape_inference.infer_shapes(helper.make_model(helper.make_graph(nodes, "head_split", [x], [y], inits),
                                                                opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("a100"), limit=2)
    assert [op.kind for op in p.partition.library] == ["matmul"]
    assert len(p.kernels) == 1 and "q" not in p.kernels[0].writes
    assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
    feeds = {"xq": rng.standard_normal((1, seq, heads * dim)).astype(np.float32)}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_softmax_normalisation_is_not_recomputed_in_the_next_product():
    """Softmax then P @ V: the division by the row sum is read through the product's broadcast,
    but its exponentials come from registers of the kernel that sums them. Recomputing the
    division in the product would write the exponentials and the sums instead of the
    probabilities, so it stays: scores read once, probabilities written and read once."""
    heads, seq, dim = 2, 16, 8
    rng = np.random.default_rng(8)
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, heads, seq, seq])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, heads, seq, dim])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Softmax", ["s"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    model = onnx.shape_inference.infer_shapes(helper.make_model(helper.make_graph(nodes, "attention_values", [s, v], [y]),
                                                                opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("h100"), limit=2)
    assert not p.partition.library
    scores, values, out = (4 * heads * seq * n for n in (seq, dim, dim))
    assert sum(sub.gir_bytes for sub in p.subgraphs) <= 3 * scores + values + out
    feeds = {"s": rng.standard_normal((1, heads, seq, seq)).astype(np.float32),
             "v": rng.standard_normal((1, heads, seq, dim)).astype(np.float32)}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_attention_context_is_written_in_its_transposed_layout():
    """P @ V, heads transposed back and merged: the product's sum writes the transposed layout
    directly (its index space permuted), so no copy kernel rereads the product: one kernel,
    operands read once, the context written once, and the numbers match."""
    heads, seq, dim = 2, 16, 8
    rng = np.random.default_rng(9)
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, heads, seq, seq])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, heads, seq, dim])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("MatMul", ["a", "v"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ctx_t", "merged"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1, seq, heads * dim]), "merged")]
    model = onnx.shape_inference.infer_shapes(helper.make_model(helper.make_graph(nodes, "context", [a, v], [y], inits),
                                                                opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("h100"), limit=2)
    assert not p.partition.library and len(p.kernels) == 1
    assert sum(sub.gir_bytes for sub in p.subgraphs) == sum(sub.bound_bytes for sub in p.subgraphs)
    feeds = {"a": rng.standard_normal((1, heads, seq, seq)).astype(np.float32),
             "v": rng.standard_normal((1, heads, seq, dim)).astype(np.float32)}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_residual_sum_is_recomputed_inside_the_next_padded_conv_window():
    """SAR-DRN's last layer: batch norm, ReLU and a residual add feed a padded 3x3 conv to one
    channel (memory-bound, lowered). The sum is recomputed in the conv's window loads from the
    conv input and the skip, both read through the pad, and an inside mask restores the pad's
    zeros (batch norm's shift would make the recomputed border nonzero): no kernel writes the
    sum, the plan is at the bound plus the mask, and the numbers match. Not on a CPU."""
    c, hw = 16, 12
    rng = np.random.default_rng(10)
    x, skip = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, hw, hw]) for n in ("x", "skip"))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32) + 1.0, "shift"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "mean"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "var"),
             numpy_helper.from_array(rng.standard_normal((1, c, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "shift", "mean", "var"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["relu"]), helper.make_node("Add", ["relu", "skip"], ["sum"]),
             helper.make_node("Conv", ["sum", "w"], ["y"], pads=[1, 1, 1, 1])]
    model = onnx.shape_inference.infer_shapes(helper.make_model(helper.make_graph(nodes, "residual_conv", [x, skip], [y], inits),
                                                                opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("h100"), limit=2)
    assert not p.partition.library
    assert "sum" not in {t for k in p.kernels for t in k.writes}
    mask = (hw + 2) ** 2 * 4  # one plane of the padded size, broadcast over channels
    assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs) + mask
    feeds = {n: rng.standard_normal((1, c, hw, hw)).astype(np.float32) for n in ("x", "skip")}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-4)
    # A CPU's ridge point is 4x lower: recomputing 5 operations per window element costs more
    # time than the sum's DRAM round trip saves, so the sum is written there.
    assert "sum" in {t for k in plan(load(model), get_target("cpu"), limit=2).kernels for t in k.writes}


def test_relu_is_recomputed_through_a_zero_pad_without_a_mask():
    """ReLU then a padded 3x3 conv to one channel (lowered): ReLU(0) is the pad value, so the
    ReLU is recomputed in the conv's window loads from its input read through the same pad, with
    no inside mask (a batch norm's shift needs one, above): the plan is exactly the bound."""
    c, hw = 16, 12
    rng = np.random.default_rng(12)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(rng.standard_normal((1, c, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Relu", ["x"], ["relu"]), helper.make_node("Conv", ["relu", "w"], ["y"], pads=[1, 1, 1, 1])]
    model = onnx.shape_inference.infer_shapes(helper.make_model(helper.make_graph(nodes, "relu_conv", [x], [y], [w]),
                                                                opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("h100"), limit=2)
    assert not p.partition.library
    assert "relu" not in {t for k in p.kernels for t in k.writes}
    assert not [t for t in p.graph.tensors if t.endswith("/inside")]
    assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
    feeds = {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_unfold_joins_the_subgraph_that_reads_it():
    """An involution's shape: a 3x3 unfold (pad, 9 shifted slices, concat) of a ReLU output is
    multiplied by a library conv's output and summed over the taps. The multiply comes after the
    library call, so it is another subgraph; the unfold, read only there, joins it instead of
    being written 9 times the ReLU's size for it. The second subgraph reads the ReLU output
    through the window: the plan is at the bound and no kernel writes the unfold."""
    c, hw = 128, 16
    rng = np.random.default_rng(13)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(rng.standard_normal((c, c, 1, 1)).astype(np.float32) / 8, "w"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1]), "pads"),
             numpy_helper.from_array(np.array([2], dtype=np.int64), "two"),
             numpy_helper.from_array(np.array([2, 3]), "hw_axes"), numpy_helper.from_array(np.array([2]), "taps")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Conv", ["r", "w"], ["k"]),
             helper.make_node("Pad", ["r", "pads"], ["rp"]), helper.make_node("Unsqueeze", ["k", "two"], ["k5"])]
    taps = []
    for i in range(3):
        for j in range(3):
            starts, ends = f"s{i}{j}", f"e{i}{j}"
            inits += [numpy_helper.from_array(np.array([i, j]), starts), numpy_helper.from_array(np.array([i + hw, j + hw]), ends)]
            nodes += [helper.make_node("Slice", ["rp", starts, ends, "hw_axes"], [f"t{i}{j}"]),
                      helper.make_node("Unsqueeze", [f"t{i}{j}", "two"], [f"u{i}{j}"])]
            taps.append(f"u{i}{j}")
    nodes += [helper.make_node("Concat", taps, ["unfold"], axis=2), helper.make_node("Mul", ["unfold", "k5"], ["prod"]),
              helper.make_node("ReduceSum", ["prod", "taps"], ["y"], keepdims=0)]
    model = onnx.shape_inference.infer_shapes(helper.make_model(helper.make_graph(nodes, "involution", [x], [y], inits),
                                                                opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("a100"), limit=2)
    assert [op.kind for op in p.partition.library] == ["conv"] and len(p.subgraphs) == 2
    assert "rp" in {t for op in p.subgraphs[1].ops for t in op.outputs}
    assert not {"unfold", "rp", "prod"} & {t for k in p.kernels for t in k.writes}
    assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
    feeds = {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel, pads", [([3, 3], [1, 1, 1, 1]), ([2, 2], [0, 0, 0, 0])])
@pytest.mark.parametrize("act, swapped", [("Relu", True), ("Sigmoid", True), ("Abs", False), ("Neg", False)])
def test_monotone_activation_moves_after_the_max_pooling_that_reads_it(act, swapped, kernel, pads):
    """ResNet's stem: ReLU then a padded 3x3/2 max pooling. ReLU is non-decreasing, so it
    commutes with max and becomes the pooling's epilogue: one kernel at the bound instead of the
    activation written at full size and read back (with a -inf pad, or a 2x2/2 pooling without
    one). |x| and -x do not commute with max and stay before it (where windows do not overlap,
    the pooling kernel may still compute them on its loads)."""
    rng = np.random.default_rng(14)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node(act, ["x"], ["a"]),
             helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=kernel, strides=[2, 2], pads=pads)]
    model = onnx.shape_inference.infer_shapes(helper.make_model(helper.make_graph(nodes, "stem_pool", [x], [y]),
                                                                opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target("a100"), limit=2)
    producer = {op.outputs[0]: op for op in p.graph.ops}
    assert (producer["y"].kind == "elementwise") == swapped
    if swapped:
        assert "a" not in {t for k in p.kernels for t in k.writes}
        assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
    feeds = {"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_activation_stays_before_a_pooling_with_a_window_of_padding_only():
    """relu(max) == max(relu) fails where a window holds only the -inf pad (relu(-inf) is 0):
    such a pooling keeps its activation first. Windows of 2 at stride 2 over a pad of 2: the
    corner windows read padding only."""
    from math import inf

    from gir.frontend.basic import BasicGraph, BasicOp, Tensor
    from gir.fusion.commute import pooling_before_monotone_ops
    from gir.ir.expr import Input, call

    tensors = {n: Tensor(n, s, "float32") for n, s in
               (("x", (1, 1, 4, 4)), ("a", (1, 1, 4, 4)), ("ap", (1, 1, 8, 8)), ("win", (1, 1, 4, 4, 2, 2)), ("y", (1, 1, 4, 4)))}
    ops = [BasicOp("relu", "elementwise", ["x"], ["a"], {"expr": call("relu", Input(0)), "dtype": "float32"}, "test"),
           BasicOp("pad", "pad", ["a"], ["ap"], {"pads": ((0, 0), (0, 0), (2, 2), (2, 2)), "mode": "constant", "value": -inf}, "test"),
           BasicOp("win", "layout", ["ap"], ["win"], {"offset": 0, "shape": (1, 1, 4, 4, 2, 2), "strides": (64, 64, 16, 2, 8, 1)}, "test"),
           BasicOp("max", "reduce", ["win"], ["y"], {"op": "max", "axes": (4, 5), "keepdims": False}, "test")]
    graph = BasicGraph(tensors, ops, ["x"], ["y"], "corner_pool")
    _, [sub] = pooling_before_monotone_ops(graph, [list(ops)])
    assert [op.name for op in sub] == ["relu", "pad", "win", "max"]
    ops[1].attrs["pads"], tensors["ap"] = ((0, 0), (0, 0), (1, 1), (1, 1)), Tensor("ap", (1, 1, 6, 6), "float32")
    ops[2].attrs.update(shape=(1, 1, 3, 3, 2, 2), strides=(36, 36, 12, 2, 6, 1))
    tensors["win"], tensors["y"] = Tensor("win", (1, 1, 3, 3, 2, 2), "float32"), Tensor("y", (1, 1, 3, 3), "float32")
    _, [sub] = pooling_before_monotone_ops(graph, [list(ops)])
    assert sub[-1].name == "relu/after max" and "relu" not in [op.name for op in sub]


def test_matrix_vector_product_is_one_kernel_on_the_cpu_target():
    """GPT-2 decode's shape: [1, 768] x [768, 512] is memory-bound, lowered to a product and a
    sum over K. On the CPU a whole row of 768 per unit fits its registers, so the two fuse: no
    K x N product in DRAM, nothing but the operands and the result."""
    rng = np.random.default_rng(5)
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 768])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = rng.standard_normal((768, 512)).astype(np.float32)
    graph_proto = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "mv", [a], [y],
                                    [numpy_helper.from_array(w, "w")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    p = plan(load(model), get_target("cpu"), limit=2)
    assert not p.partition.library and len(p.kernels) == 1
    assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
    x = rng.standard_normal((1, 768)).astype(np.float32)
    np.testing.assert_allclose(execute(p, {"a": x})["y"], x @ w, rtol=1e-4, atol=1e-4)


def test_attention_is_one_kernel_where_its_products_are_memory_bound():
    """Self-attention on H100, where QK^T and P @ V fall below the ridge: the scores, their
    softmax and the weighted sum share one block per (head, query row), so the scores and the
    probabilities stay in registers and shared memory: one kernel, no (heads, seq, seq) tensor
    written, DRAM bytes at the bound, and the numbers match onnxruntime. (Its CUDA and HIP
    source is checked in test_emitters.py.)"""
    seq, heads, dim = 64, 2, 32
    model = attention_model(seq, heads, dim)
    graph = load(model)
    p = plan(graph, get_target("h100"), limit=2)
    assert not p.partition.library and len(p.kernels) == 1
    scores = {t.name for t in graph.tensors.values() if t.shape == (1, heads, seq, seq)}
    assert scores and not {b.name for b in p.kernels[0].graph.buffers.values() if b.level == "dram"} & scores
    assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
    rng = np.random.default_rng(12)
    feeds = {n: rng.standard_normal((1, seq, heads * dim)).astype(np.float32) for n in ("xq", "xk", "xv")}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["a100", "h100", "mi100", "mi250x"])
def test_every_planned_kernel_is_one_the_targets_emitter_lowers(target):
    """The IR allows any cross-lane read after a unit sync; the emitters shuffle only regular
    patterns. The planner keeps only structures the target's emitter lowers (on MI250X the
    first-ranked fused attention has a transposing exchange: the plan splits off P @ V)."""
    from gir.backends.harness.graph_runner import emitter_for
    from gir.backends.kernels import split_kernels
    t = get_target(target)
    p = plan(load(attention_model(64, 2, 32)), t, limit=2)
    assert [k.unlowerable for k in p.kernels] == [None] * len(p.kernels)
    emitter = emitter_for(t.backend, t)
    for k in p.kernels:
        for part in split_kernels(k.graph):
            emitter.kernel_source(part)


@pytest.mark.parametrize("target", ["cpu", "a100"])
def test_a_pooling_over_batch_and_channels_reads_through_its_pad(target):
    """A padded 3x3/2 max pooling over a batch of 2 x 8 channels (ShuffleNet's stem as exported
    at 64x64, batch 2): a grid axis that runs over batch and channels together steps the
    padded tensor by a plane, which the pad fold split into a channel coordinate that carries
    into the batch, so it gave up and a kernel of its own wrote the padded copy (27 us of the
    exported model's 190 on one CPU thread). Runs of unpadded dimensions now fold as one."""
    rng = np.random.default_rng(21)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 32, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]
    model = onnx.shape_inference.infer_shapes(helper.make_model(helper.make_graph(nodes, "pool", [x], [y]),
                                                                opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    p = plan(load(model), get_target(target), limit=2)
    assert not [k.name for k in p.kernels if any("window_pad" in t for t in k.writes)], [k.name for k in p.kernels]
    assert sum(s.gir_bytes for s in p.subgraphs) == sum(s.bound_bytes for s in p.subgraphs)
    feeds = {"x": rng.standard_normal((2, 8, 32, 32)).astype(np.float32)}
    np.testing.assert_allclose(execute(p, feeds, check_races=True)["y"], ort_outputs(model, feeds)[0], rtol=1e-6, atol=0)
