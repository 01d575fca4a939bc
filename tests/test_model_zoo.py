"""Tests of the model zoo (``models/``): tiny variants (checker, strict shape inference, static
shapes, onnxruntime, bundled files up to date) and the full-size models (checker, strict shape
inference, key structure).  The full-size models are built but not run here (that is
``python -m models report``)."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import models
from models import MODELS, example_inputs
from models.__main__ import main as cli_main
from models._builder import count_parameters

ort = pytest.importorskip("onnxruntime")

# the op types the GIR frontend supports
ALLOWED_OPS = set(
    """Add Sub Mul Div Pow Sqrt Reciprocal Neg Abs Exp Log Erf Tanh Sigmoid Relu LeakyRelu Clip
    HardSigmoid HardSwish Where Equal Less Greater And Or Not Cast Softmax LogSoftmax
    LayerNormalization BatchNormalization InstanceNormalization ReduceSum ReduceMean ReduceMax
    ReduceMin ReduceProd ReduceL2 GlobalAveragePool MaxPool AveragePool Conv MatMul Gemm Transpose
    Concat Split Slice Pad Gather Expand Tile Reshape Squeeze Unsqueeze Flatten Constant""".split()
)

NAMES = list(MODELS)


def check_model(m: onnx.ModelProto) -> onnx.ModelProto:
    """Checker (full), strict typed shape inference, static shapes everywhere, allowed ops only,
    exporter-like unique node names, IR 10 / opset 17.  Returns the inferred model."""
    assert m.ir_version == 10
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 17)]
    onnx.checker.check_model(m, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    ops = {n.op_type for n in m.graph.node}
    assert ops <= ALLOWED_OPS, ops - ALLOWED_OPS
    names = [n.name for n in m.graph.node]
    assert len(set(names)) == len(names) and all(n.startswith("/") for n in names)
    produced = {o for n in m.graph.node for o in n.output}
    typed = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    assert produced <= set(typed), produced - set(typed)
    for name, vi in typed.items():
        tt = vi.type.tensor_type
        assert tt.HasField("shape"), name
        assert all(d.HasField("dim_value") for d in tt.shape.dim), (name, tt.shape)
    return inferred


def shape_of(inferred: onnx.ModelProto, name: str) -> list[int]:
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        if vi.name == name:
            return [d.dim_value for d in vi.type.tensor_type.shape.dim]
    raise KeyError(name)


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def ops(m: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in m.graph.node)


def init_shapes(m: onnx.ModelProto) -> dict[str, list[int]]:
    return {t.name: list(t.dims) for t in m.graph.initializer}


def depthwise_convs(m: onnx.ModelProto) -> list[onnx.NodeProto]:
    shapes = init_shapes(m)
    out = []
    for n in m.graph.node:
        if n.op_type == "Conv" and attr(n, "group", 1) > 1:
            w = shapes[n.input[1]]
            if attr(n, "group") == w[0] and w[1] == 1:  # group == in == out channels
                out.append(n)
    return out


# ----------------------------------------------------------------------------- tiny variants


@pytest.fixture(scope="module", params=NAMES)
def tiny(request):
    return request.param, MODELS[request.param](tiny=True)


def test_registry():
    assert NAMES == ["bert", "gpt2", "gpt2_b128", "vit", "efficientnet_b0", "shufflenet_v2", "rednet50", "sardrn"]
    with pytest.raises(KeyError, match="unknown model"):
        models.build("resnet")


def test_tiny_checks(tiny):
    name, m = tiny
    check_model(m)
    assert m.ByteSize() < 1_000_000


def test_tiny_runs_in_onnxruntime(tiny):
    name, m = tiny
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = example_inputs(m, seed=0)
    sess.run(None, feeds)
    t0 = time.perf_counter()
    outs = sess.run(None, feeds)
    assert time.perf_counter() - t0 < 1.0
    inferred = onnx.shape_inference.infer_shapes(m)
    for o, v in zip(m.graph.output, outs):
        assert list(v.shape) == shape_of(inferred, o.name)
        assert np.isfinite(v).all(), o.name
    # seeded: the same inputs give the same outputs
    again = sess.run(None, example_inputs(m, seed=0))
    for a, b in zip(outs, again):
        np.testing.assert_array_equal(a, b)


def test_tiny_is_deterministic(tiny):
    name, m = tiny
    assert MODELS[name](tiny=True).SerializeToString() == m.SerializeToString()


def test_bundled_is_up_to_date(tiny):
    name, m = tiny
    path = models.bundled_path(name)
    assert path.exists(), f"missing {path}: run `python -m models build --tiny --out models/bundled`"
    data = path.read_bytes()
    assert len(data) < 1_000_000
    assert data == m.SerializeToString(), (
        f"{path} differs from the builder: regenerate with `python -m models build --tiny --out models/bundled`"
    )


def test_gpt2_tiny_present_extends_past():
    m = MODELS["gpt2"](tiny=True)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = example_inputs(m, seed=1)
    res = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert list(res)[0] == "logits"
    for i in range(2):
        for kv in ("key", "value"):
            past = feeds[f"past_key_values.{i}.{kv}"]
            present = res[f"present.{i}.{kv}"]
            assert present.shape[2] == past.shape[2] + 1
            np.testing.assert_array_equal(present[:, :, :-1], past)


def test_rednet_tiny_involution_matches_numpy():
    """The ONNX unfold (Pad + K*K Slice + Unsqueeze + Concat) computes torch's involution."""
    from onnx import TensorProto

    from models._builder import GraphBuilder
    from models.rednet50 import involution

    for stride, K, C, hw in [(1, 3, 32, 6), (2, 7, 16, 8)]:
        b = GraphBuilder("inv", seed=0)
        x = b.input("x", TensorProto.FLOAT, [1, C, hw, hw])
        b.output(involution(b, x, 1, C, hw, K, stride), "y", TensorProto.FLOAT, [1, C, hw // stride, hw // stride])
        m = b.build()
        w = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        X = np.random.default_rng(1).standard_normal((1, C, hw, hw)).astype(np.float32)
        Y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
        ho = hw // stride
        src = X if stride == 1 else X.reshape(1, C, ho, stride, ho, stride).mean((3, 5))
        h = np.einsum("oc,bchw->bohw", w["conv1.conv.weight"][:, :, 0, 0], src) + w["conv1.conv.bias"][:, None, None]
        h = np.maximum(h, 0)
        k = np.einsum("oc,bchw->bohw", w["conv2.conv.weight"][:, :, 0, 0], h) + w["conv2.conv.bias"][:, None, None]
        k = k.reshape(C // 16, K * K, ho, ho)
        p = (K - 1) // 2
        Xp = np.pad(X[0], ((0, 0), (p, p), (p, p)))
        ref = np.zeros((C, ho, ho), np.float32)
        for i in range(K):
            for j in range(K):
                win = Xp[:, i : i + stride * (ho - 1) + 1 : stride, j : j + stride * (ho - 1) + 1 : stride]
                ref += win * np.repeat(k[:, i * K + j], 16, axis=0)
        np.testing.assert_allclose(Y[0], ref, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- command line


def test_cli_build_and_report(tmp_path, capsys):
    assert cli_main(["build", "--tiny", "--out", str(tmp_path / "z"), "--only", "sardrn", "vit"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and out[0].startswith("sardrn:")
    assert (tmp_path / "z" / "sardrn_tiny.onnx").read_bytes() == models.bundled_path("sardrn").read_bytes()
    md = tmp_path / "r.md"
    assert cli_main(["report", "--tiny", "--only", "sardrn", "--runs", "1", "--out", str(md), "--json"]) == 0
    table = capsys.readouterr().out
    assert "| sardrn_tiny | 3,193 | 21 | Conv 7, Relu 6, BatchNormalization 5, Add 2, Sub 1 |" in table
    assert md.read_text() == table
    assert (tmp_path / "r.json").exists()


def test_cli_errors(tmp_path, capsys):
    assert cli_main(["build", "--out", str(tmp_path), "--only", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model 'nope'") and err.count("\n") == 1
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli_main(["build", "--tiny", "--out", str(blocker / "sub"), "--only", "sardrn"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot create output directory") and err.count("\n") == 1


# ---------------------------------------------------------------------------- full-size models


@pytest.mark.slow
def test_full_bert():
    m = MODELS["bert"]()
    inf = check_model(m)
    c = ops(m)
    assert c["LayerNormalization"] == 1 + 2 * 12  # embeddings + 12 (attention, output) pairs
    assert c["Softmax"] == 12 and c["Erf"] == 12 and c["MatMul"] == 12 * 8
    assert [shape_of(inf, i.name) for i in m.graph.input] == [[1, 128]] * 3
    sm = [n for n in m.graph.node if n.op_type == "Softmax"]
    assert all(shape_of(inf, n.output[0]) == [1, 12, 128, 128] for n in sm)
    assert shape_of(inf, "last_hidden_state") == [1, 128, 768]
    assert 108e6 < count_parameters(m) < 111e6


def _check_gpt2(batch: int, name: str):
    m = MODELS[name]()
    inf = check_model(m)
    c = ops(m)
    assert c["Concat"] == 24 and c["Softmax"] == 12 and c["Pow"] == 12 and c["Tanh"] == 12
    assert c["LayerNormalization"] == 25 and c["Split"] == 12
    assert "Erf" not in c
    ins = {i.name: shape_of(inf, i.name) for i in m.graph.input}
    assert ins["input_ids"] == [batch, 1] and ins["attention_mask"] == [batch, 129]
    assert len(ins) == 2 + 24
    assert all(ins[f"past_key_values.{i}.{kv}"] == [batch, 12, 128, 64] for i in range(12) for kv in ("key", "value"))
    outs = [o.name for o in m.graph.output]
    assert outs[0] == "logits" and shape_of(inf, "logits") == [batch, 1, 50257]
    assert len(outs) == 1 + 24
    assert all(shape_of(inf, f"present.{i}.{kv}") == [batch, 12, 129, 64] for i in range(12) for kv in ("key", "value"))
    for n in m.graph.node:
        if n.op_type == "Concat":
            assert n.input[0].startswith("past_key_values.") and n.output[0].startswith("present.")
    assert 123e6 < count_parameters(m) < 126e6


@pytest.mark.slow
def test_full_gpt2():
    _check_gpt2(1, "gpt2")


@pytest.mark.slow
def test_full_gpt2_b128():
    _check_gpt2(128, "gpt2_b128")


@pytest.mark.slow
def test_full_vit():
    m = MODELS["vit"]()
    inf = check_model(m)
    c = ops(m)
    assert c["LayerNormalization"] == 25 and c["Softmax"] == 12 and c["Erf"] == 12 and c["Conv"] == 1
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    assert attr(conv, "kernel_shape") == [16, 16] and attr(conv, "strides") == [16, 16]
    assert shape_of(inf, conv.output[0]) == [1, 768, 14, 14]
    assert shape_of(inf, "pixel_values") == [1, 3, 224, 224]
    sm = [n for n in m.graph.node if n.op_type == "Softmax"]
    assert all(shape_of(inf, n.output[0]) == [1, 12, 197, 197] for n in sm)
    assert shape_of(inf, "logits") == [1, 1000]
    assert 85e6 < count_parameters(m) < 88e6


@pytest.mark.slow
def test_full_efficientnet_b0():
    m = MODELS["efficientnet_b0"]()
    inf = check_model(m)
    c = ops(m)
    dw = depthwise_convs(m)
    assert len(dw) == 16  # one per MBConv block
    assert sorted({attr(n, "kernel_shape")[0] for n in dw}) == [3, 5]
    assert c["GlobalAveragePool"] == 16 + 1  # SE per block + head
    assert c["Sigmoid"] == 1 + 15 + 16 + 16 + 16 + 1  # stem, expand, dw, SE SiLU, SE gate, head
    assert c["Conv"] == 1 + 15 + 16 + 2 * 16 + 16 + 1
    assert "BatchNormalization" not in c  # folded
    assert shape_of(inf, "logits") == [1, 1000]
    assert 5.2e6 < count_parameters(m) < 5.35e6


@pytest.mark.slow
def test_full_shufflenet_v2():
    m = MODELS["shufflenet_v2"]()
    inf = check_model(m)
    c = ops(m)
    assert len(depthwise_convs(m)) == 3 * 2 + 13 and all(
        attr(n, "kernel_shape") == [3, 3] for n in depthwise_convs(m)
    )
    assert c["Split"] == 13 and c["Concat"] == 16 and c["MaxPool"] == 1
    tr = [n for n in m.graph.node if n.op_type == "Transpose"]
    assert len(tr) == 16 and all(attr(n, "perm") == [0, 2, 1, 3, 4] for n in tr)
    assert c["Reshape"] == 32
    mp = next(n for n in m.graph.node if n.op_type == "MaxPool")
    assert shape_of(inf, mp.output[0]) == [1, 24, 56, 56]
    assert shape_of(inf, "logits") == [1, 1000]
    assert 2.2e6 < count_parameters(m) < 2.3e6


@pytest.mark.slow
def test_full_rednet50():
    m = MODELS["rednet50"]()
    inf = check_model(m)
    c = ops(m)
    n_inv = 1 + 3 + 4 + 6 + 3  # stem + bottlenecks
    assert c["ReduceSum"] == n_inv and c["Pad"] == n_inv and c["BatchNormalization"] == n_inv
    assert c["Slice"] == 9 + 16 * 49 and c["Unsqueeze"] == c["Slice"]
    assert c["AveragePool"] == 3  # strided involutions pool before generating kernels
    sums = [n for n in m.graph.node if n.op_type == "ReduceSum"]
    out_shapes = [shape_of(inf, n.output[0]) for n in sums]
    assert out_shapes[1] == [1, 4, 16, 56, 56] and out_shapes[-1] == [1, 32, 16, 7, 7]
    k3 = [n.name for n in m.graph.node if n.op_type == "Conv" and attr(n, "kernel_shape") != [1, 1]]
    assert k3 == ["/backbone/stem/0/Conv", "/backbone/stem/4/Conv"]  # involution replaced every other 3x3
    assert shape_of(inf, "logits") == [1, 1000]
    assert 15e6 < count_parameters(m) < 16e6


@pytest.mark.slow
def test_full_sardrn():
    m = MODELS["sardrn"]()
    inf = check_model(m)
    c = ops(m)
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    assert [attr(n, "dilations") for n in convs] == [[d, d] for d in (1, 2, 3, 4, 3, 2, 1)]
    assert [attr(n, "pads") for n in convs] == [[d] * 4 for d in (1, 2, 3, 4, 3, 2, 1)]
    assert c["BatchNormalization"] == 5 and c["Relu"] == 6 and c["Add"] == 2 and c["Sub"] == 1
    assert shape_of(inf, "input") == [1, 1, 256, 256] and shape_of(inf, "output") == [1, 1, 256, 256]
    assert all(shape_of(inf, n.output[0])[2:] == [256, 256] for n in convs)
