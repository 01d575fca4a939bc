"""Re-score stored `perf_model_rank.py` measurements with the time model as it is now: Kendall
tau-b and the pick per subgraph, without timing anything again. What a change to
gir/fusion/perf.py or the target's constants does to the ranking, in seconds instead of a
quiet machine's minutes; the measured times stay those of the run that wrote the JSON (same
candidates: the generator is seeded), so a change to the emitted kernels needs a new
measurement.

    python scripts/perf_model_fit.py results/perf_model_rank.json results/perf_model_rank_*.json [--options]

--options also lists, per distinct kernel sequence option (a group of ops on one structure),
its median measured time over the candidates that contain it against its modelled time in the
same candidates (after the kernels before it, as it was measured) and alone: where the model
is off, term by term.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_model_rank as rank  # noqa: E402  (the same space, candidates and estimate)

from gir.frontend import load  # noqa: E402
from gir.ir import get_target  # noqa: E402
from gir.ir.target import DRAM, Timing  # noqa: E402


def stored_target(result: dict):
    """The target the run ranked on: the local CPU with the figures the run stored (its
    calibration: runs before 2026-11-27 stored none and take this machine's), or the GPU
    preset it names (`--target cuda:sm_90` runs store the preset's name, H100)."""
    facts = result.get("target") or {}
    name = facts.get("name", "CPU")
    if name != "CPU":
        return get_target(name.lower())
    base = get_target("cpu")
    if "timing" not in facts:
        return base
    timing = dict(facts["timing"], op_cost=tuple(tuple(pair) for pair in facts["timing"]["op_cost"]))
    memory = tuple(replace(m, bandwidth_bytes_per_s=facts["dram_bandwidth_GBps"] * 1e9) if m.name == DRAM else m
                   for m in base.memory)
    return replace(base, timing=Timing(**timing), memory=memory, processors=facts["processors"],
                   launch_latency_s=facts["launch_latency_us"] * 1e-6)


def calibration_note(result: dict) -> str:
    facts = result.get("target") or {}
    return "" if facts.get("name", "CPU") != "CPU" or "timing" in facts else " (stored no calibration: this machine's)"


def rescore(result: dict) -> dict:
    """The stored rows with `model` recomputed; rows whose candidate the generator no longer
    draws are dropped (counted in `missing`). GPU runs (results/perf_model_rank_gpu_*.json)
    re-score on their GPU preset."""
    kind, shape = result["subgraph"], tuple(result["shape"])
    target = stored_target(result)
    graph = load(rank.subgraph_model(kind, shape))
    space = rank.Space(graph, target) if kind in rank.CHAINS else rank.plan_space(graph, target)
    by_desc = {" | ".join(space.describe(o) for o in seq): seq
               for seq in rank.select(space, result["drawn"], result.get("seed", 0))}
    rows, missing = [], 0
    options = defaultdict(lambda: {"measured": [], "in_context": [], "model": None})
    for row in result["rows"]:
        seq = by_desc.get(row["candidate"])
        if seq is None:
            missing += 1
            continue
        ests = rank.sequence_estimates(space, seq)
        rows.append(row | {"model": rank.summed(ests)})
        for o, stored, e in zip(seq, row.get("options", []), ests):
            if "median_s" not in stored:  # GPU runs time whole candidates only
                continue
            entry = options[space.describe(o)]
            entry["measured"].append(stored["median_s"])
            entry["in_context"].append(e)  # as measured: after the kernels before it in its candidate
            if entry["model"] is None:
                entry["model"] = rank.option_estimate(space, o)
    modelled = [r["model"]["seconds"] for r in rows]
    measured = [r["measured"]["median_s"] for r in rows]
    pick = int(np.argmin(modelled))
    return {"subgraph": kind, "rows": len(rows), "missing": missing,
            "tau": rank.kendall_tau_b(modelled, measured), "stored_tau": result["agreement"]["kendall_tau_b"],
            "noise": result["agreement"]["tau_measurement_halves"],
            "pick_slowdown": measured[pick] / min(measured), "options": options,
            "calibration": calibration_note(result), "modelled": modelled}


def missing_note(fit: dict) -> str:
    return f" ({fit['missing']} no longer drawn)" if fit["missing"] else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="JSON files written by perf_model_rank.py --out")
    ap.add_argument("--options", action="store_true", help="per option: measured against modelled, by term")
    args = ap.parse_args()
    print("| subgraph | candidates | tau-b stored | tau-b now | noise floor | pick / fastest |")
    print("|---|---|---|---|---|---|")
    fits = []
    for path in args.results:
        with open(path) as f:
            fit = rescore(json.load(f))
        fits.append(fit)
        print(f"| {fit['subgraph']}{fit['calibration']} | {fit['rows']}{missing_note(fit)} "
              f"| {fit['stored_tau']:.3f} | {fit['tau']:.3f} | {fit['noise']:.3f} | {fit['pick_slowdown']:.2f}x |")
    if args.options:
        for fit in fits:
            print(f"\n{fit['subgraph']}: measured us and modelled us in the same candidates (medians; modelled terms "
                  f"dram, latency, compute, launch), modelled alone, option")
            for name, o in sorted(fit["options"].items(), key=lambda kv: np.median(kv[1]["measured"])):
                m = np.median(o["measured"]) * 1e6
                ranked = sorted(o["in_context"], key=lambda e: e.seconds)
                e = ranked[len(ranked) // 2]  # the median context's estimate, with its terms
                p = {k: v * 1e6 for k, v in e.parts.items()}
                print(f"{m:9.1f} {e.seconds * 1e6:9.1f} ({p['dram']:.1f}, {p['latency']:.1f}, {p['compute']:.1f}, "
                      f"{p['launch']:.1f}) {o['model'].seconds * 1e6:9.1f} {name}")


if __name__ == "__main__":
    main()
