"""Symbolic dims as exporters write them (batch, seq): bound by input_shapes (gir.Session,
gir.backend) or --shape (explain/run/compile), by input name or by dim name; an unbound model
is one line naming every unbound dim and how to bind it; the compile cache keys the bound shapes."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gir.backend import GirBackend
from gir.cli import main
from gir.frontend import FrontendError
from gir.runtime import Session


def symbolic_model(path=None):
    """x[batch, seq, 8] -> Softmax(x + b) over the last axis, Relu: what an exporter leaves symbolic."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Softmax", ["a"], ["s"], axis=-1),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "sym", [x], [y], [numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    if path is not None:
        onnx.save(model, path)
        return str(path)
    return model


def reference(x):
    a = x + np.linspace(-1, 1, 8, dtype=np.float32)
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("shapes", [{"x": (2, 5, 8)}, {"batch": 2, "seq": 5}])
def test_session_binds_by_input_or_by_dim_name(shapes):
    session = Session(symbolic_model(), target="cpu", input_shapes=shapes)
    assert session.get_inputs()[0].shape == [2, 5, 8]
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], reference(x), rtol=1e-5, atol=1e-6)


def test_session_unbound_is_one_line_naming_each_dim():
    with pytest.raises(FrontendError) as err:
        Session(symbolic_model(), target="cpu")
    msg = str(err.value)
    assert "\n" not in msg and "2 unbound symbolic dims" in msg
    assert "input 'x' axis 0 dim_param 'batch'" in msg and "input 'x' axis 1 dim_param 'seq'" in msg
    assert "gir.Session(model, input_shapes={'x': (1, 1, 8)})" in msg and "--shape x=1x1x8" in msg


def test_backend_prepare_binds_shapes():
    x = np.ones((3, 4, 8), np.float32)
    (y,) = GirBackend.prepare(symbolic_model(), input_shapes={"batch": 3, "seq": 4}).run([x])
    np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-6)


def test_cli_unbound_exits_1_with_one_line(capsys, tmp_path):
    model = symbolic_model(tmp_path / "sym.onnx")
    for command in (["explain", model], ["run", model], ["compile", model, "--target", "cpu", "-o", str(tmp_path / "o")]):
        assert main([*command, "--quiet"]) == 1
        err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("gir:")]
        assert len(err) == 1 and "dim_param 'batch'" in err[0] and "--shape x=1x1x8" in err[0], err


def test_cli_shape_on_explain_and_run(capsys, tmp_path):
    model = symbolic_model(tmp_path / "sym.onnx")
    assert main(["explain", model, "--target", "cpu", "--quiet", "--shape", "x=2x3x8"]) == 0
    assert "memory-intensive subgraphs" in capsys.readouterr().out
    out = tmp_path / "y.npz"
    assert main(["run", model, "--quiet", "--target", "cpu", "--shape", "batch=2", "--shape", "seq=3", "-o", str(out)]) == 0
    capsys.readouterr()
    with np.load(out) as got:
        assert got["y"].shape == (2, 3, 8)


@pytest.mark.parametrize("bad", ["x", "x=", "x=2xx8", "=3", "x=2x-1"])
def test_cli_bad_shape_is_a_usage_error(capsys, tmp_path, bad):
    with pytest.raises(SystemExit) as exit:
        main(["explain", "m.onnx", "--shape", bad])
    err = capsys.readouterr().err
    assert exit.value.code == 1 and "is not NAME=DIMS" in err and len(err.strip().splitlines()) == 1


def test_compile_cache_keys_the_bound_shapes(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    model = symbolic_model(tmp_path / "sym.onnx")

    def compile_with(out, *shape):
        assert main(["compile", model, "--target", "cpu", "-o", str(tmp_path / out), "--verbose", *shape]) == 0
        return capsys.readouterr().err
    assert "model cache: miss" in compile_with("a", "--shape", "x=2x3x8")
    assert "model cache: miss" in compile_with("b", "--shape", "x=4x3x8")  # same file, other shapes: rebuilt
    assert "model cache: hit" in compile_with("c", "--shape", "x=2x3x8")
    assert (tmp_path / "a" / "plan.json").read_bytes() == (tmp_path / "c" / "plan.json").read_bytes()
    assert (tmp_path / "a" / "plan.json").read_bytes() != (tmp_path / "b" / "plan.json").read_bytes()
