"""Fit the GPU library-call model (gir/fusion/partition.py `library_call_seconds`: a fixed cost
per call plus FLOPs at a fraction of the dtype's peak or bytes at the copy bandwidth, whichever
is longer) to the library calls scripts/bench_gpu.py timed alone, and replay the partition's
time check over the groups it measured: which margin, with the fitted model, would have sent
each group where it measured faster.

    PYTHONPATH=. python3 scripts/fit_library_calls.py results/bench_gpu_run6.json [--target h100]

Prints Markdown. Why a grid and log error: call times span 6 us to 125 us, and a ratio that is
off by 2x matters as much for a small call as for a large one. Calls are weighted by how many
ops share their shape (bench_gpu times each shape once).
"""
from __future__ import annotations

import argparse
import json
import math

from gir.ir import get_target

FIXED_US = range(2, 31)                                       # fixed cost per call, us
EFFICIENCIES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.8, 1.0)  # of the dtype's peak
MARGINS = (0.75, 1.0, 1.25, 1.35, 1.5, 2.0, 3.0)


def predict(call: dict, fixed_s: float, efficiency: float, peak: float, bandwidth: float) -> float:
    return fixed_s + max(call["flops"] / (efficiency * peak), call["bytes"] / bandwidth)


def rms_log(calls: list[dict], fn) -> float:
    errors = [math.log(fn(c) / c["seconds"]) for c in calls for _ in c["ops"]]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def fit(calls: list[dict], peak: float, bandwidth: float) -> tuple[float, float, float]:
    """(fixed seconds, efficiency, rms log error) with the least rms log error."""
    return min(((f * 1e-6, e, rms_log(calls, lambda c: predict(c, f * 1e-6, e, peak, bandwidth)))
                for f in FIXED_US for e in EFFICIENCIES), key=lambda r: r[2])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured", help="scripts/bench_gpu.py's JSON (with library_calls and time_checks)")
    ap.add_argument("--target", default="h100")
    args = ap.parse_args(argv)
    target = get_target(args.target)
    peak = target.ridge_point("float32") * target.dram_bandwidth
    bandwidth = target.dram_bandwidth * target.timing.copy_efficiency
    models = json.load(open(args.measured))["models"]
    calls = [c for m in models for c in m["gpu"].get("library_calls", []) if c["flops"]]
    print(f"Library calls of {args.measured} against `fixed + max(FLOPs / (efficiency x {peak / 1e12:.0f} TFLOP/s), "
          f"bytes / {bandwidth / 1e9:.0f} GB/s)`; error is the rms of log(modelled / measured) over ops:\n")
    print("| kind | ops | fitted fixed us | fitted efficiency | rms log error, fitted | rms log error, as modelled in the run |")
    print("|---|---|---|---|---|---|")
    fitted = {}
    for kind in sorted({c["kind"] for c in calls}):
        mine = [c for c in calls if c["kind"] == kind]
        fixed, efficiency, error = fitted[kind] = fit(mine, peak, bandwidth)
        print(f"| {kind} | {sum(len(c['ops']) for c in mine)} | {fixed * 1e6:.0f} | {efficiency:g} | {error:.2f} | "
              f"{rms_log(mine, lambda c: c['modelled_call_s']):.2f} |")
    shape = {(m["model"], n): c for m in models for c in m["gpu"].get("library_calls", []) for n in c["ops"]}
    groups = []  # (GIR modelled, GIR measured, library measured + round trip, library by the fit + round trip)
    for m in models:
        for t in m["gpu"].get("time_checks", []):
            mine = [shape[(m["model"], n)] for n in t["ops"]]
            if not all(c["flops"] for c in mine):
                continue
            by_fit = sum(predict(c, *fitted[c["kind"]][:2], peak, bandwidth) for c in mine) + t["round_trip_s"]
            groups.append((t["gir_modelled_s"], t["gir_s"], t["library_call_s"] + t["round_trip_s"], by_fit))
    if not groups:
        return 0
    best = sum(min(g[1], g[2]) for g in groups)
    print(f"\nThe time check replayed over the {len(groups)} groups the run measured (the groups its time check gave "
          f"back): a group goes to the library when its GIR kernels model at more "
          f"than margin x the fitted library time; measured time of the choices, against {best * 1e6:.0f} us when "
          f"every group takes its faster side and {sum(g[2] for g in groups) * 1e6:.0f} us as the run chose:\n")
    print("| margin | groups to the library | groups on their slower side | measured us |")
    print("|---|---|---|---|")
    for margin in MARGINS:
        back = [g[0] > margin * g[3] for g in groups]
        wrong = sum(b != (g[1] > g[2]) for b, g in zip(back, groups))
        total = sum(g[2] if b else g[1] for b, g in zip(back, groups))
        print(f"| {margin:g} | {sum(back)} | {wrong} | {total * 1e6:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
