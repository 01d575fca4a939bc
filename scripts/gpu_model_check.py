"""The GPU time model against measured kernel times: for every fused kernel that
scripts/bench_gpu.py timed on a real GPU (its JSON), the time gir/fusion/perf.py models for that
kernel on the same target, side by side.

    PYTHONPATH=.:scripts python3 scripts/gpu_model_check.py [--measured results/bench_gpu.json]
        [--out results/gpu_model_check]

Why this shape: the planner ranks GIR-Graphs with that model, and before a GPU was available
its GPU constants (DRAM latency, issue rates, launch cost) came from vendor documents and
public microbenchmarks only. The models are planned again here exactly as the benchmark's
sessions planned them (same target, limit, model builder), and kernels are matched by name.
Reported: Kendall tau-b and Spearman between modelled and measured time over all kernels and
per model, measured / modelled per kernel (median and spread), and the kernels the model is
furthest from, with the term it said bound them. The measured times are what the GPU did; the
modelled ones are the model's, and the report keeps the two apart.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

import models
from gir.backends.kernels import split_kernels
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import get_target
from perf_model_rank import kendall_tau_b, spearman
from bench import markdown_table

WORST = 12


def modelled_steps(name: str, target: str, limit: int) -> dict:
    """Step name -> (modelled seconds, bound, modelled DRAM bytes, launch shapes) of the plan's
    fused kernels."""
    graph = load(models.build(name))
    p = plan(graph, get_target(target), limit=limit)
    return {s.name: (s.estimate.seconds, s.estimate.bound, s.estimate.dram_bytes,
                     [[k.num_blocks, k.block_threads] for k in split_kernels(s.graph)])
            for s in p.steps if getattr(s, "estimate", None) is not None}


def compare(measured: dict, as_planned: bool = False) -> dict:
    """`as_planned`: each kernel's modelled time as the benchmark's session planned it (bench_gpu.py
    stores it since run 6), not re-planned: the model of the tree that was measured."""
    options = measured["options"]
    rows = []
    for m in measured["models"]:
        kernels = m.get("gpu", {}).get("kernels")
        if not kernels:
            continue
        if as_planned:
            rows += [{"model": m["model"], "kernel": k["kernel"], "measured_s": k["seconds"],
                      "modelled_s": k["modelled_s"], "bound": "-", "bytes": k["bytes"]} for k in kernels]
            continue
        print(f"[{m['model']}] planning for {options['target']}", file=sys.stderr, flush=True)
        steps = modelled_steps(m["model"], options["target"], options["limit"])
        for k in kernels:
            if k["kernel"] not in steps:
                rows.append({"model": m["model"], "kernel": k["kernel"], "unmatched": True})
                continue
            seconds, bound, dram, shapes = steps[k["kernel"]]
            if "shapes" in k and k["shapes"] != shapes:  # the model now plans another structure
                rows.append({"model": m["model"], "kernel": k["kernel"], "unmatched": True, "restructured": True})
                continue
            rows.append({"model": m["model"], "kernel": k["kernel"], "measured_s": k["seconds"],
                         "modelled_s": seconds, "bound": bound, "bytes": dram})
    return {"device": measured["gpu"]["device"], "copy_bytes_per_s": measured["gpu"]["copy_bytes_per_s"],
            "options": options, "rows": rows, "as_planned": as_planned}


def agreement(rows: list[dict]) -> tuple[float, float, float]:
    x = np.array([r["modelled_s"] for r in rows])
    y = np.array([r["measured_s"] for r in rows])
    return kendall_tau_b(x, y), spearman(x, y), float(np.median(y / x))


def report(result: dict, command: str) -> str:
    rows = [r for r in result["rows"] if not r.get("unmatched")]
    unmatched = len(result["rows"]) - len(rows)
    by_model = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    table = []
    for name, rs in [("all", rows)] + list(by_model.items()):
        tau, rho, ratio = agreement(rs)
        q = np.quantile([r["measured_s"] / r["modelled_s"] for r in rs], [0.1, 0.9])
        table.append([name, str(len(rs)), f"{tau:.3f}", f"{rho:.3f}", f"{ratio:.2f}", f"{q[0]:.2f} .. {q[1]:.2f}",
                      f"{sum(r['modelled_s'] for r in rs) * 1e3:.3f}", f"{sum(r['measured_s'] for r in rs) * 1e3:.3f}"])
    worst = sorted(rows, key=lambda r: -abs(np.log(r["measured_s"] / r["modelled_s"])))[:WORST]
    worst_table = [[r["model"], f"`{r['kernel'][:56]}`", f"{r['bytes'] / 1e6:.2f}", f"{r['modelled_s'] * 1e6:.1f}",
                    r["bound"], f"{r['measured_s'] * 1e6:.1f}", f"{r['measured_s'] / r['modelled_s']:.2f}"]
                   for r in worst]
    return "\n".join([
        f"# GPU time model against measured kernel times ({result['device']})\n",
        f"Command: `{command}`. Measured: CUDA events per fused kernel from scripts/bench_gpu.py "
        f"(device-to-device copy {result['copy_bytes_per_s'] / 1e9:.0f} GB/s there); modelled: "
        f"gir/fusion/perf.py's `estimate` of the same kernel on {result['options']['target']} "
        f"(limit {result['options']['limit']}), "
        f"{'as the measured session planned it' if result.get('as_planned') else 're-planned here'}. "
        f"{unmatched} measured kernels had no "
        "step of the same name and launch shapes in the re-planned model (left out); where the "
        "measured JSON has no launch shapes (bench_gpu.py before they were stored), a kernel the model "
        "would now give another structure is compared with the structure that was measured.\n",
        markdown_table(("models", "kernels", "Kendall tau-b", "Spearman", "median measured/modelled",
                        "10%..90% measured/modelled", "modelled ms", "measured ms"), table),
        f"The {WORST} kernels the model is furthest from (either way):\n",
        markdown_table(("model", "kernel", "MB", "modelled us", "modelled bound", "measured us",
                        "measured/modelled"), worst_table)])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", default="results/bench_gpu.json", help="scripts/bench_gpu.py's JSON")
    ap.add_argument("--out", default="results/gpu_model_check", help="writes OUT.json and OUT.md")
    ap.add_argument("--as-planned", action="store_true",
                    help="the modelled times the JSON stores (the measured tree's model), not a re-plan")
    args = ap.parse_args(argv)
    with open(args.measured) as f:
        result = compare(json.load(f), args.as_planned)
    command = "PYTHONPATH=.:scripts python3 scripts/gpu_model_check.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = report(result, command.strip())
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
