"""Planning time of the seven zoo models (the planner's share of the suite and of `gir compile`):
each model loaded, then `plan()` timed alone, no profiler (cProfile inflated the planner's small
functions up to 2x). Each round is a fresh process: the scope analysis caches its answers per
process, and a second plan in the same process measured 10-30% faster than a first.
`--tree DIR` plans with another checkout's `gir` and `models` (a `git worktree` of an older
commit), so two trees are compared by the same command.

    PYTHONPATH=. python3 scripts/bench_plan_zoo.py [--targets cpu cuda:sm_90] [--rounds 2] [--tree DIR]
        [--out results/plan_zoo_time]

Prints a table of seconds per model and target (the fastest of the rounds) and writes OUT.md
and OUT.json."""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ZOO = ["bert", "gpt2", "vit", "efficientnet_b0", "shufflenet_v2", "rednet50", "sardrn"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["cpu"])
    ap.add_argument("--models", nargs="+", default=ZOO)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--tree", default=None, help="another checkout whose gir and models to time")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    tree = str(Path(args.tree or ".").resolve())
    sys.path.insert(0, tree)
    import gir
    import models
    from gir.frontend import load
    from gir.fusion.plan import plan
    from gir.ir.target import get_target
    assert Path(gir.__file__).resolve().is_relative_to(tree), f"gir imported from {gir.__file__}, not {tree}"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=tree).stdout.strip()
    if args.worker:
        graphs = {name: load(models.build(name)) for name in args.models}
        out = {}
        for t in args.targets:
            for name, g in graphs.items():
                start = time.perf_counter()
                plan(g, get_target(t), limit=args.limit)
                out[f"{t} {name}"] = time.perf_counter() - start
        print(json.dumps(out))
        return
    seconds = {}
    for _ in range(args.rounds):  # a fresh process each
        cmd = [sys.executable, __file__, "--worker", "--tree", tree, "--limit", str(args.limit),
               "--targets", *args.targets, "--models", *args.models]
        found = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
        for key, s in found.items():
            t, name = key.split(" ", 1)
            seconds[t, name] = min(s, seconds.get((t, name), s))
    lines = ["| target | " + " | ".join(args.models) + " | total |", "|---|" + "---:|" * (len(args.models) + 1)]
    for t in args.targets:
        row = [seconds[t, n] for n in args.models]
        lines.append(f"| {t} | " + " | ".join(f"{s:.1f}" for s in row) + f" | {sum(row):.1f} |")
    text = (f"# Zoo planning time\n\n{date.today()}, {platform.machine()}, {os.cpu_count()} cores, tree {commit}: "
            f"`PYTHONPATH=. python3 scripts/bench_plan_zoo.py --targets {' '.join(args.targets)} --rounds {args.rounds}"
            f"{' --tree ' + args.tree if args.tree else ''}`. Seconds of `plan()` per model (limit {args.limit}), the "
            f"fastest of {args.rounds} rounds, each a fresh process.\n\n" + "\n".join(lines) + "\n")
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text)
        out.with_suffix(".json").write_text(json.dumps({"commit": commit, "seconds": {f"{t} {n}": s for (t, n), s in seconds.items()}},
                                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
