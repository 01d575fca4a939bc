"""Issue 22 item 8 and the small things: the command line and its environment end in a
documented exit code with one line, never exit 4, and do what the README says."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gir.cli import main
from gir.runtime import Session
from gir.runtime.session import SessionError


def relu_model(path, shape=(2, 3), output="y") -> str:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info(output, TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], [output], name="r")], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return str(path)


def run_cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as stop:  # argparse usage errors and --version
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys, code_expected, *argv, match):
    code, out, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("gir:")]
    assert code == code_expected, err
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in err, err


def test_limit_and_repeat_must_be_positive(capsys, tmp_path):
    model = relu_model(tmp_path / "m.onnx")
    one_line_error(capsys, 1, "run", model, "--limit", "0", match="--limit takes a whole number")
    one_line_error(capsys, 1, "explain", model, "--limit", "-3", match="--limit takes a whole number")
    one_line_error(capsys, 1, "run", model, "--repeat", "0", match="--repeat takes a whole number")


def test_inputs_that_are_not_an_npz(capsys, tmp_path):
    model = relu_model(tmp_path / "m.onnx")
    (tmp_path / "text.npz").write_text("hello")
    one_line_error(capsys, 1, "run", model, "--quiet", "--inputs", str(tmp_path / "text.npz"), match="not a readable .npz")
    np.save(tmp_path / "plain.npy", np.zeros((2, 3), np.float32))
    one_line_error(capsys, 1, "run", model, "--quiet", "--inputs", str(tmp_path / "plain.npy"), match="not a readable .npz")
    one_line_error(capsys, 1, "run", model, "--quiet", "--inputs", str(tmp_path / "none.npz"), match="cannot read inputs")


def test_output_file_is_exactly_the_named_path_or_refused(capsys, tmp_path):
    model = relu_model(tmp_path / "m.onnx")
    code, out, _ = run_cli(capsys, "run", model, "--quiet", "-o", str(tmp_path / "out.txt"))
    assert code == 0 and (tmp_path / "out.txt").exists() and not (tmp_path / "out.txt.npz").exists()
    assert np.load(tmp_path / "out.txt")["y"].shape == (2, 3)
    one_line_error(capsys, 1, "run", model, "--quiet", "-o", str(tmp_path / "no" / "such" / "y.npz"), match="cannot write")
    one_line_error(capsys, 1, "run", model, "--quiet", "-o", str(tmp_path), match="is a folder")
    one_line_error(capsys, 1, "run", model, "--quiet", "-o", "", match="-o needs a file name")


def test_output_name_with_nul_is_refused_for_npz(capsys, tmp_path):
    model = relu_model(tmp_path / "m.onnx", output="y\0z")
    one_line_error(capsys, 1, "run", model, "--quiet", "-o", str(tmp_path / "y.npz"), match="NUL byte")
    code, out, _ = run_cli(capsys, "run", model, "--quiet")  # without -o it runs
    assert code == 0 and "float32[2, 3]" in out


def test_compile_refuses_an_empty_output_folder(capsys, tmp_path):
    one_line_error(capsys, 1, "compile", relu_model(tmp_path / "m.onnx"), "--target", "cpu", "-o", "", match="-o needs a folder")


def test_unusable_cache_costs_time_only(capsys, tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "a_file"))
    code, out, err = run_cli(capsys, "run", relu_model(tmp_path / "m.onnx"), "--quiet")
    assert code == 0 and "float32[2, 3]" in out
    assert sum("warning: compile cache" in line for line in err.splitlines()) <= 1


def test_run_opencl_goes_through_its_native_engine(tmp_path):
    """In a process of its own: PoCL's LLVM and hiprtc abort when loaded into one process."""
    pytest.importorskip("pyopencl")
    result = subprocess.run([sys.executable, "-m", "gir.cli", "run", relu_model(tmp_path / "m.onnx"), "--target", "opencl"],
                            capture_output=True, text=True)
    if result.returncode == 3:
        pytest.skip(result.stderr)
    assert result.returncode == 0 and "native engine on OpenCL" in result.stderr and "float32[2, 3]" in result.stdout, \
        result.stderr


def test_repeat_prints_latency(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "run", relu_model(tmp_path / "m.onnx"), "--quiet", "--repeat", "3")
    assert code == 0 and "latency over 3 runs: median" in out and "min" in out


def test_zero_size_output_runs(capsys, tmp_path):
    for engine in ("native", "interpreter"):
        code, out, _ = run_cli(capsys, "run", relu_model(tmp_path / "m.onnx", (0, 3)), "--quiet", "--engine", engine,
                               "-o", str(tmp_path / "y.npz"))
        assert code == 0 and "float32[0, 3] (empty)" in out
        assert np.load(tmp_path / "y.npz")["y"].shape == (0, 3)


def test_version_help_and_targets(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.startswith("gir ")
    code, out, _ = run_cli(capsys)
    assert code == 0 and "usage: gir" in out and "compile" in out
    code, out, _ = run_cli(capsys, "targets")
    assert code == 0 and any(line.startswith("opencl") for line in out.splitlines())


def test_gir_traceback_only_for_1():
    """An internal error: exit 4 and one line; GIR_TRACEBACK=1 adds the trace, same exit code."""
    script = ("import sys, gir.cli\n"
              "make = gir.cli.parser\n"
              "def broken():  # `gir targets` failing, a stand-in for a bug in GIR\n"
              "    ap = make()\n"
              "    ap._subparsers._group_actions[0].choices['targets'].set_defaults(fn=lambda args: 1 / 0)\n"
              "    return ap\n"
              "gir.cli.parser = broken\n"
              "sys.exit(gir.cli.main(['targets']))\n")
    for value, trace in (("0", False), ("", False), ("yes", False), ("1", True)):
        env = {**os.environ, "GIR_TRACEBACK": value}
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
        assert result.returncode == 4, (value, result.stderr)
        assert ("Traceback" in result.stderr) == trace and "internal error: ZeroDivisionError" in result.stderr


def test_session_run_with_a_list_names_the_model(tmp_path):
    session = Session(relu_model(tmp_path / "m.onnx"), target="cpu", engine="interpreter")
    with pytest.raises(SessionError, match="m: feeds must be a dict"):
        session.run(None, [np.zeros((2, 3), np.float32)])
    with pytest.raises(SessionError, match="output_names must be a list"):
        session.run("y", {"x": np.zeros((2, 3), np.float32)})


def test_session_limit_must_be_positive(tmp_path):
    with pytest.raises(SessionError, match="m: limit .* must be a whole number >= 1, not 0"):
        Session(relu_model(tmp_path / "m.onnx"), target="cpu", limit=0)


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E5M2, TensorProto.UINT16, TensorProto.FLOAT8E4M3FN])
def test_an_element_type_gir_lacks_is_an_unsupported_model(capsys, tmp_path, to):
    """A valid model that casts to float8 (or uint16) is unsupported (exit 2), not bad input."""
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=to, name="cast")], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", to, [3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), tmp_path / "m.onnx")
    code = main(["explain", str(tmp_path / "m.onnx"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"tensor 'y' (output of node 'cast') has element type {TensorProto.DataType.Name(to)}" in err
