"""The CPU partition's time check, off and on, per zoo model, in one process: the plan of the
ridge rule alone against the plan `gir.Session(target="cpu")` makes once `gir calibrate` has
timed oneDNN's calls on this machine (gir/runtime/library_calls.py), which gives lowered
convs and matmuls back to oneDNN where their GIR kernels model slower. Whole runs of both
sessions and of onnxruntime alternate; medians.

    PYTHONPATH=. python3 scripts/cpu_time_check_ab.py [--runs 9] [--out results/cpu_time_check_ab] [MODEL ...]

Needs a calibration with library calls (`gir calibrate` with oneDNN installed). Writes a
markdown table and its rows as JSON. On a shared VM read the ratios, not the times.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import onnxruntime as ort

import models
from gir.fusion import plan as planner
from gir.ir import get_target
from gir.runtime import Session

ZOO = ["sardrn", "efficientnet_b0", "shufflenet_v2", "rednet50", "gpt2", "bert", "vit"]


def _ridge_only(model) -> Session:
    """The session as planned before the CPU had a library model: no op goes back."""
    kept = planner.library_margin
    planner.library_margin = lambda target: float("inf")
    try:
        return Session(model, target="cpu", plan_cache=None)
    finally:
        planner.library_margin = kept


def measure(name: str, runs: int) -> dict:
    model = models.build(name)
    feeds = models.example_inputs(model, 0)
    sessions = {"ridge rule": _ridge_only(model), "time check": Session(model, target="cpu", plan_cache=None)}
    back = [d.op for d in sessions["time check"].plan.partition.decisions if d.given_back]
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in reference.get_outputs()]
    want = reference.run(outputs, feeds)
    run = {tag: (lambda s=s: s.run(outputs, feeds)) for tag, s in sessions.items()}
    run["onnxruntime"] = lambda: reference.run(outputs, feeds)
    errors = {tag: max(float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) or 1.0)) for g, w in zip(fn(), want))
              for tag, fn in run.items() if tag != "onnxruntime"}
    times = {tag: [] for tag in run}
    for _ in range(runs):
        for tag, fn in run.items():
            start = time.perf_counter()
            fn()
            times[tag].append(time.perf_counter() - start)
    ms = {tag: 1e3 * float(np.median(t)) for tag, t in times.items()}
    return {"model": name, "given_back": back, "ms": ms, "rel_err": errors}


def table(rows: list[dict]) -> str:
    lines = ["| model | ops given back | ridge rule ms | time check ms | ratio | onnxruntime ms | max rel err (check) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = r["ms"]
        lines.append(f"| {r['model']} | {len(r['given_back'])} | {ms['ridge rule']:.2f} | {ms['time check']:.2f} | "
                     f"{ms['time check'] / ms['ridge rule']:.2f} | {ms['onnxruntime']:.2f} | {r['rel_err']['time check']:.1e} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=ZOO)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out", default="results/cpu_time_check_ab")
    args = ap.parse_args()
    if "library_calls" not in get_target("cpu").extra:
        sys.exit("this CPU has no library-call figures: run `gir calibrate` (with oneDNN installed) first")
    rows = []
    for name in args.models:
        rows.append(measure(name, args.runs))
        print(table(rows).splitlines()[-1], flush=True)
    calls = get_target("cpu").extra["library_calls"]
    text = (f"# The CPU time check off and on ({date.today()}, {platform.node()}, "
            f"{os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})\n\n"
            f"`PYTHONPATH=. python3 scripts/cpu_time_check_ab.py --runs {args.runs}`; medians of whole runs, "
            f"the three alternating. Library calls as calibrated: `{json.dumps(calls)}`\n\n{table(rows)}\n")
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps({"library_calls": calls, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
