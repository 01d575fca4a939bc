"""Compile BERT-base four times with `gir compile` (each a fresh process, with an empty
compile cache made for the benchmark) and time each:

1. cold: the cache is empty;
2. warm: the same file again (the whole compile comes from the cache);
3. same structure, other weights: one weight changed, so the model entry misses while every
   fused group's searched kernel and most kernel binaries hit (the structure cache alone);
4. cold with `--parallel-jobs` build processes, from a second empty cache.

    PYTHONPATH=. python scripts/bench_compile_cache.py [--target cuda:sm_80] [--jobs 1] [--parallel-jobs 2]
        [--model bert.onnx] [--out results/compile_cache.md] [--json results/compile_cache.json]

Prints a table and writes it (markdown) and the numbers (JSON). Cache hits are read from
`gir compile --verbose`. The three runs use one copy of the gir package taken at the start:
the GIR version in the cache keys is a digest of the sources, so an edit to the checkout
during the runs would otherwise turn the warm runs cold.
"""
import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import numpy_helper

import models


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot_gir(work: str) -> None:
    """A copy of the gir package under WORK/src, the one compile_once runs: the GIR version in
    the cache keys is a digest of the sources, so an edit to the checkout during the runs would
    otherwise turn warm runs cold."""
    shutil.copytree(os.path.join(ROOT, "gir"), os.path.join(work, "src", "gir"),
                    ignore=shutil.ignore_patterns("__pycache__"))


class CompileFailed(RuntimeError):
    """`gir compile` exited non-zero; the message is its last line of stderr."""


def compile_once(model: str, target: str, jobs: int, work: str, cache: str, limit: int | None = None) -> dict:
    """`limit`: gir compile's --limit (its own default when None)."""
    start = time.perf_counter()
    options = ["--limit", str(limit)] if limit is not None else []
    proc = subprocess.run([sys.executable, "-m", "gir.cli", "compile", model, "--target", target, "-o",
                           os.path.join(work, "out"), "--jobs", str(jobs), "--verbose", *options],
                          capture_output=True, text=True,
                          cwd=work, env={**os.environ, "GIR_CACHE_DIR": os.path.join(work, cache),
                                         "PYTHONPATH": os.path.join(work, "src")})
    seconds = time.perf_counter() - start
    if proc.returncode:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no message"
        raise CompileFailed(f"gir compile failed ({proc.returncode}): {last}")

    def number(pattern):
        found = re.search(pattern, proc.stderr)
        return float(found.group(1)) if found else None
    return {"jobs": jobs, "seconds": round(seconds, 2), "model_hit": "model cache: hit" in proc.stderr,
            "plan_seconds": number(r"planned in ([\d.]+) s"), "build_seconds": number(r"built and reported in ([\d.]+) s"),
            "plan_hits": int(number(r"plan cache: (\d+) hit") or 0), "plan_misses": int(number(r"hit\(s\), (\d+) miss") or 0),
            "summary": proc.stdout.strip().split(": ", 1)[-1]}


def other_weights(src: str, dst: str) -> None:
    """The same model with one element of its largest weight changed."""
    model = onnx.load(src)
    init = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    value = numpy_helper.to_array(init).copy()
    value.flat[0] += np.asarray(1, value.dtype)
    init.CopyFrom(numpy_helper.from_array(value, init.name))
    onnx.save(model, dst)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="cuda:sm_80")
    ap.add_argument("--jobs", type=int, default=1, help="build processes of runs 1-3")
    ap.add_argument("--parallel-jobs", type=int, default=2, help="build processes of run 4")
    ap.add_argument("--model", help="a BERT-base ONNX file (default: built with `models`, seeded weights)")
    ap.add_argument("--out", default="results/compile_cache.md")
    ap.add_argument("--json", default="results/compile_cache.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gir-bench-cache-") as work:
        snapshot_gir(work)
        model = os.path.abspath(args.model) if args.model else os.path.join(work, "bert.onnx")
        if not args.model:
            onnx.save(models.build("bert"), model)
        variant = os.path.join(work, "bert_other_weights.onnx")
        other_weights(model, variant)
        runs = {}
        for name, path, jobs, cache in (("cold", model, args.jobs, "cache"), ("warm", model, args.jobs, "cache"),
                                        ("same structure, other weights", variant, args.jobs, "cache"),
                                        ("cold, parallel build", model, args.parallel_jobs, "cache-parallel")):
            try:
                runs[name] = compile_once(path, args.target, jobs, work, cache)
            except CompileFailed as err:
                sys.exit(f"bench_compile_cache: {err}")
            print(f"{name}: {runs[name]['seconds']} s", file=sys.stderr, flush=True)
    cold = runs["cold"]["seconds"]
    lines = [f"# Compile cache: BERT-base, `gir compile --target {args.target}`", "",
             f"{platform.node()} ({os.cpu_count()} cores, Python {platform.python_version()}), "
             f"{time.strftime('%Y-%m-%d %H:%M')}; each run a fresh process; wall-clock seconds of the whole command, "
             f"and of its planning and build + report phases (from `--verbose`); {runs['cold']['summary']}", "",
             "| run | jobs | seconds | cold / this | plan s | build + report s | model entry | fused-group searches reused |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        reused = "not planned" if r["model_hit"] else f"{r['plan_hits']} of {r['plan_hits'] + r['plan_misses']}"
        phases = [f"{r[k]:.2f}" if r[k] is not None else "-" for k in ("plan_seconds", "build_seconds")]
        lines.append(f"| {name} | {r['jobs']} | {r['seconds']:.2f} | {cold / r['seconds']:.1f}x | {phases[0]} | {phases[1]} | "
                     f"{'hit' if r['model_hit'] else 'miss'} | {reused} |")
    text = "\n".join(lines) + "\n"
    print(text)
    for path, data in ((args.out, text), (args.json, json.dumps({"target": args.target, "runs": runs},
                                                                 indent=1) + "\n")):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write(data)


if __name__ == "__main__":
    main()
