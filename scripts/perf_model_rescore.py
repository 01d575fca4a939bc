"""Score the time model of this tree on measurements scripts/perf_model_rank.py stored, without
timing again: a model change is compared with the one before on the same clock readings.

    PYTHONPATH=. python3 scripts/perf_model_rescore.py results/perf_model_rank_intel_vm/*.json

Rebuilds each subgraph's candidates from the stored seed and count (`candidate_space`: the
same draws while the search's candidate generator is unchanged, which the script checks by the
candidates' descriptions), estimates them with the current model and target, and prints per
subgraph Kendall tau-b against the stored medians, the stored tau-b, and where the model's
pick lands among the measured.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from perf_model_rank import candidate_space, kendall_tau_b, model_estimate  # noqa: E402

from gir.ir import get_target  # noqa: E402


def rescore(report: dict) -> dict:
    target = get_target("cpu")
    kind, shape = report["subgraph"], tuple(report["shape"])
    _, _, space, chosen, _ = candidate_space(kind, shape, report["drawn"], report["seed"], target)
    by_id = dict(enumerate(chosen))
    modelled, measured = [], []
    for row in report["rows"]:
        seq = by_id[row["id"]]
        described = " | ".join(space.describe(o) for o in seq)
        if described != row["candidate"]:
            raise SystemExit(f"{kind}: candidate {row['id']} is drawn differently now ({described!r} against "
                             f"{row['candidate']!r}): measure again with scripts/perf_model_rank.py")
        modelled.append(model_estimate(space, seq)["seconds"])
        measured.append(row["measured"]["median_s"])
    pick = int(np.argmin(modelled))
    return {"subgraph": kind, "tau_b": kendall_tau_b(modelled, measured),
            "stored_tau_b": report["agreement"]["kendall_tau_b"],
            "noise_floor": report["agreement"]["tau_measurement_halves"],
            "pick_slowdown": measured[pick] / min(measured), "stored_pick_slowdown": report["agreement"]["model_pick_slowdown"]}


def main() -> int:
    print("| subgraph | tau-b, this model | tau-b, stored | noise floor | pick / fastest, this model | stored |")
    print("|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        r = rescore(json.loads(Path(path).read_text()))
        print(f"| {r['subgraph']} | {r['tau_b']:.3f} | {r['stored_tau_b']:.3f} | {r['noise_floor']:.3f} | "
              f"{r['pick_slowdown']:.2f}x | {r['stored_pick_slowdown']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
