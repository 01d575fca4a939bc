"""The partition's time check (gir/fusion/plan.py `_back_to_library`): on the GPU presets, which
model their library calls (`Target.extra["library_calls"]`), a matmul or conv below the ridge
point goes back to the library when its lowered GIR kernels model at more than the target's
margin (`library_margin`) x the library call plus a round trip of its output, and the decision
says so. Targets without a library model (the CPU before `gir calibrate` has timed oneDNN's
calls on it) keep the ridge rule alone; a calibrated CPU checks as the GPUs do."""
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gir.frontend import load
from gir.fusion.partition import library_call_seconds, library_seconds, op_cost
from gir.fusion.plan import LIBRARY_MARGIN, _back_to_library, library_margin, plan
from gir.ir import get_target
from gir.runtime.executor import execute


def _conv_relu(channels_in=1, channels_out=64, size=128):
    """SAR-DRN's first layer: a 3x3 conv from one channel to 64, then ReLU (4.5 FLOP/B, far
    below the H100's fp32 ridge of 20)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((channels_out, channels_in, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(channels_out).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "conv_relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels_in, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels_out, size, size])],
                              [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _gemv(k=768, n=3072):
    """GPT-2 decode's MLP matmul: one row against a weight (a GEMV, 0.5 FLOP/B)."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((k, n)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "gemv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _decision(p, name):
    (d,) = [d for d in p.partition.decisions if d.op == name]
    return d


def test_a_slow_lowered_conv_goes_back_to_the_library_on_the_gpu():
    model = _conv_relu()
    p = plan(load(model), get_target("h100"), limit=1)
    d = _decision(p, "conv")
    assert d.library and d.given_back and d.intensity < get_target("h100").ridge_point()
    assert "but its GIR kernels model at" in d.reason and "as a library call" in d.reason
    assert [s.kind for s in p.steps if hasattr(s, "kind")] == ["conv"]
    # the plan still computes the model: the library conv, then ReLU as a GIR kernel
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 1, 128, 128)).astype(np.float32)}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = execute(p, feeds).values()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_an_uncalibrated_cpu_keeps_the_ridge_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))  # no calibration there
    p = plan(load(_conv_relu(size=32)), get_target("cpu"), limit=1)
    d = _decision(p, "conv")
    assert not d.library and not d.given_back and d.library_s is None
    assert _back_to_library(p, get_target("cpu")) == {}


@pytest.mark.parametrize("target", ["h100", "mi250x"])
def test_a_gemv_near_the_copy_bandwidth_stays_in_gir(target):
    t = get_target(target)
    p = plan(load(_gemv()), t, limit=1)
    d = _decision(p, "mm")
    assert not d.library and d.library_s is not None
    gir = sum(k.estimate.seconds for k in p.kernels)
    assert gir < library_margin(t) * d.library_s
    # the partition table says what the time check found, next to the ridge rule
    ratio = gir / d.library_s
    assert f"time check: its GIR kernels model at {gir * 1e6:.1f} us against {d.library_s * 1e6:.1f} us" in d.reason
    assert f"({ratio:.2f}x): kept in GIR" in d.reason
    assert (f"within the time check's margin of {library_margin(t):g}x" in d.reason) == (ratio > 1)


def test_library_seconds_counts_the_im2col_matrix_where_the_library_needs_one(tmp_path, monkeypatch):
    """hipBLAS runs a conv as im2col + GEMM: the column matrix is written and read once more.
    This conv is bytes-bound either way, so the difference is those bytes at copy bandwidth."""
    from dataclasses import replace
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))  # an uncalibrated CPU
    g = load(_conv_relu())
    (conv,) = [op for op in g.ops if op.kind == "conv"]
    mi = get_target("mi250x")
    direct = replace(mi, extra={"library_calls": {"convs": "direct"}})
    col = 2 * 9 * 128 * 128 * 4
    difference = library_seconds(conv, g, mi) - library_seconds(conv, g, direct)
    assert difference == pytest.approx(col / (mi.dram_bandwidth * mi.timing.copy_efficiency))
    assert library_seconds(conv, g, get_target("cpu")) is None


def test_cuda_library_calls_take_the_cost_fitted_to_measured_calls(tmp_path, monkeypatch):
    """The H100's cuBLASLt and cuDNN calls take a fixed cost and a fraction of the peak fitted to
    calls timed on an H100 (results/bench_gpu_run6.md), and the time check weighs them at margin
    1; the MI250X's hipBLAS calls, never timed, keep a launch and the full peak at margin 3."""
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))  # an uncalibrated CPU
    g = load(_conv_relu(channels_in=64, size=64))  # 0.3 GFLOP over 2.2 MB: bound by FLOPs on the H100
    (conv,) = [op for op in g.ops if op.kind == "conv"]
    flops, nbytes = op_cost(conv, g)
    h100, mi = get_target("h100"), get_target("mi250x")
    peak = h100.ridge_point() * h100.dram_bandwidth
    assert library_call_seconds(conv, g, h100) == pytest.approx(12e-6 + flops / (0.35 * peak))
    peak = mi.ridge_point() * mi.dram_bandwidth
    im2col = (nbytes + 2 * 64 * 9 * 64 * 64 * 4) / (mi.dram_bandwidth * mi.timing.copy_efficiency)
    assert library_call_seconds(conv, g, mi) == pytest.approx(mi.launch_latency_s + max(flops / peak, im2col))
    assert library_margin(h100) == 1.0 and library_margin(mi) == LIBRARY_MARGIN == 3.0
    assert library_margin(get_target("cpu")) == LIBRARY_MARGIN  # no library model: never consulted


# oneDNN's calls as `gir calibrate` stored them on a 2-core Cascade Lake guest (session 34)
CALIBRATED_CALLS = {"convs": "direct", "call_s": {"conv": 11.9e-6, "matmul": 11.1e-6},
                    "flop_efficiency": {"conv": 1.10, "matmul": 1.45}, "channel_block": 16, "margin": 1.0}


def _calibrated_cpu(tmp_path, monkeypatch, library_calls):
    """The CPU target after a calibration with these library calls, stored in a cache of its own."""
    from gir.backends.cpu import calibration
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    calibration.save(calibration.Calibration(
        cpu="test", threads=2, copy_bandwidth=18e9, unit_bandwidth=10e9, launch_s=5e-6, issue_per_s=4e9,
        dependent_cycles=2.0, measured_at="test", library_calls=library_calls))
    return get_target("cpu")


def test_a_calibrated_cpu_gives_a_slow_lowered_conv_back_to_onednn(tmp_path, monkeypatch):
    """SAR-DRN's last layer, a 3x3 conv from 64 channels to one (4.4 FLOP/B, below the ridge):
    lowered, its GIR kernel took 57.7 ms on a 2-core Cascade Lake guest (modelled 13-18 ms). With
    oneDNN's calls timed by `gir calibrate` the time check gives it back, and the plan still
    computes the model; without them the ridge rule alone keeps it in GIR."""
    model = _conv_relu(channels_in=64, channels_out=1, size=96)
    cpu = _calibrated_cpu(tmp_path, monkeypatch, CALIBRATED_CALLS)
    assert cpu.extra["library_calls"] == CALIBRATED_CALLS and library_margin(cpu) == 1.0
    p = plan(load(model), cpu, limit=1)
    d = _decision(p, "conv")
    assert d.given_back and d.library and d.intensity < cpu.ridge_point()
    assert "but its GIR kernels model at" in d.reason
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 64, 96, 96)).astype(np.float32)}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = execute(p, feeds).values()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    nominal = _calibrated_cpu(tmp_path / "none", monkeypatch, None)
    assert "library_calls" not in nominal.extra
    assert not _decision(plan(load(model), nominal, limit=1), "conv").library


def test_a_dense_conv_to_few_channels_costs_whole_channel_blocks(tmp_path, monkeypatch):
    """oneDNN computes a dense conv's output channels in blocks of 16 on AVX-512: the call to one
    channel is modelled at 16x its FLOPs (it ran at 16x within 1.4x, gir calibrate's probe); to
    64 channels, and a depthwise conv, at their own."""
    from dataclasses import replace
    cpu = _calibrated_cpu(tmp_path, monkeypatch, CALIBRATED_CALLS)
    unblocked = replace(cpu, extra={"library_calls": {**CALIBRATED_CALLS, "channel_block": 1}})
    fixed = CALIBRATED_CALLS["call_s"]["conv"]
    for out, ratio in ((1, 16), (64, 1)):
        g = load(_conv_relu(channels_in=64, channels_out=out, size=64))
        (conv,) = [op for op in g.ops if op.kind == "conv"]
        flops, _ = op_cost(conv, g)
        assert library_call_seconds(conv, g, cpu) - fixed == pytest.approx(
            ratio * flops / (1.10 * cpu.peak_matrix_flops))
        assert library_call_seconds(conv, g, unblocked) - fixed == pytest.approx(
            max(flops / (1.10 * cpu.peak_matrix_flops), op_cost(conv, g)[1] / cpu.dram_bandwidth))
    from gir.fusion.partition import padded_channels
    depthwise = SimpleNamespace(kind="conv", inputs=["x", "w"], attrs={"group": 64})
    assert padded_channels(depthwise, SimpleNamespace(tensors={"w": SimpleNamespace(shape=(64, 1, 3, 3))}), 16) == 1.0


@pytest.mark.skipif(__import__("gir.runtime.onednn", fromlist=["x"]).library() is None, reason="needs oneDNN")
def test_calibration_times_onednns_calls():
    from gir.runtime import library_calls
    lines = []
    calls = library_calls.measure(18e9, lines.append, peak_flops=96e9)
    assert len(lines) == 4 and all(line.startswith("library ") for line in lines)
    assert calls["byte_efficiency"]["grouped_conv"] > 0 and 0 < calls["byte_efficiency"]["matmul"] < 2
    assert set(calls["call_s"]) == set(calls["flop_efficiency"]) == {"conv", "matmul"}
    assert all(0 < s < 1e-2 for s in calls["call_s"].values()) and all(e > 0 for e in calls["flop_efficiency"].values())
    assert calls["channel_block"] in (4, 8, 16) and calls["margin"] == 1.0


def _attention(heads=12, seq=197, dim=64):
    """One ViT-B/16 attention core: softmax(Q K^T / 8) V over inputs Q, K^T and V."""
    scale = numpy_helper.from_array(np.array(0.125, np.float32), "scale")
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
             helper.make_node("Mul", ["s", "scale"], ["z"], name="scaled"),
             helper.make_node("Softmax", ["z"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "v"], ["o"], name="context")]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, [1, heads, seq, dim]),
              helper.make_tensor_value_info("kt", f, [1, heads, dim, seq]),
              helper.make_tensor_value_info("v", f, [1, heads, seq, dim])]
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("o", f, [1, heads, seq, dim])],
                              [scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_ops_that_share_a_kernel_go_back_together():
    """ViT's two attention products fuse into one GIR kernel; judged together against their two
    library calls, both go back (the softmax stays a GIR kernel between them)."""
    p = plan(load(_attention()), get_target("h100"), limit=1)
    scores, context = _decision(p, "scores"), _decision(p, "context")
    assert scores.library and context.library
    assert "the GIR kernels it shares with 1 more lowered op model at" in scores.reason
    assert [s.kind for s in p.steps if hasattr(s, "kind")] == ["matmul", "matmul"]


def test_the_faster_plan_by_the_model_is_kept():
    """Tiny GPT-2 on H100: the kernel holding a layer's c_proj GEMV also holds the residual add
    and LayerNorm, so it models above the GEMV's library call times the margin; with the GEMV in
    the library that work stays, and the whole plan models slower: the first plan is kept."""
    import models
    from gir.fusion.plan import modelled_seconds, time_checked
    first, second, kept = time_checked(load(models.load_bundled("gpt2")), get_target("h100"), 1, None, {})
    assert second is not None and any(d.given_back for d in second.partition.decisions)
    assert modelled_seconds(second) >= modelled_seconds(first) and kept is first
    assert not any(d.given_back for d in kept.partition.decisions)


@pytest.mark.skipif(__import__("gir.runtime.onednn", fromlist=["x"]).library() is None, reason="needs oneDNN")
def test_a_bytes_bound_matmul_is_timed_with_its_weights_from_dram(monkeypatch):
    """The GEMV probe calls one primitive per weight copy, as many as twice the last-level
    cache holds, in turn: a 64 MiB cache asks for 15 copies of the 9.4 MB weight."""
    from gir.backends.cpu import target as cpu_target
    from gir.runtime import library_calls, onednn
    made = []
    real = onednn.prepare
    monkeypatch.setattr(onednn, "prepare", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    monkeypatch.setattr(cpu_target, "last_level_cache_bytes", lambda: 64 << 20)
    seconds = library_calls._cold_seconds(library_calls._matmul(*library_calls.GEMV_PROBE))
    assert len(made) == 15 and len({id(m) for m in made}) == 15 and 0 < seconds < 1


def test_a_gemv_stays_in_gir_where_the_library_streams_its_weights_slower():
    """With oneDNN's GEMV measured at a share of the copy bandwidth, a decode-step matmul whose
    GIR kernel models faster is not given back (GPT-2 decode on an AMD EPYC guest: 23 ms with
    its GEMVs in oneDNN, 14 ms in GIR, where the unmeasured share of 1 gave them all back)."""
    from gir.fusion.partition import library_call_seconds
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((768, 3072)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="gemv")], "gemv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 768])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3072])], [w])
    graph = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    base = get_target("cpu")
    calls = {"convs": "direct", "call_s": {"matmul": 3e-6}, "flop_efficiency": {"matmul": 2.0},
             "channel_block": 16, "margin": 1.0}
    slow = replace(base, extra={**base.extra, "library_calls": {**calls, "byte_efficiency": {"matmul": 0.25}}})
    fast = replace(base, extra={**base.extra, "library_calls": {**calls, "byte_efficiency": {"matmul": 1.0}}})
    op = graph.ops[0]
    assert library_call_seconds(op, graph, slow) > 3.5 * library_call_seconds(op, graph, fast)
    assert not plan(graph, slow).partition.library  # GIR's kernel models faster than a quarter of copy
