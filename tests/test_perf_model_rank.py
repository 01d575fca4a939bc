"""scripts/perf_model_rank.py on a small LayerNorm: every candidate it times computes the right
numbers, and the rank statistics are numbers. No threshold on tau and no timing assertion: on a
shared 2-core machine the measured order is noise-prone (the script reports its noise floor)."""
import math

import pytest


def test_tau_b_counts_ties_as_neither(rank):
    assert rank.kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert rank.kendall_tau_b([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert list(rank.ranks([3.0, 1.0, 3.0])) == [2.5, 1.0, 2.5]


def test_small_layernorm_candidates_are_correct_and_ranked(rank):
    result = rank.run("layernorm", shape=(1, 8, 64), count=8, rounds=2, per_round=3)
    assert result["skipped"] == []
    assert len(result["rows"]) == 8
    assert result["rows"][0]["search_pick"]
    assert any("not rewritten" in r["candidate"] for r in result["rows"])
    a = result["agreement"]
    for key in ("kendall_tau_b", "spearman"):
        assert -1.0 <= a[key] <= 1.0
    assert all(r["model"]["seconds"] > 0 and r["measured"]["median_s"] > 0 for r in result["rows"])
    assert "Kendall tau-b" in rank.note(result, "pytest")


def test_a_stored_run_rescores_with_its_own_calibration(rank):
    """perf_model_fit.py takes the timing figures the run stored, not the machine's later ones:
    re-scored as stored it reproduces the run's tau-b; with a figure changed, the model moves."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "perf_model_fit.py"
    spec = importlib.util.spec_from_file_location("perf_model_fit", path)
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)

    result = json.loads(json.dumps(rank.run("layernorm", shape=(1, 8, 64), count=6, rounds=2, per_round=1), default=str))
    assert fit.stored_target(result).timing == rank.get_target("cpu").timing
    again = fit.rescore(result)
    assert again["calibration"] == "" and again["tau"] == pytest.approx(result["agreement"]["kendall_tau_b"])
    # each option's kernel judged in the candidates it was timed in (after their earlier kernels)
    assert again["options"] and all(len(o["in_context"]) == len(o["measured"]) > 0 for o in again["options"].values())
    slower = json.loads(json.dumps(result))
    slower["target"]["timing"]["unit_bandwidth"] /= 4
    assert fit.stored_target(slower).timing.unit_bandwidth == result["target"]["timing"]["unit_bandwidth"] / 4
    assert fit.rescore(slower)["modelled"] != again["modelled"]
    del slower["target"]["timing"]
    assert fit.rescore(slower)["calibration"].startswith(" (stored no calibration")
