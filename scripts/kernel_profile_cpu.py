"""Per-kernel CPU bandwidth of the zoo (issue 23): every step of each model's native CPU session
timed alone by gir.runtime.profile, against this machine's copy bandwidth measured in the same
process (before each model and after the last: the median of those probes, their range printed).
Writes results/kernel_profile_cpu.md (per model: the GIR kernels of 1 MB or more, their median
and lowest share of copy bandwidth, and the slowest ones) and .json.

    PYTHONPATH=. python3 scripts/kernel_profile_cpu.py [--models efficientnet_b0 gpt2] [--repeat 10]

Timings on a shared 2-core VM are noisy: the load average is printed with the table, and only
shares measured in one run should be compared."""
from __future__ import annotations

import argparse
import json
import os
import platform
from datetime import date
from pathlib import Path

import numpy as np

import models
from gir.runtime import Session
from gir.runtime.profile import copy_bandwidth, profile

ZOO = ["bert", "gpt2", "vit", "efficientnet_b0", "shufflenet_v2", "rednet50", "sardrn"]


def measure(name: str, repeat: int) -> dict:
    """One model's steps timed alone: the totals, and each GIR kernel of 1 MB or more."""
    model = models.build(name)
    session = Session(model, target="cpu")
    rows = profile(session, models.example_inputs(model, 0), repeat)
    big = [r for r in rows if r.kind == "kernel" and r.dram_bytes >= 1 << 20]
    return {"model": name, "steps": len(rows), "kernels": sum(r.kind == "kernel" for r in rows),
            "kernel_ms": 1e3 * sum(r.seconds for r in rows if r.kind == "kernel"),
            "library_ms": 1e3 * sum(r.seconds for r in rows if r.kind != "kernel"),
            "big": len(big), "big_kernels": [{"name": r.name[:70], "ms": r.seconds * 1e3, "mb": r.dram_bytes / 1e6,
                                              "gbps": r.gbps} for r in big]}


def with_shares(r: dict, copy_bps: float) -> dict:
    """The model's kernels of 1 MB or more as shares of the copy bandwidth: median, lowest, and
    the three lowest."""
    share = lambda k: 100 * k["gbps"] * 1e9 / copy_bps  # noqa: E731
    big = sorted(r["big_kernels"], key=lambda k: k["gbps"])
    return {**r, "median_share": float(np.median([share(k) for k in big])) if big else None,
            "lowest_share": share(big[0]) if big else None,
            "slowest": [{**k, "share": share(k)} for k in big[:3]]}


def table(results, copy_bps) -> str:
    lines = ["| model | steps | GIR kernels | kernels >= 1 MB | median % of copy | lowest % | GIR kernel ms | library ms | "
             "lowest three (ms, MB, % of copy) |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        fmt = lambda v: "" if v is None else f"{v:.1f}"  # noqa: E731
        slow = "; ".join(f"{s['name']} ({s['ms']:.2f}, {s['mb']:.1f}, {s['share']:.1f}%)" for s in r["slowest"])
        lines.append(f"| {r['model']} | {r['steps']} | {r['kernels']} | {r['big']} | {fmt(r['median_share'])} | "
                     f"{fmt(r['lowest_share'])} | {r['kernel_ms']:.2f} | {r['library_ms']:.2f} | {slow} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=ZOO)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", default="results/kernel_profile_cpu")
    args = ap.parse_args()
    # the copy probe before each model and after the last: on a shared VM it moved by 1.4x between
    # runs (35-51 GB/s on an AMD EPYC guest), and every share moves with it; the median is used
    probes = []
    raw = []
    for name in args.models:
        probes.append(copy_bandwidth())
        raw.append(measure(name, args.repeat))
        print(name, f"copy {probes[-1] / 1e9:.1f} GB/s", flush=True)
    probes.append(copy_bandwidth())
    copy_bps = float(np.median(probes))
    results = [with_shares(r, copy_bps) for r in raw]
    load = os.getloadavg()
    text = (f"# CPU kernels against copy bandwidth\n\n{date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
            f"load average {load[0]:.2f} at the end, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}: "
            f"`PYTHONPATH=. python3 scripts/kernel_profile_cpu.py`. "
            f"Copy bandwidth (C loop, OpenMP, built like the kernels): {copy_bps / 1e9:.1f} GB/s, the median of "
            f"{len(probes)} probes, one before each model and one after the last, which ranged "
            f"{min(probes) / 1e9:.1f}-{max(probes) / 1e9:.1f} GB/s. Each step timed "
            f"alone (`gir run --profile`), median of {args.repeat}; MB are the plan's modelled DRAM bytes.\n\n"
            + table(results, copy_bps) + "\n")
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"copy_gbps": copy_bps / 1e9, "copy_probes_gbps": [p / 1e9 for p in probes],
                                                    "models": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
