"""scripts/perf_model_rank.py --target cuda:sm_90 --dry-run: the GPU ranking's whole path (CUDA
emission of every candidate into one source, launch arguments, rotation sets in device memory,
the check against onnxruntime) on the CPU stand-in, which runs the CUDA source through the C
harness. So a rare GPU session only has to time. No timing assertion: dry-run times are host
times of the stand-in, and the report says so."""
import json
import sys


def test_dry_run_checks_every_candidate_and_writes_results(rank, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["perf_model_rank.py", "--target", "cuda:sm_90", "--dry-run", "--small",
                                      "--subgraphs", "softmax", "attention", "--count", "3", "--rounds", "2",
                                      "--per-round", "2", "--out-dir", str(tmp_path)])
    rank.main()
    for kind in ("softmax", "attention"):
        result = json.loads((tmp_path / f"perf_model_rank_gpu_dryrun_{kind}.json").read_text())
        assert result["mode"] == "dry-run" and result["skipped"] == [], result["skipped"]
        assert len(result["rows"]) == result["drawn"] >= 2 and result["rows"][0]["search_pick"]
        assert result["rotation_sets"] >= 2
        assert all(r["model"]["seconds"] > 0 and r["measured"]["rounds"] == 2 for r in result["rows"])
        assert "NOT GPU times" in (tmp_path / f"perf_model_rank_gpu_dryrun_{kind}.md").read_text()
    attention = json.loads((tmp_path / "perf_model_rank_gpu_dryrun_attention.json").read_text())
    assert {"mul", "sum", "max", "exp", "div"} <= {op.rsplit("/", 1)[-1] for op in attention["ops"]}  # lowered, one kernel
    assert attention["space_size"] > 1
    assert "tau-b" in (tmp_path / "perf_model_rank_gpu_dryrun_summary.md").read_text()


def test_device_check_reports_wrong_numbers(rank):
    from gir.ir import get_target

    rig = rank.GpuRig(get_target("cuda:sm_90"), dry_run=True)
    model, graph, space, chosen, options = rank.candidate_space("softmax", (1, 1, 4, 32), 2, 0, rig.target)
    fns, failed, _ = rank.build_gpu_kernels(space, options, rig)
    assert not failed
    sets = rank.DeviceSets(graph, rig.launcher, fns, 2, 0)
    x = sets.host_inputs["x"]
    e = __import__("numpy").exp(x.reshape(4, 32) - x.reshape(4, 32).max(axis=1, keepdims=True))
    want = {"y": (e / e.sum(axis=1, keepdims=True)).reshape(1, 1, 4, 32)}
    assert sets.check(chosen[0], fns, want) is None
    assert "elements wrong" in sets.check(chosen[0], fns, {"y": want["y"] + 1.0})
