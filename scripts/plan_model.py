"""Plan full-size zoo models for GPU target presets and report, per model and target: library
ops, memory-intensive subgraphs, kernels, DRAM bytes (one kernel per op / GIR / compulsory
bound), modelled time, and load and plan time; and where the bytes above the bound go (MB per
reason, gir/fusion/excess.py). Prints the table; writes both tables as markdown, and JSON.

    PYTHONPATH=. python scripts/plan_model.py --targets a100 h100 mi100 mi250x --out results/plan
"""
import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import models
from gir.frontend import load
from gir.fusion import excess
from gir.fusion.excess import REASONS, summary
from gir.fusion.plan import plan
from gir.ir import get_target

COLUMNS = ("model", "target", "library ops", "subgraphs", "kernels", "one-kernel-per-op MB", "GIR MB",
           "bound MB", "GIR/bound", "modelled ms", "load s", "plan s")
SHORT = {excess.DEVICE_SYNC: "device sync", excess.NO_STRUCTURE: "no common structure", excess.CYCLE: "cycle",
         excess.SLOWER: "other grouping modelled slower", excess.ORDER: "grouping order",
         excess.GROUP_LIMIT: "group size limit", excess.COPY: "standalone copy", excess.REREAD: "input re-read",
         excess.BELOW: "below bound"}
assert set(SHORT) == set(REASONS), "a reason gir/fusion/excess.py gives has no column name here"


def measure(name: str, target: str, limit: int, model=None) -> dict:
    """`model`: the ModelProto of `name` when the caller has it already (else it is built)."""
    start = time.perf_counter()
    graph = load(models.build(name) if model is None else model)
    loaded = time.perf_counter() - start
    start = time.perf_counter()
    p = plan(graph, get_target(target), limit=limit)
    planned = time.perf_counter() - start
    gir = sum(s.gir_bytes for s in p.subgraphs)
    bound = sum(s.bound_bytes for s in p.subgraphs)
    return {"model": name, "target": target, "basic_ops": len(graph.ops), "library_ops": len(p.partition.library),
            "subgraphs": len(p.subgraphs), "kernels": len(p.kernels),
            "unfused_bytes": sum(s.unfused_bytes for s in p.subgraphs), "gir_bytes": gir,
            "gir_access_bytes": sum(s.gir_access_bytes for s in p.subgraphs), "bound_bytes": bound,
            "gir_over_bound": round(gir / bound, 3) if bound else None,
            "modelled_seconds": sum(k.estimate.seconds for k in p.kernels), "load_seconds": round(loaded, 2),
            "plan_seconds": round(planned, 2), "excess_bytes_by_reason": summary(e for s in p.subgraphs for e in s.excess),
            "largest_excess": [e.as_dict() for e in sorted((e for s in p.subgraphs for e in s.excess),
                                                           key=lambda e: -e.bytes)[:5]]}


def row(r: dict) -> list[str]:
    return [r["model"], r["target"], str(r["library_ops"]), str(r["subgraphs"]), str(r["kernels"]),
            f"{r['unfused_bytes'] / 1e6:.1f}", f"{r['gir_bytes'] / 1e6:.1f}", f"{r['bound_bytes'] / 1e6:.1f}",
            f"{r['gir_over_bound']:.2f}x", f"{r['modelled_seconds'] * 1e3:.3f}", f"{r['load_seconds']:.1f}",
            f"{r['plan_seconds']:.1f}"]


def excess_table(results) -> str:
    """MB above the bound per reason, per model and target."""
    used = [r for r in REASONS if any(r in res["excess_bytes_by_reason"] for res in results)]
    table = "| model | target | above bound MB | " + " | ".join(SHORT[r] for r in used) + " |\n"
    table += "|" + "---|" * (3 + len(used)) + "\n"
    for res in results:
        by = res["excess_bytes_by_reason"]
        cells = [f"{by.get(r, 0) / 1e6:.1f}" for r in used]
        table += f"| {res['model']} | {res['target']} | {(res['gir_bytes'] - res['bound_bytes']) / 1e6:.1f} | " + \
            " | ".join(cells) + " |\n"
    legend = "".join(f"- {SHORT[r]}: {r}\n" for r in used)
    return table + "\n" + legend


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", nargs="+", default=["a100", "h100", "mi100", "mi250x"])
    ap.add_argument("--limit", type=int, default=2, help="parallel structures searched per group")
    ap.add_argument("--out", help="write OUT.md and OUT.json")
    ap.add_argument("models", nargs="*", default=sorted(set(models.MODELS) - {"gpt2_b128"}))
    args = ap.parse_args()
    results = []
    print(" | ".join(COLUMNS), flush=True)
    for name in args.models:
        for target in args.targets:
            results.append(measure(name, target, args.limit))
            print(" | ".join(row(results[-1])), flush=True)
    if args.out:
        header = (f"Produced by `PYTHONPATH=. python scripts/plan_model.py --targets {' '.join(args.targets)} --out {args.out}` "
                  f"on {date.today()} ({platform.machine()}, {platform.processor() or 'cpu'}; plan time on this machine). "
                  "GIR MB counts each distinct DRAM element a kernel touches once (re-reads assumed served by L2); "
                  "the bound reads each subgraph's external inputs once (of a table only gathered from, the gathered rows) and writes its escaping outputs once.\n\n")
        table = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
        table += "".join("| " + " | ".join(row(r)) + " |\n" for r in results)
        excess = ("\n## Where the bytes above the bound go\n\nEach tensor GIR moves through DRAM beyond the bound "
                  "(written by one kernel and read back by another, or by the same one past a device sync; or an input "
                  "several kernels read), by what kept its writer and reader apart (`gir explain` lists them per tensor).\n\n")
        Path(args.out + ".md").write_text(header + table + excess + excess_table(results))
        Path(args.out + ".json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
