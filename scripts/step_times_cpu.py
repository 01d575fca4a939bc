"""Each step of a native CPU session timed where it stands in a whole run, not alone.

    PYTHONPATH=. python3 scripts/step_times_cpu.py MODEL.onnx [--runs 20] [--top 30] [--awake on|off]

`gir run --profile` (gir/backends/cpu/profile.py) repeats each step alone, so a step re-reads
what the cache kept from its own previous repeat; on a VM whose last-level cache holds hundreds
of MB, GPT-2 decode's GEMVs then read from the cache. Here the whole plan runs `--runs` times,
each call timed as it runs (the engine's bound thunks), so each step finds the caches and the
thread pool as the run leaves them: a kernel after one-thread work pays the pool's wake-up, as
it does in a real run. Prints the total, and per step (largest median first) its median time,
the plan's DRAM bytes (modelled, GIR kernels) and those over that time. Feeds: the zoo's
example inputs (`models.example_inputs`).
"""
from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np
import onnx

import models
from gir.frontend.basic import BasicOp
from gir.runtime import Session


def step_times(session: Session, feeds: dict, runs: int, awake: bool = True) -> tuple[float, dict[int, float]]:
    """(median run seconds, step index -> median seconds of its calls in a run). `awake`: the
    one-thread calls before a fork keep the team spinning (gir/runtime/awake_call.py), as
    the engine's runs do on an idle machine."""
    session.run(None, feeds)  # warms the library and the arena
    engine = session.engine
    buffers, thunks = engine.bind({n: np.asarray(feeds[n]) for n in session.graph.inputs}, awake)  # the thunks point into buffers
    per_step, totals = collections.defaultdict(list), []
    for _run in range(runs):
        this = collections.defaultdict(float)
        start = time.perf_counter()
        for step, thunk in zip(engine.call_steps, thunks):
            t0 = time.perf_counter()
            thunk()
            this[step] += time.perf_counter() - t0
        totals.append(time.perf_counter() - start)
        for step, seconds in this.items():
            per_step[step].append(seconds)
    del buffers  # held until every run is done
    return float(np.median(totals)), {s: float(np.median(v)) for s, v in per_step.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--awake", choices=("on", "off"), default="on",
                    help="one-thread calls before a fork keep the team spinning (the engine's choice when idle)")
    args = ap.parse_args()
    model = onnx.load(args.model)
    session = Session(model, target="cpu")
    total, times = step_times(session, models.example_inputs(model, 0), args.runs, args.awake == "on")
    print(f"{args.model}: run median {total * 1e3:.2f} ms, steps {sum(times.values()) * 1e3:.2f} ms")
    print(f"{'step':>4}  {'kind':<8} {'ms':>8} {'MB':>9} {'GB/s':>7}  name")
    for step, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:args.top]:
        s = session.plan.steps[step]
        if isinstance(s, BasicOp):
            print(f"{step:>4}  {s.kind:<8} {seconds * 1e3:>8.3f} {'':>9} {'':>7}  {s.name[:70]}")
        else:
            mb = s.estimate.dram_bytes / 1e6
            print(f"{step:>4}  {'kernel':<8} {seconds * 1e3:>8.3f} {mb:>9.2f} {mb / 1e3 / seconds:>7.1f}  {s.name[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
