"""GIR's CPU latency under OpenMP wait policies, idle and with one core taken.

    PYTHONPATH=. python3 scripts/omp_wait_ab.py [--models NAME ...] [--rounds 2]
        [--settings passive spin1k spin3k spin10k] [--out results/omp_wait]

Per model, round and setting: one fresh process (bench_cpu.py's child: build, session from
the persistent plan cache, one warm-up, median of 20 runs, default threads) idle, then one
while a pure-Python loop in another process holds a core (bench_cpu.Hog). Settings are
environment variables libgomp reads when it loads: `passive` is OMP_WAIT_POLICY=PASSIVE,
`spinN` is GOMP_SPINCOUNT=N with the wait policy unset (the engine's default is spin1k, see
gir/backends/cpu/compiler.py). Prints one line per round and a table of medians.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from bench_cpu import Hog, measure, write_results  # noqa: E402

SPINS = {"spin1k": 1000, "spin3k": 3000, "spin10k": 10000, "spin30k": 30000, "spin300k": 300000}
SETTINGS = {"passive": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None},
            **{name: {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": str(n)} for name, n in SPINS.items()}}


def run(name: str, setting: str) -> float:
    """bench_cpu's child for GIR, default threads, 20 runs; NaN (and the error) if it failed."""
    row = measure(name, "gir", 0, 20, False, extra_env={**SETTINGS[setting], "PYTHONPATH": os.getcwd()})
    if "error" in row:
        print(f"{name} {setting}: {row['error']}", file=sys.stderr)
    return row.get("ms", float("nan"))


def main():
    sys.path.insert(0, os.getcwd())
    import models
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=[n for n in models.MODELS if n != "gpt2_b128"])
    ap.add_argument("--settings", nargs="*", default=["passive", "spin1k", "spin3k", "spin10k"], choices=SETTINGS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for name in args.models:
        run(name, args.settings[0])  # plans once (the persistent cache)
        for r in range(args.rounds):
            line = []
            for s in args.settings:
                idle = run(name, s)
                with Hog():
                    busy = run(name, s)
                rows.append({"model": name, "round": r, "setting": s, "idle_ms": idle, "busy_ms": busy})
                line.append(f"{s} {idle:.2f}/{busy:.2f}")
            print(f"{name} round {r}: " + " | ".join(line), flush=True)
    head = ["model"] + [f"{s} idle / busy ms (busy/idle)" for s in args.settings]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in args.models:
        cells = [name]
        for s in args.settings:
            mine = [r for r in rows if r["model"] == name and r["setting"] == s]
            idle = sorted(r["idle_ms"] for r in mine)[len(mine) // 2]
            busy = sorted(r["busy_ms"] for r in mine)[len(mine) // 2]
            cells.append(f"{idle:.2f} / {busy:.2f} ({busy / idle:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_results(args.out, "GIR CPU latency by OpenMP wait policy, idle and with one core taken", rows, text,
                      f"default threads; upper median over {args.rounds} round(s) of each process's median of 20 runs")


if __name__ == "__main__":
    main()
