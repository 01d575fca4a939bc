"""Host-device traffic of the GPU runtime, counted without a GPU: a model's Session on a GPU
target runs against the recording stand-in (gir/backends/harness/recording.py) with kernels
and GEMMs recorded but not executed, and the script prints what Session creation and one run
did: copies each way (count, bytes, of which weights), synchronisations, kernel launches,
library calls, graph replays.

    PYTHONPATH=. python3 scripts/device_traffic.py bert gpt2 [--tiny] [--target cuda:sm_90]

Full-size zoo models are built in memory (planning BERT-base takes about a minute the first
time; the plan cache keeps it)."""
from __future__ import annotations

import argparse
import sys
import time

import models
from gir.backends.harness.recording import RecordingLauncher, harness_toolchain
from gir.cache import Store, gir_version
from gir.frontend import load
from gir.frontend.basic import BasicOp
from gir.ir import get_target
from gir.backends import device_engine as device
from gir.runtime import Session


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def traffic(model, target: str, device_module=device) -> dict:
    launcher = RecordingLauncher(dialect=get_target(target).backend, execute=False)
    device_module.open_launcher = lambda backend: launcher
    device_module._toolchain = harness_toolchain
    t = get_target(target)
    session = Session(load(model), target, limit=1, plan_cache=Store("plan", gir_version(), repr(t), 1))
    weights = {b.ptr for b in session.engine.constants.values()}
    created = launcher.mark()
    feeds = models.example_inputs(model, 0)
    outputs = session.run(None, feeds)
    events, counts = launcher.since(created), launcher.counts(created)

    def moved(kind, only=None):
        chosen = [e for e in events if e[0] == kind and (only is None or only(e))]
        return len(chosen), sum(e[2] for e in chosen)
    in_weights = lambda e: e[1] in weights  # noqa: E731
    creation = [e for e in launcher.events[:created] if e[0] == "h2d"]
    return {
        "library ops": sum(isinstance(s, BasicOp) for s in session.plan.steps),
        "creation h2d": (len(creation), sum(e[2] for e in creation)),
        "run h2d": moved("h2d"), "run d2h": moved("d2h"),
        "run d2h of weights": moved("d2h", in_weights), "run h2d of weights": moved("h2d", in_weights),
        "feeds": (len(feeds), sum(v.nbytes for v in feeds.values())),
        "outputs": (len(session.graph.outputs), sum(v.nbytes for v in outputs)),
        "syncs": counts["sync"], "launches": counts["launch"], "gemms": counts["gemm"], "convs": counts["conv"],
        "replays": counts["replay"],
        "allocs": counts["alloc"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tiny", action="store_true", help="the bundled tiny variants")
    ap.add_argument("--target", default="cuda:sm_90")
    args = ap.parse_args(argv)
    for name in args.models:
        start = time.time()
        model = models.load_bundled(name) if args.tiny else models.build(name)
        r = traffic(model, args.target)
        print(f"{name}{' (tiny)' if args.tiny else ''} on {args.target}: {r['library ops']} library ops "
              f"({time.time() - start:.0f} s)")
        print(f"  creation: {r['creation h2d'][0]} h2d copies, {_mb(r['creation h2d'][1])}")
        print(f"  one run: h2d {r['run h2d'][0]} copies {_mb(r['run h2d'][1])} (feeds: {r['feeds'][0]}, "
              f"{_mb(r['feeds'][1])}); d2h {r['run d2h'][0]} copies {_mb(r['run d2h'][1])} "
              f"(outputs: {r['outputs'][0]}); weights moved: {r['run h2d of weights'][0]} h2d, "
              f"{r['run d2h of weights'][0]} d2h; syncs {r['syncs']}; launches {r['launches']}, gemms {r['gemms']}, "
              f"library convs {r['convs']}, "
              f"graph replays {r['replays']}, allocations {r['allocs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
