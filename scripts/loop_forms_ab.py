"""The CPU emitter's loop forms and build against a baseline with them switched off (issue 23).
`--baseline forms` (the default): interior units unmasked and element loops fused
(gir/backends/cstyle.py LoopedLanes, gir/backends/loop_fusion.py) against one masked loop per
gOperator. `--baseline vectors`: the kernels built with `-mprefer-vector-width=512
-mmove-max=512 -mstore-max=512` (gir/backends/cpu/compiler.py `wide_vector_flags`) against
without. `--baseline tiles`: transposing copies as 16x16 tiles (gir/backends/transpose_tiles.py)
against the per-unit loop. `--baseline rows`: element loops that index by row split into rows
(gir/backends/loop_split.py) against left flat. `--baseline loads`: a reduction of a plain DRAM
load reading it in its own loop (gir/ir/streams.py `loaded_as_product`) against a stack copy
first. `--baseline seed`: an unrolled reduction's partials starting as their first element
(gir/backends/across_units.py) against starting at the identity. `--baseline escaping`: element
loops fused where an array they write is still read after them (gir/backends/loop_fusion.py
`_gains`) against left apart. `--baseline products`: a window sum's products streamed into its
partials as fused multiply-adds (gir/backends/across_units.py `_fused_products`) against computed
first; `--baseline hoisting`: channel-lane kernels built with gcc's loop-invariant motion and
partial redundancy elimination off (gir/backends/channel_lanes.py) against on; `--baseline
halos`: channel-lane stages that hold the window's padding, every tap read without a mask
(gir/ir/across_units.py `Padding`), against border positions choosing fill rows. Each zoo model's native CPU session is built twice in one process
from the same plan (the baselines change the C source or its build, not the plan), every GIR
kernel of both timed alone (gir.runtime.profile), the two profiled in turn three times (a
sequential A/B showed drift as losses of 30% on kernels an interleaved A/B of the same C found
equal).

    OMP_NUM_THREADS=1 PYTHONPATH=. python3 scripts/loop_forms_ab.py [--models bert vit] [--repeat 5] [--baseline vectors]

Writes results/loop_forms.md and .json (`--out` for another place)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
from datetime import date
from functools import partial
from pathlib import Path

import models
from gir.backends.cpu import compiler, engine
from gir.backends.cpu.emitter import CpuEmitter
from gir.runtime import Session
from gir.runtime.profile import copy_bandwidth, profile

MODELS = ["bert", "gpt2", "vit", "efficientnet_b0", "shufflenet_v2", "rednet50", "sardrn"]
ROUNDS = 3


# baseline -> the attributes set while its session is made: (owner, name, value)
BASELINES = {
    "forms": [(CpuEmitter, "fuse_loops", False), (CpuEmitter, "split_interior", False), (CpuEmitter, "inline_products", False)],
    # the build only: FLAGS also keys the calibration, which would change the plan
    "vectors": [(engine, "build", partial(compiler.build, flags=compiler.BASE_FLAGS))],
    "tiles": [(CpuEmitter, "tile_transposes", False)],
    "rows": [(CpuEmitter, "split_rows", False)],
    "loads": [(CpuEmitter, "inline_loads", False)],
    "seed": [(CpuEmitter, "seed_partials", False)],
    "escaping": [(CpuEmitter, "fuse_escaping", False)],
    "products": [(CpuEmitter, "fuse_products", False)],
    "hoisting": [(CpuEmitter, "launch_bounds", lambda self, k: "")],
    "halos": [(CpuEmitter, "pad_halos", False)],
}


def baseline_session(model, baseline: str = "forms"):
    """The session with the baseline's switches off (what the emitter or the build did before)."""
    switches = BASELINES[baseline]
    saved = [getattr(owner, name) for owner, name, _ in switches]
    for owner, name, value in switches:
        setattr(owner, name, value)
    try:
        return Session(model, target="cpu")
    finally:
        for (owner, name, _), value in zip(switches, saved):
            setattr(owner, name, value)


def rewritten_kernels(before_s, after_s) -> list[str]:
    """Kernels whose C differs between the two sessions (none for a baseline that changes the
    build only): where a speed-up can come from; elsewhere a difference is the machine's noise."""
    kernels = lambda s: {m[1]: m[0] for m in re.findall(r"(?ms)^(void (?:GIR_ONE_VECTOR )?(\w+)\(.*?^}$)", s.engine.emitted[0])}  # noqa: E731
    before = kernels(before_s)
    return sorted(name for name, body in kernels(after_s).items() if before.get(name) != body)


def measure(name: str, repeat: int, copy_bps: float, baseline: str = "forms") -> dict:
    model = models.build(name)
    before_s, after_s = baseline_session(model, baseline), Session(model, target="cpu")
    feeds = models.example_inputs(model, 0)
    before, after = {}, {}
    for _ in range(ROUNDS):  # alternating, each kernel's fastest median kept: drift hits both alike
        for rows, session in ((before, before_s), (after, after_s)):
            for r in profile(session, feeds, repeat):
                if r.kind == "kernel" and (r.name not in rows or r.seconds < rows[r.name].seconds):
                    rows[r.name] = r
    rewritten = rewritten_kernels(before_s, after_s)
    steps = {int(m[1]) for m in (re.match(r"s(\d+)_", fn) for fn in rewritten) if m}  # a kernel's function: s<step>_...
    share = lambda r: 100 * r.gbps * 1e9 / copy_bps  # noqa: E731
    big = [k for k in after if k in before and after[k].dram_bytes >= 1 << 20]
    shares = sorted(share(after[k]) for k in big)
    changed = sorted((k for k in after if k in before), key=lambda k: before[k].seconds - after[k].seconds, reverse=True)
    return {"model": name, "before_ms": 1e3 * sum(r.seconds for r in before.values()),
            "after_ms": 1e3 * sum(r.seconds for r in after.values()), "kernels": len(after), "kernels_1mb": len(big),
            "rewritten": rewritten,
            "rewritten_times": [{"kernel": k[:70], "before_ms": before[k].seconds * 1e3, "after_ms": after[k].seconds * 1e3,
                                 "mb": after[k].dram_bytes / 1e6} for k in after if k in before and after[k].step in steps],
            "lowest_share_before": min((share(before[k]) for k in big), default=None),
            "lowest_share_after": shares[0] if shares else None,
            "median_share_before": sorted(share(before[k]) for k in big)[len(big) // 2] if big else None,
            "median_share_after": shares[len(shares) // 2] if shares else None,
            "largest_gains": [{"kernel": k[:70], "before_ms": before[k].seconds * 1e3, "after_ms": after[k].seconds * 1e3,
                               "mb": after[k].dram_bytes / 1e6} for k in changed[:3]],
            "largest_losses": [{"kernel": k[:70], "before_ms": before[k].seconds * 1e3, "after_ms": after[k].seconds * 1e3,
                                "mb": after[k].dram_bytes / 1e6} for k in changed[-3:][::-1]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", choices=sorted(BASELINES), default="forms")
    ap.add_argument("--out", default="results/loop_forms")
    args = ap.parse_args()
    copy_bps = copy_bandwidth()
    results = []
    for name in args.models:
        results.append(measure(name, args.repeat, copy_bps, args.baseline))
        r = results[-1]
        print(f"{name}: {r['before_ms']:.2f} -> {r['after_ms']:.2f} ms", flush=True)
    fmt = lambda v: "" if v is None else f"{v:.1f}"  # noqa: E731
    what = {"forms": "interior split and fused loops against one masked loop per gOperator",
            "vectors": "512-bit vectors (`wide_vector_flags`) against the build without them",
            "tiles": "transposing copies as 16x16 tiles against the per-unit loop",
            "rows": "element loops that index by row split into rows against left flat",
            "loads": "reductions reading their DRAM rows in their own loop against a stack copy first",
            "seed": "unrolled reductions' partials seeded by their first element against the identity",
            "escaping": "element loops fused where an array they write outlives them against left apart",
            "products": "window sums' products streamed as fused multiply-adds against computed first",
            "hoisting": "channel-lane kernels without gcc's hoisting of uniform loads against with it",
            "halos": "channel-lane stages holding the window's padding against choosing fill rows at borders"}[args.baseline]
    lines = [f"# CPU kernels: {what}\n",
             f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the "
             f"end, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}: `PYTHONPATH=. python3 "
             f"scripts/loop_forms_ab.py --repeat {args.repeat} --baseline {args.baseline} --models {' '.join(args.models)}`. Copy bandwidth (C loop, built like the kernels): "
             f"{copy_bps / 1e9:.1f} GB/s. Same plan both ways; each kernel timed alone, median of {args.repeat}, "
             f"the two sessions profiled in turn {ROUNDS} times and each kernel's fastest median kept. "
             "Shares are of kernels moving 1 MB or more.\n",
             "| model | GIR kernels | of which C differs | before ms | after ms | speed-up | median % of copy before | after | lowest % before | after |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['kernels']} | {len(r['rewritten'])} | {r['before_ms']:.2f} | {r['after_ms']:.2f} | "
                     f"{r['before_ms'] / r['after_ms']:.2f}x | {fmt(r['median_share_before'])} | {fmt(r['median_share_after'])} | "
                     f"{fmt(r['lowest_share_before'])} | {fmt(r['lowest_share_after'])} |")
    lines.append("\nKernels whose C differs (ms before -> after, MB):\n")
    for r in results:
        row = "; ".join(f"{g['kernel']} {g['before_ms']:.3f} -> {g['after_ms']:.3f} ({g['mb']:.1f} MB)" for g in r["rewritten_times"])
        lines.append(f"- {r['model']}: {row or 'none'}")
    lines.append("\nLargest gains and losses per model (ms before -> after, MB):\n")
    for r in results:
        row = lambda gs: "; ".join(f"{g['kernel']} {g['before_ms']:.2f} -> {g['after_ms']:.2f} ({g['mb']:.1f} MB)" for g in gs)  # noqa: E731
        lines.append(f"- {r['model']}: gains {row(r['largest_gains'])}; losses {row(r['largest_losses'])}")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"copy_gbps": copy_bps / 1e9, "models": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
