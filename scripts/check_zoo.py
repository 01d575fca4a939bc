"""Every zoo model through gir.Session on the CPU target (native engine) against onnxruntime
on the same seeded inputs. Errors are the worst over the model's outputs: max |gir - ort|, and
that divided by max |ort| of the same output ("relative to the largest reference magnitude",
the issue's 1e-4 criterion). Latencies are medians of --runs after one warm-up run.

    PYTHONPATH=. python scripts/check_zoo.py [--tiny] [--runs 5] [--out FILE] [MODEL ...]

Writes a markdown table (default results/check_zoo.md, or results/check_zoo_tiny.md with
--tiny). A model that fails gets a row saying why, and the others still run.
"""
import argparse
import os
import platform
import statistics
import time
from datetime import date

import numpy as np
import onnxruntime as ort

import gir
import models
from gir.frontend.errors import one_line

TOLERANCE = 1e-4


def failure(err: Exception) -> str:
    """An exception as one short line, for a table cell."""
    return f"{type(err).__name__}: {one_line(err)[:160]}"


def median_ms(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def errors(got: list, want: list) -> tuple[float, float]:
    """Worst over the outputs: max |got - want|, and that over max |want| of the same output."""
    diffs = [np.abs(g.astype(np.float64) - w) for g, w in zip(got, want)]
    abs_err = max(float(d.max()) for d in diffs)
    rel_err = max(float(d.max()) / max(float(np.abs(w).max()), 1e-30) for d, w in zip(diffs, want))
    return abs_err, rel_err


def compare(model, feeds: dict, runs: int, limit: int) -> tuple[dict, gir.Session]:
    """gir.Session (CPU, native engine) against onnxruntime on `feeds`: errors and median latencies,
    and the session (its plan says what GIR ran)."""
    start = time.perf_counter()
    session = gir.Session(model, target="cpu", limit=limit)
    compile_s = time.perf_counter() - start
    got = session.run(None, feeds)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = reference.run(None, feeds)
    abs_err, rel_err = errors(got, want)
    return {"plan_s": session.plan.search_seconds, "compile_s": compile_s,
            "kernels": len(session.plan.kernels), "peak_mb": session.memory.peak_bytes / 1e6,
            "unshared_mb": session.memory.unshared_bytes / 1e6, "abs": abs_err, "rel": rel_err,
            "gir_ms": median_ms(lambda: session.run(None, feeds), runs),
            "ort_ms": median_ms(lambda: reference.run(None, feeds), runs)}, session


def check(name: str, tiny: bool, runs: int, limit: int) -> dict:
    model = models.load_bundled(name) if tiny else models.build(name)
    return compare(model, models.example_inputs(model, 0), runs, limit)[0]


HEADER = ("| model | max abs err | max rel err | ok | GIR ms | ORT ms | plan s | session s | kernels | arena MB (unshared) |\n"
          "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")


def row(name: str, r: dict) -> str:
    if "error" in r:
        return f"| {name} | | | error: {r['error']} | | | | | | |"
    ok = "yes" if r["rel"] < TOLERANCE else "NO"
    return (f"| {name} | {r['abs']:.3g} | {r['rel']:.3g} | {ok} | {r['gir_ms']:.2f} | {r['ort_ms']:.2f} | "
            f"{r['plan_s']:.1f} | {r['compile_s']:.1f} | {r['kernels']} | {r['peak_mb']:.2f} ({r['unshared_mb']:.2f}) |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help=f"models to check (default: all of {', '.join(sorted(models.MODELS))})")
    ap.add_argument("--tiny", action="store_true", help="the bundled tiny variants")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--limit", type=int, default=2, help="parallel structures searched per group")
    ap.add_argument("--out", help="markdown file to write")
    args = ap.parse_args()
    names = args.models or sorted(models.MODELS)
    unknown = [n for n in names if n not in models.MODELS]
    if unknown:
        ap.error(f"unknown model {unknown[0]!r}")
    out = args.out or f"results/check_zoo{'_tiny' if args.tiny else ''}.md"
    print(HEADER, flush=True)
    rows = []
    for name in names:
        try:
            result = check(name, args.tiny, args.runs, args.limit)
        except Exception as err:  # noqa: BLE001 -- one failing model is a row, not the end of the check
            result = {"error": failure(err)}
        rows.append(row(name, result))
        print(rows[-1], flush=True)
    variant = "bundled tiny variants" if args.tiny else "full size (models.build)"
    with open(out, "w") as f:
        f.write(f"# Zoo models on the CPU target against onnxruntime ({variant})\n\n{HEADER}\n")
        f.write("\n".join(rows) + "\n\n")
        f.write(f"gir.Session(model, target='cpu', limit={args.limit}), native engine (emitted C + OpenMP, library ops "
                f"through numpy); onnxruntime {ort.__version__} CPUExecutionProvider. Seeded inputs "
                "(models.example_inputs, seed 0), the same for both. Errors: worst output; relative = max abs error / "
                f"max |reference| of that output; ok when under {TOLERANCE:g}. Latencies: median of {args.runs} runs "
                "after one warm-up. plan s: planning; session s: load + plan + emit + C build (cached builds are "
                f"not rebuilt). {platform.machine()}, {os.cpu_count()} cores (shared with other jobs), "
                f"{date.today().isoformat()}.\n")


if __name__ == "__main__":
    main()
