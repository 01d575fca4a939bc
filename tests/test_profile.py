"""`gir run --profile` and gir/backends/cpu/profile.py: every step of a native CPU session timed alone,
with its DRAM bytes and GB/s next to the machine's copy bandwidth."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
from gir.cli import main
from gir.backends.cpu import profile as prof


def _model():
    """LayerNorm (a fused GIR kernel) then a MatMul (a library op when the planner sends it there)."""
    w = numpy_helper.from_array(np.ones((256, 256), np.float32) / 256, "w")
    s = numpy_helper.from_array(np.ones(256, np.float32), "s")
    b = numpy_helper.from_array(np.zeros(256, np.float32), "b")
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 256])], [w, s, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_every_step_is_timed_with_its_bytes():
    session = gir.Session(_model(), target="cpu")
    x = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32)
    rows = prof.profile(session, {"x": x}, repeat=3)
    assert [r.step for r in rows] == list(range(len(session.plan.steps)))
    for r in rows:
        step = session.plan.steps[r.step]
        assert r.seconds > 0 and r.gbps > 0
        if r.kind == "kernel":
            assert r.dram_bytes == step.estimate.dram_bytes
    (y,) = session.run(None, {"x": x})  # profiling leaves the session usable and right
    n = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, n @ (np.ones((256, 256), np.float32) / 256), rtol=1e-4, atol=1e-4)
    text = prof.table(rows, 10e9)
    assert text.count("\n") == len(rows) + 3 and "copy bandwidth here" in text and "median" in text


def test_each_kernel_step_says_how_the_emitter_runs_it():
    """The form column: a depthwise conv over 32x14x14 runs lanes on channels (its 13 border
    positions too few to stage it padded), a 5x5 max pool over 32x14x14 stages it padded, the
    LayerNorm model's kernels one of the forms, the library op none."""
    from test_cpu_across_units import window_model
    conv = window_model("Conv", (1, 32, 14, 14), (3, 3), group=32, pads=[1, 1, 1, 1], strides=[2, 2])
    x = np.random.default_rng(0).standard_normal((1, 32, 14, 14)).astype(np.float32)
    conv_rows = prof.profile(gir.Session(conv, target="cpu"), {"x": x}, repeat=2)
    assert [r.form for r in conv_rows if r.kind == "kernel"] == ["channels x16"]
    assert "channels x16" in prof.table(conv_rows, 10e9)
    wide = window_model("MaxPool", (1, 32, 14, 14), (5, 5), pads=[2, 2, 2, 2])
    wide_rows = prof.profile(gir.Session(wide, target="cpu"), {"x": x}, repeat=2)
    assert [r.form for r in wide_rows if r.kind == "kernel"] == ["channels x16, padded"]
    rows = prof.profile(gir.Session(_model(), target="cpu"), {"x": np.ones((512, 256), np.float32)}, repeat=2)
    forms = {"per unit", "row", "row, split", "plane"}
    assert all(set(r.form.split(" + ")) <= forms for r in rows if r.kind == "kernel")
    assert all(r.form == "" for r in rows if r.kind != "kernel")


def test_copy_bandwidth_is_measured():
    assert prof.copy_bandwidth(repeat=1) > 1e8  # bytes per second; anything real is far above 0.1 GB/s


def test_cli_profile(capsys, tmp_path):
    onnx.save(_model(), tmp_path / "m.onnx")
    assert main(["run", str(tmp_path / "m.onnx"), "--quiet", "--profile", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "% copy" in out and "copy bandwidth here" in out and "kernel" in out


@pytest.mark.parametrize("extra", [["--engine", "interpreter"], ["--target", "h100"]])
def test_cli_profile_needs_the_native_cpu_engine(capsys, tmp_path, extra):
    onnx.save(_model(), tmp_path / "m.onnx")
    assert main(["run", str(tmp_path / "m.onnx"), "--quiet", "--profile", *extra]) == 1
    assert "--profile times the kernels of a native engine that can time its steps alone" in capsys.readouterr().err
