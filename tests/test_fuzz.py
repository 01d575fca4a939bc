"""A bounded slice of the fuzzer (scripts/fuzz.py) with fixed seeds: random valid graphs
against onnxruntime through both engines, and malformed models through `gir explain` and
`gir run`. No internal error, timeout, signal or mismatch is allowed; the full run is a command
(see README, "Fuzzing")."""
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fuzz.py"
FAILURES = ("| internal", "| timeout", "| signal", "| mismatch")

pytest.importorskip("onnxruntime")


def _fuzz(tmp_path, *argv):
    result = subprocess.run([sys.executable, str(SCRIPT), *argv, "--timeout", "60",
                             "--failures", str(tmp_path / "failures"), "--summary", str(tmp_path / "fuzz.md")],
                            capture_output=True, text=True, timeout=300)
    summary = (tmp_path / "fuzz.md").read_text()
    return result, summary


def _counts(summary: str) -> dict[str, dict[str, int]]:
    lines = [line for line in summary.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head[1:], map(int, cells[1:])))
    return rows


def test_valid_graphs_match_onnxruntime(tmp_path):
    result, summary = _fuzz(tmp_path, "--seed", "7", "--valid", "8", "--malformed", "0")
    counts = _counts(summary)["valid"]
    assert result.returncode == 0, result.stdout[-3000:]
    assert sum(counts[o] for o in ("internal", "timeout", "signal", "mismatch")) == 0, summary
    assert counts["ok"] >= 6, summary  # the slice really compares graphs, it is not all refusals


def test_malformed_models_are_refused_cleanly(tmp_path):
    # seed 5's first eight cases take all six mutations of scripts/fuzz.py (MUTATIONS)
    result, summary = _fuzz(tmp_path, "--seed", "5", "--valid", "0", "--malformed", "8")
    counts = _counts(summary)["malformed"]
    assert result.returncode == 0, result.stdout[-3000:]
    assert sum(counts[o] for o in ("internal", "timeout", "signal", "mismatch")) == 0, summary
    assert sum(counts.values()) == 16, summary  # explain and run, per model


def test_valid_graphs_build_and_match_on_the_gpu_targets(tmp_path):
    """The same kind of slice planned for cuda:sm_90 and hip:gfx90a, built with NVRTC and
    hiprtc, and run on the interpreter and as emitted kernels on the CPU harness."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs NVRTC (scripts/setup.sh)")
    result, summary = _fuzz(tmp_path, "--seed", "11", "--valid", "4", "--malformed", "0",
                            "--gpu-targets", "cuda:sm_90", "hip:gfx90a")
    counts = _counts(summary)["valid"]
    assert result.returncode == 0, result.stdout[-3000:]
    assert sum(counts[o] for o in ("internal", "timeout", "signal", "mismatch")) == 0, summary
    # three runs a graph: the CPU engines, then each GPU target (refused-3: that compiler is missing)
    assert counts["ok"] >= 6 and counts["ok"] + counts["refused-3"] >= 9, summary


def test_an_argmax_tie_broken_differently_is_accepted_and_a_wrong_index_is_not():
    """onnxruntime may break a tie of equal values in a vector loop's tail (its last lane is
    computed by other code, one ulp apart): the fuzzer accepts an ArgMax index whose value is
    within tolerance of onnxruntime's pick, and still flags one whose value is not."""
    import numpy as np
    from onnx import TensorProto, helper
    sys.path.insert(0, str(SCRIPT.parent))
    import fuzz
    nodes = [helper.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=1), helper.make_node("Cast", ["i"], ["y"], to=1)]
    model = helper.make_model(helper.make_graph(
        nodes, "argmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])]), opset_imports=[helper.make_opsetid("", 17)],
        ir_version=10)
    feeds = {"x": np.array([[1.0, 1.0 + 1e-7, 0.0]], np.float32)}
    want = np.array([[1.0]], np.float32)  # the last of the two near-equal values
    assert fuzz._near_tie(model, feeds, "y", np.array([[0.0]], np.float32), want)
    assert not fuzz._near_tie(model, feeds, "y", np.array([[2.0]], np.float32), want)
