"""The command line: every command, and bad input ending as one line and a non-zero exit."""
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import models
from gir.cli import main

TINY = str(models.bundled_path("gpt2"))


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_targets(capsys):
    code, out, _ = run_cli(capsys, "targets")
    assert code == 0 and "cuda:sm_90" in out and "hip:gfx90a" in out and "cpu" in out


def test_explain_text_json_and_node(capsys, tmp_path):
    code, out, err = run_cli(capsys, "explain", TINY, "--target", "cuda:sm_80")
    assert code == 0 and "memory-intensive subgraphs" in out and "[1/" in err
    from test_session import _mlp_model  # JSON and --node on a model planned in a second, not GPT-2 again
    small = str(tmp_path / "mlp.onnx")
    onnx.save(_mlp_model(), small)
    code, out, _ = run_cli(capsys, "explain", small, "--json", "--quiet")
    data = json.loads(out)
    sub = data["subgraphs"][0]
    assert {"unfused_dram_bytes", "gir_dram_bytes", "bound_dram_bytes", "above_bound"} <= set(sub)
    for s in data["subgraphs"]:  # the bytes above the bound, tensor by tensor, add up
        assert sum(e["bytes"] for e in s["above_bound"]) == s["gir_dram_bytes"] - s["bound_dram_bytes"]
    node = sub["ops"][0]
    code, out, _ = run_cli(capsys, "explain", small, "--node", node, "--quiet")
    assert code == 0 and "GIR after rewriting" in out


def test_run_with_random_and_given_inputs(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "run", TINY, "--quiet", "-o", str(tmp_path / "y.npz"))
    assert code == 0 and "logits" in out and (tmp_path / "y.npz").exists()
    feeds = models.example_inputs(onnx.load(TINY), 0)
    np.savez(tmp_path / "x.npz", **feeds)
    assert run_cli(capsys, "run", TINY, "--quiet", "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"))[0] == 0
    import onnxruntime as ort
    want = ort.InferenceSession(TINY, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = np.load(tmp_path / "y.npz")
    assert list(got) == [o.name for o in onnx.load(TINY).graph.output]
    for name, ref in zip(got, want):
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_run_engines_and_a_gpu_target_without_a_gpu(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", TINY, "--engine", "interpreter", "--target", "cuda:sm_90", "-o", str(tmp_path / "i.npz"))
    assert code == 0 and "interpreter engine on H100" in err
    code, _, err = run_cli(capsys, "run", TINY, "--quiet", "-o", str(tmp_path / "n.npz"))
    for name, value in np.load(tmp_path / "i.npz").items():
        np.testing.assert_allclose(np.load(tmp_path / "n.npz")[name], value, rtol=1e-5, atol=1e-5)
    from gir.backends.errors import NoDeviceError
    from gir.backends.device_engine import open_launcher
    try:
        open_launcher("cuda")
        pytest.skip("a CUDA device is here, so the no-device error cannot be shown")
    except NoDeviceError:
        pass
    one_line_error(capsys, 3, "run", TINY, "--quiet", "--target", "cuda:sm_90", match="--engine interpreter")


@pytest.mark.parametrize("target,suffix,binary", [("cuda:sm_90", ".cu", ".cubin"), ("hip:gfx90a", ".hip", ".gfx90a.co"),
                                                  ("cpu", ".c", None)])
def test_compile_emits_and_builds_every_kernel(capsys, tmp_path, target, suffix, binary):
    code, out, _ = run_cli(capsys, "compile", TINY, "--target", target, "--quiet", "-o", str(tmp_path))
    plan = json.loads((tmp_path / "plan.json").read_text())
    launches = [s for s in plan["steps"] if s["kind"] == "launch"]
    assert code == 0 and launches and f"{len(launches)} kernel launches" in out
    for step in launches:
        source = tmp_path / step["source"]
        assert source.suffix == suffix and source.exists() and step["kernel"] in source.read_text()
        assert step["grid"][0] >= 1 and step["block"][0] >= 1 and step["params"]
        if binary:
            assert source.with_suffix(binary).exists()


def test_compile_warns_of_a_spilling_kernel_in_one_line_and_succeeds(capsys, tmp_path, monkeypatch):
    """A kernel ptxas gives local memory still runs: `gir compile` says so in one line per
    kernel, records the stack bytes in plan.json, and exits 0 (a spill failed the build before)."""
    import dataclasses
    import warnings
    from gir.backends.cuda import compiler as nvrtc
    real = nvrtc.parse_ptxas_log

    def spilling(log):
        return {k: dataclasses.replace(r, spill_store_bytes=8, stack_bytes=8) for k, r in real(log).items()}
    monkeypatch.setattr(nvrtc, "parse_ptxas_log", spilling)
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))  # built now, not read from a cache
    shown = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code, out, err = run_cli(capsys, "compile", TINY, "--target", "cuda:sm_90", "--quiet", "--jobs", "1",
                                 "-o", str(tmp_path / "out"))
    assert warnings.showwarning is shown  # the CLI's one-line form is put back
    launches = [s for s in json.loads((tmp_path / "out" / "plan.json").read_text())["steps"] if s["kind"] == "launch"]
    warned = [l for l in err.splitlines() if l.startswith("gir: warning: kernel ")]
    assert code == 0 and warned and all(l.endswith("bytes of stack): it runs, slower") for l in warned)
    assert "Traceback" not in err and all(s["spilled_stack_bytes"] == 8 for s in launches)


def one_line_error(capsys, code_expected, *argv, match):
    code, out, err = run_cli(capsys, *argv)
    assert code == code_expected
    lines = [l for l in err.splitlines() if l.startswith("gir:")]
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in err


def test_bad_inputs(capsys, tmp_path):
    one_line_error(capsys, 1, "explain", str(tmp_path / "missing.onnx"), match="no such file")
    (tmp_path / "text.onnx").write_text("not a model")
    one_line_error(capsys, 1, "explain", str(tmp_path / "text.onnx"), "--quiet", match="not a valid ONNX file")
    data = open(TINY, "rb").read()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 3])
    one_line_error(capsys, 1, "explain", str(tmp_path / "cut.onnx"), "--quiet", match="cut.onnx")
    one_line_error(capsys, 1, "explain", TINY, "--target", "cuda:sm_99", match="unknown target 'cuda:sm_99'")
    feeds = models.example_inputs(onnx.load(TINY), 0)
    np.savez(tmp_path / "wrong_name.npz", nope=np.zeros(1), **feeds)
    one_line_error(capsys, 1, "run", TINY, "--quiet", "--inputs", str(tmp_path / "wrong_name.npz"), match="unknown input 'nope'")
    name, value = next(iter(feeds.items()))
    np.savez(tmp_path / "wrong_shape.npz", **{**feeds, name: np.zeros((7, 7), value.dtype)})
    one_line_error(capsys, 1, "run", TINY, "--quiet", "--inputs", str(tmp_path / "wrong_shape.npz"), match=f"input {name!r} has shape [7, 7]")
    np.savez(tmp_path / "one_missing.npz", **dict(list(feeds.items())[1:]))
    one_line_error(capsys, 1, "run", TINY, "--quiet", "--inputs", str(tmp_path / "one_missing.npz"), match=f"missing input {name!r}")


def unsupported_model(path) -> str:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Cosh", ["x"], ["a"], name="first"), helper.make_node("Sinh", ["a"], ["y"], name="second")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, path)
    return str(path)


def test_unsupported_op_lists_every_node(capsys, tmp_path):
    code, _, err = run_cli(capsys, "explain", unsupported_model(tmp_path / "m.onnx"), "--quiet")
    assert code == 2 and "first" in err and "Cosh" in err and "second" in err and "Sinh" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["run", "compile"])
def test_bad_model_files_for_run_and_compile(capsys, tmp_path, command, monkeypatch):
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    out = ["-o", str(tmp_path / "out")]
    one_line_error(capsys, 1, command, str(tmp_path / "missing.onnx"), *out, match="no such file")
    (tmp_path / "text.onnx").write_text("not a model")
    one_line_error(capsys, 1, command, str(tmp_path / "text.onnx"), "--quiet", *out, match="not a valid ONNX file")
    data = open(TINY, "rb").read()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 3])
    one_line_error(capsys, 1, command, str(tmp_path / "cut.onnx"), "--quiet", *out, match="cut.onnx")
    one_line_error(capsys, 1, command, TINY, "--target", "cuda:sm_99", *out, match="unknown target 'cuda:sm_99'")
    one_line_error(capsys, 2, command, unsupported_model(tmp_path / "m.onnx"), "--quiet", *out, match="Cosh")


@pytest.mark.parametrize("argv,match", [(["compile", TINY, "-o", "x", "--jobs", "0"], "--jobs takes a whole number"),
                                        (["cache"], "required"), (["cache", "wipe"], "invalid choice"),
                                        (["frobnicate"], "invalid choice"), (["compile", TINY], "-o/--output")])
def test_usage_errors_are_one_line_and_exit_1(capsys, argv, match):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 1 and len(err.strip().splitlines()) == 1 and match in err and err.startswith("gir: error:")


def test_console_script_has_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gir.cli", "explain", str(tmp_path / "none.onnx")], capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
