"""The CPU one-thread bound (`Timing.serial_below_bytes`, gir/ir/one_thread.py) against model
latency, idle and with another CPU-bound process on the machine (issue 25's busy-core bar:
latency at most 2.5x the idle figure of the same run). Each bound is set by patching the CPU
target's nominal timing before the target is built (the calibrated timing takes the bound from
it), so every bound plans and builds its own session (compile cache keyed by the target).

    PYTHONPATH=. python3 scripts/probe_serial_bound.py --bounds 1048576 262144 65536 \
        --models shufflenet_v2 efficientnet_b0 --out results/serial_bound_probe.md

Default threads; one process per (bound, state); median of `--runs` runs after five warm-ups.
A probe for the next change to the bound, not a benchmark of record: one process each, so read
differences under about 15% on a shared 2-core VM as noise.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import sys, time, numpy as np
from dataclasses import replace
import gir.backends.cpu.target as T
bound, name, runs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
T.CPU_NOMINAL_TIMING = replace(T.CPU_NOMINAL_TIMING, serial_below_bytes=bound)
from gir.ir import get_target
assert get_target("cpu").timing.serial_below_bytes == bound
import gir, models
s = gir.Session(models.build(name), target="cpu")
g = s.engine.plan.graph
feeds = {n: np.random.default_rng(0).standard_normal(g.tensors[n].shape).astype(np.float32) for n in g.inputs}
for _ in range(5):
    s.run(None, feeds)
ts = []
for _ in range(runs):
    a = time.perf_counter(); s.run(None, feeds); ts.append(time.perf_counter() - a)
print(float(np.median(ts)))
"""

BURN = "import time\nt = time.time()\nwhile time.time() - t < float(__import__('sys').argv[1]): pass\n"


def latency(bound: int, name: str, runs: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(bound), name, str(runs)], check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bounds", type=int, nargs="+", default=[1 << 20, 1 << 18, 1 << 16])
    ap.add_argument("--models", nargs="+", default=["shufflenet_v2", "efficientnet_b0"])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--out", default="results/serial_bound_probe.md")
    args = ap.parse_args()
    rows = []
    for name in args.models:
        for bound in args.bounds:
            idle = latency(bound, name, args.runs)
            burner = subprocess.Popen([sys.executable, "-c", BURN, "600"])
            try:
                time.sleep(0.5)
                busy = latency(bound, name, args.runs)
            finally:
                burner.kill()
            rows.append({"model": name, "bound_bytes": bound, "idle_ms": idle * 1e3, "busy_ms": busy * 1e3})
            print(f"{name:16s} bound {bound >> 10:5d} KB  idle {idle * 1e3:7.2f} ms  busy {busy * 1e3:7.2f} ms  "
                  f"busy/idle {busy / idle:.2f}", flush=True)
    lines = [f"# The CPU one-thread bound, idle and with a busy core\n",
             f"`PYTHONPATH=. python3 scripts/probe_serial_bound.py --bounds {' '.join(map(str, args.bounds))} "
             f"--models {' '.join(args.models)} --out {args.out}` on {time.strftime('%Y-%m-%d %H:%M')} UTC; default "
             f"threads, median of {args.runs} runs, one process each (see the script's docstring).\n",
             "| model | bound KB | idle ms | busy ms | busy / idle |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['bound_bytes'] >> 10} | {r['idle_ms']:.2f} | {r['busy_ms']:.2f} | "
              f"{r['busy_ms'] / r['idle_ms']:.2f} |" for r in rows]
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
