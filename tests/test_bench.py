"""scripts/bench.py on two tiny models: every column is in the JSON and the markdown, GIR
matches onnxruntime on the whole models and on their memory-intensive regions alone; and
`--gpu` where there is no GPU stack is one line and a non-zero exit."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_KEYS = {"model", "onnx_nodes", "basic_ops", "library_ops", "subgraphs", "kernels", "unfused_bytes", "gir_bytes",
              "bound_bytes", "gir_over_bound", "compile_cold_s", "compile_warm_s", "gir_ms", "ort_ms", "gir_over_ort",
              "max_rel_err", "matches", "regions"}
REGION_KEYS = {"regions", "distinct", "skipped", "gir_ms", "ort_ms", "gir_over_ort", "max_rel_err", "matches",
               "by_structure"}


def bench(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join("scripts", "bench.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)


def test_bench_tiny_reports_every_column_and_gir_matches_onnxruntime(tmp_path):
    out = tmp_path / "bench"
    proc = bench("--tiny", "--models", "sardrn", "--runs", "1", "--out", str(out))  # one model: 22 s for two
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.with_suffix(".json").read_text())
    assert {"command", "date", "machine", "options", "models"} <= data.keys()
    assert [r["model"] for r in data["models"]] == ["sardrn"]
    for row in data["models"]:
        assert MODEL_KEYS <= row.keys(), row
        assert row["matches"] and row["compile_warm_hit"]
        regions = row["regions"]
        assert REGION_KEYS <= regions.keys()
        assert regions["matches"] and regions["distinct"] >= 1 and not regions["skipped"]
    markdown = out.with_suffix(".md").read_text()
    for heading in ("GIR/bound", "compile cold s", "GIR/ORT", "max rel err", "Memory-intensive regions alone"):
        assert heading in markdown
    assert "| sardrn |" in proc.stdout  # the table is printed as it goes


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed: a GPU may be here")
def test_gpu_mode_without_a_gpu_is_one_line_and_fails(tmp_path):
    proc = bench("--gpu", "--tiny", "--models", "sardrn", "--out", str(tmp_path / "bench"))
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "bench.json").exists()


def test_bench_cpu_gives_the_earlier_tree_this_machines_calibration(tmp_path, monkeypatch):
    """scripts/bench_cpu.py --before: the earlier checkout's own cache gets the CPU calibration,
    so both trees plan with the same constants (without it the earlier one used the nominal
    ridge point and planned other convs into the library)."""
    spec = importlib.util.spec_from_file_location("bench_cpu", os.path.join(ROOT, "scripts", "bench_cpu.py"))
    bench_cpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_cpu)
    mine = tmp_path / "cache"
    (mine / "calibration").mkdir(parents=True)
    (mine / "calibration" / "cpu.json").write_text("{}")
    monkeypatch.setenv("GIR_CACHE_DIR", str(mine))
    before = tmp_path / "before"
    before.mkdir()
    cache = bench_cpu._before_cache(str(before))
    assert cache == str(before / ".bench-cache")
    assert (before / ".bench-cache" / "calibration" / "cpu.json").read_text() == "{}"
    assert bench_cpu._before_cache(str(before)) == cache  # a second call keeps what is there
