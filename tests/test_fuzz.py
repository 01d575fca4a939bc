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
