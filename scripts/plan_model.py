"""Plan full-size zoo models for a target and print kernels and DRAM bytes (one kernel per op,
GIR, compulsory bound) with load and plan time.

    python scripts/plan_model.py --target a100 bert [gpt2 ...]
"""
import argparse
import time

import models
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import get_target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="a100")
    ap.add_argument("--limit", type=int, default=2, help="parallel structures searched per group")
    ap.add_argument("models", nargs="+", choices=sorted(models.MODELS))
    args = ap.parse_args()
    target = get_target(args.target)
    for name in args.models:
        start = time.perf_counter()
        graph = load(models.build(name))
        loaded = time.perf_counter() - start
        start = time.perf_counter()
        p = plan(graph, target, limit=args.limit)
        planned = time.perf_counter() - start
        unfused = sum(s.unfused_bytes for s in p.subgraphs)
        gir = sum(s.gir_bytes for s in p.subgraphs)
        bound = sum(s.bound_bytes for s in p.subgraphs)
        print(f"{name} on {target.name}: load {loaded:.1f} s, plan {planned:.1f} s, {len(p.partition.library)} library ops, "
              f"{len(p.subgraphs)} subgraphs, {len(p.kernels)} kernels; DRAM one-kernel-per-op {unfused / 1e6:.1f} MB, "
              f"GIR {gir / 1e6:.1f} MB, bound {bound / 1e6:.1f} MB ({gir / bound:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
