"""Time the greedy rewrite (Algorithm 1) of every memory-intensive subgraph of one BERT-base
layer (sequence 128, hidden 768, full size), per fused group and in total.

    python scripts/bench_rewrite.py [--target h100] [--limit 1] [--out results/rewrite.md]

`--limit` is how many parallel structures the search rewrites per group (the time reported is
the rewrite alone, all structures included; template generation and merging are excluded).
"""
import argparse
import os
import platform
import time

from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import get_target
from models import bert


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="h100")
    ap.add_argument("--limit", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    graph = load(bert.build(layers=1))
    target = get_target(args.target)
    start = time.perf_counter()
    result = plan(graph, target, limit=args.limit)
    total = time.perf_counter() - start
    layer = [k for k in result.kernels if any("layer.0" in n for n in k.ops)]
    lines = [f"# Rewrite time, one BERT-base layer ({target.name}, {args.limit} structure(s) per group)", "",
             f"{platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d %H:%M')}", "",
             "| group | ops | rules applied | gOps before -> after | rewrite s |", "|---|---|---|---|---|"]
    for k in layer:
        lines.append(f"| {k.name[:60]} | {len(k.ops)} | {len(k.log)} | {len(k.before)} -> {len(k.graph)} | {k.rewrite_seconds:.3f} |")
    rewrite = sum(k.rewrite_seconds for k in layer)
    lines += ["", f"layer groups: {len(layer)}; rewrite total {rewrite:.3f} s; whole plan of the one-layer model "
                  f"(templates, merging, rewriting, ranking, embeddings and pooler included): {total:.2f} s"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
