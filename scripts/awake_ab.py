"""GIR's CPU latency with one-thread calls run awake, not awake, and chosen per run
(gir/runtime/awake_call.py), idle and with one core taken by another process.

    PYTHONPATH=. python3 scripts/awake_ab.py [--models NAME ...] [--modes off on auto] [--rounds 2]
        [--runs 20] [--out results/awake_calls]

Runs scripts/bench_cpu.py --runtimes gir --threads 0 --busy once per mode and round, with
$GIR_AWAKE set to the mode, modes in turn within a round, and prints per model and mode the
median latency and busy/idle of each round. Each bench process is fresh: the auto mode
learns within the run's first runs (AwakeChoice.FIRST per mode), which the median of --runs
mostly leaves out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(models: list[str], mode: str, runs: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench"
        env = dict(os.environ, GIR_AWAKE=mode, PYTHONPATH=str(ROOT))
        subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_cpu.py"), "--models", *models, "--threads", "0",
                        "--runtimes", "gir", "--runs", str(runs), "--busy", "--out", str(out)],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(out.with_suffix(".json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["shufflenet_v2", "efficientnet_b0", "gpt2", "rednet50", "sardrn"])
    ap.add_argument("--modes", nargs="*", default=["off", "on", "auto"], choices=("off", "on", "auto"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out")
    args = ap.parse_args()
    cells: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for mode in args.modes:
            for row in bench(args.models, mode, args.runs):
                cells.setdefault((row["model"], mode), []).append((row["ms"], row["busy_ms"]))
            print(f"round {r + 1}, {mode}: done", file=sys.stderr, flush=True)
    lines = ["| model | " + " | ".join(f"{m}: ms (busy/idle)" for m in args.modes) + " |",
             "|---|" + "---|" * len(args.modes)]
    for model in args.models:
        row = []
        for mode in args.modes:
            row.append("; ".join(f"{ms:.2f} ({busy / ms:.2f}x)" for ms, busy in cells.get((model, mode), [])))
        lines.append(f"| {model} | " + " | ".join(row) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(
            "# One-thread calls awake, not awake, and chosen per run\n\n"
            f"`{' '.join(['python3'] + sys.argv)}`, {time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} cores. "
            "GIR at default threads, each mode in a fresh process per round (scripts/bench_cpu.py --busy): "
            "median of the runs after one warm-up, idle, then with a pure-Python loop holding one core; "
            "one cell entry per round.\n\n" + text + "\n")
        Path(args.out + ".json").write_text(json.dumps({f"{m}|{mode}": v for (m, mode), v in cells.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
