"""The CPU emitter's across-units form against the per-unit form (issue 23): each zoo model's
native CPU session built twice in one process, once with the form switched off (every kernel one
unit per OpenMP iteration) and once as shipped, every GIR kernel of both timed alone
(gir.runtime.profile), and the kernels the form changes listed with their share of this
machine's copy bandwidth. Switching the form off also switches it off in the time model, so
the two plans may group ops differently; totals compare the whole of each.

    OMP_NUM_THREADS=1 PYTHONPATH=. python3 scripts/across_units_ab.py [--models efficientnet_b0 rednet50] [--repeat 5]

Writes results/across_units.md and .json."""
from __future__ import annotations

import argparse
import json
import os
import platform
from datetime import date
from pathlib import Path

import numpy as np

import gir.ir.across_units as rule
import models
from gir.runtime import Session
from gir.runtime.profile import copy_bandwidth, profile

CNNS = ["efficientnet_b0", "rednet50", "sardrn", "shufflenet_v2"]


def sessions(name: str):
    """(per-unit session, across-units session) of the model, planned in this process."""
    model = models.build(name)
    shipped = rule.MIN_ROW
    rule.MIN_ROW = 1 << 30  # no grid row is that long: every kernel per unit
    try:
        per_unit = Session(model, target="cpu")
    finally:
        rule.MIN_ROW = shipped
    return model, per_unit, Session(model, target="cpu")


def measure(name: str, repeat: int, copy_bps: float) -> dict:
    model, per_unit, across = sessions(name)
    feeds = models.example_inputs(model, 0)
    before = {r.name: r for r in profile(per_unit, feeds, repeat) if r.kind == "kernel"}
    after = {r.name: r for r in profile(across, feeds, repeat) if r.kind == "kernel"}
    share = lambda r: 100 * r.gbps * 1e9 / copy_bps  # noqa: E731
    big = lambda rows: [r for r in rows.values() if r.dram_bytes >= 1 << 20]  # noqa: E731
    changed = sorted((k for k in after if k in before), key=lambda k: before[k].seconds - after[k].seconds, reverse=True)
    return {"model": name, "per_unit_ms": 1e3 * sum(r.seconds for r in before.values()),
            "across_ms": 1e3 * sum(r.seconds for r in after.values()),
            "lowest_share_before": min((share(r) for r in big(before)), default=None),
            "lowest_share_after": min((share(r) for r in big(after)), default=None),
            "largest_gains": [{"kernel": k[:70], "before_ms": before[k].seconds * 1e3, "after_ms": after[k].seconds * 1e3,
                               "mb": after[k].dram_bytes / 1e6} for k in changed[:5]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=CNNS)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="results/across_units")
    args = ap.parse_args()
    copy_bps = copy_bandwidth()
    results = []
    for name in args.models:
        results.append(measure(name, args.repeat, copy_bps))
        print(results[-1], flush=True)
    fmt = lambda v: "" if v is None else f"{v:.1f}"  # noqa: E731
    lines = [f"# CPU kernels: across units against per unit\n",
             f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the "
             f"end, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}: `PYTHONPATH=. python3 "
             f"scripts/across_units_ab.py --repeat {args.repeat}`. Copy bandwidth (C loop, built like the kernels): "
             f"{copy_bps / 1e9:.1f} GB/s. Each kernel timed alone, median of {args.repeat}.\n",
             "| model | GIR kernels per unit ms | across units ms | speed-up | lowest % of copy (>= 1 MB) before | after |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['per_unit_ms']:.2f} | {r['across_ms']:.2f} | {r['per_unit_ms'] / r['across_ms']:.1f}x | "
                     f"{fmt(r['lowest_share_before'])} | {fmt(r['lowest_share_after'])} |")
    lines.append("\nLargest gains per model (ms per unit -> across units, MB):\n")
    for r in results:
        gains = "; ".join(f"{g['kernel']} {g['before_ms']:.2f} -> {g['after_ms']:.2f} ({g['mb']:.1f} MB)"
                          for g in r["largest_gains"][:3])
        lines.append(f"- {r['model']}: {gains}")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"copy_gbps": copy_bps / 1e9, "models": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
