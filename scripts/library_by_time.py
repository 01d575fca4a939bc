"""What the partition's time check (gir/fusion/plan.py `time_checked`) gives back to the library
on a GPU target, per zoo model: the first plan (the ridge rule alone) against the plan with the
proposed ops in the library, which `gir.fusion.plan.plan` keeps when it models faster, with the
modelled time of GIR's kernels and of the library calls (`Decision.library_s`, which includes a
round trip of each call's output). Modelled, no GPU.

    PYTHONPATH=. python3 scripts/library_by_time.py [--target h100] [--limit 2] [--out FILE] [MODEL ...]

Writes a markdown table (default results/library_by_time.md) and its rows as JSON beside it.
"""
import argparse
import json
import os
import platform
import time
from datetime import date

import models
from gir.frontend import load
from gir.fusion import plan as planner
from gir.ir import get_target


def _modelled(p) -> dict:
    library = [d for d in p.partition.decisions if d.library]
    return {"kernels": len(p.kernels), "gir_us": sum(k.estimate.seconds for k in p.kernels) * 1e6,
            "library_ops": len(library), "library_us": sum(d.library_s or 0.0 for d in library) * 1e6}


def measure(name: str, target, limit: int) -> dict:
    graph = load(models.build(name))
    start = time.perf_counter()
    first, second, kept = planner.time_checked(graph, target, limit, None, {})
    back = {d.op: d.reason for d in (second or first).partition.decisions if d.given_back}
    return {"model": name, "first": _modelled(first), "second": _modelled(second) if second else None,
            "kept": "second" if second is not None and kept is second else "first", "back": sorted(back),
            "reasons": {n: back[n].split(", but ", 1)[-1] for n in sorted(back)[:3]}, "plan_s": time.perf_counter() - start}


def table(rows: list[dict], target: str, limit: int) -> str:
    lines = [f"# Lowered ops given back to the library by the time model ({target})", "",
             "| model | proposed | kept | kernels | GIR kernels us (modelled) | library ops | library calls us (modelled) "
             "| GIR + library us | plan s |", "|---|---:|---|---|---|---|---|---|---:|"]
    for r in rows:
        a, b = r["first"], r["second"] or r["first"]
        lines.append(f"| {r['model']} | {len(r['back'])} | {r['kept']} | {a['kernels']} -> {b['kernels']} | "
                     f"{a['gir_us']:.0f} -> {b['gir_us']:.0f} | {a['library_ops']} -> {b['library_ops']} | "
                     f"{a['library_us']:.0f} -> {b['library_us']:.0f} | {a['gir_us'] + a['library_us']:.0f} -> "
                     f"{b['gir_us'] + b['library_us']:.0f} | {r['plan_s']:.0f} |")
    lines += ["", f"Each cell: the first plan (ridge rule alone) -> the plan with the proposed ops in the library "
              f"(`limit={limit}`); kept: the one `plan` returns, the lower modelled GIR + library time. Library calls "
              "us: `Decision.library_s` summed over the library ops, the call plus writing and reading its output "
              "once (so the epilogue's round trip is counted on the library side). Modelled by gir/fusion/perf.py and "
              "partition.library_seconds (on the CUDA presets with the cost of a call fitted to the calls an H100 ran, results/bench_gpu_run6.md); these plans were not timed. Some reasons:", ""]
    for r in rows:
        for n, why in r["reasons"].items():
            lines.append(f"- {r['model']} `{n}`: {why}")
    lines += ["", f"{platform.machine()}, {os.cpu_count()} cores (shared), {date.today().isoformat()}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(models.MODELS))
    ap.add_argument("--target", default="h100")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--out", default="results/library_by_time.md")
    args = ap.parse_args()
    target = get_target(args.target)
    rows = []
    for name in args.models:
        rows.append(measure(name, target, args.limit))
        r = rows[-1]
        b = r["second"] or r["first"]
        print(f"{name}: {len(r['back'])} proposed, {r['kept']} plan kept; GIR {r['first']['gir_us']:.0f} -> "
              f"{b['gir_us']:.0f} us, library {r['first']['library_us']:.0f} -> {b['library_us']:.0f} us "
              f"({r['plan_s']:.0f} s)", flush=True)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(rows, f, indent=1)
    text = table(rows, target.name, args.limit)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
