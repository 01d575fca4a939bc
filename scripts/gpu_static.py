"""Static GPU utilisation of the zoo's plans (no GPU needed): per model and target, the time
model's figures and what the kernels ask of the memory system.

Per model: kernels; modelled time (sum over kernels, gir/fusion/perf.py) and modelled share of
peak DRAM bandwidth (distinct DRAM bytes / modelled time / nominal peak); the share of DRAM
access bytes moved by 16-byte accesses (gir/ir/vector_access.py: the IR proves the DRAM side;
the emitters also need the lane's registers consecutive, which `--ptx` checks in the PTX); and,
among kernels that move 1 MB or more, how many launch blocks under 128 threads or fewer than
two blocks per SM/CU, with the bytes that cannot go wide named by reason. Also the model's
figure for a plain 64 MB device-to-device copy (issue 24's sanity check: 85-95% of peak).

    PYTHONPATH=. python scripts/gpu_static.py --targets cuda:sm_90 hip:gfx90a --out results/gpu_static [--ptx bert gpt2]
    PYTHONPATH=. python scripts/gpu_static.py --kernels efficientnet_b0:/features/2/0/block/0/0/Conv/mul

`--kernels MODEL:PREFIX ...` prints, for the first planned kernel whose name starts with PREFIX
(CUDA targets), what it asks of the GPU next to what it moves: launch shape, the widths of its
DRAM accesses, registers from ptxas, occupancy and bytes in flight as the model derives them
from those registers, modelled time and DRAM bytes.

Every number is modelled or static: nothing here ran on a GPU.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import time
from collections import Counter
from pathlib import Path

import models
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import DRAM, Move, get_target
from gir.ir.vector_access import access_census, vector_width

MB = 1 << 20


def copy_share(target) -> tuple[float, str]:
    """The modelled share of peak of the fastest plain-copy structure of a 64 MB tensor."""
    from onnx import TensorProto, helper
    from gir.fusion.perf import estimate, quick_estimate
    from gir.rewrite import optimize
    from gir.templates.pointwise import pointwise_candidates
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [16384, 1024])
    g = load(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "copy", [io("x")], [io("y")]),
                               opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    cands = pointwise_candidates(g.ops[0], g.tensors, target, (16384, 1024), [("x", 0, (1024, 1))], (1024, 1), None, [])
    fastest = min(cands, key=lambda c: quick_estimate(c.graph).seconds)
    best = estimate(optimize(fastest.graph)[0])
    return best.bandwidth_share(target), str(best)


def measure(name: str, target_name: str, limit: int) -> dict:
    target = get_target(target_name)
    graph = load(models.build(name))
    start = time.perf_counter()
    p = plan(graph, target, limit=limit)
    planned = time.perf_counter() - start
    seconds = sum(k.estimate.seconds for k in p.kernels)
    dram = sum(k.estimate.dram_bytes for k in p.kernels)
    access = wide = allowed = 0
    reasons, big, small_blocks, few_blocks, shapes = Counter(), 0, [], [], Counter()
    launches = sum(k.estimate.kernels for k in p.kernels)
    one_warp = sum(k.estimate.kernels for k in p.kernels if k.graph.prim.units_per_block == 1)
    for k in p.kernels:
        census = access_census(k.graph)
        access, wide, allowed = access + census["total"], wide + census["wide"], allowed + census["allowed"]
        reasons.update(census["narrow"])
        if k.estimate.dram_bytes >= MB:
            big += 1
            threads = k.graph.prim.units_per_block * target.lanes_per_unit
            if threads < 128:
                small_blocks.append(f"{k.name[:48]} ({threads})")
            if k.graph.prim.num_blocks < 2 * target.processors:
                few_blocks.append(f"{k.name[:48]} ({k.graph.prim.num_blocks})")
            if threads < 128 or k.graph.prim.num_blocks < 2 * target.processors:
                shapes[_launch_shape(k, target)] += 1
    return {"model": name, "target": target_name, "kernels": len(p.kernels), "modelled_us": seconds * 1e6,
            "dram_mb": dram / 1e6, "modelled_peak_share": dram / seconds / target.dram_bandwidth if seconds else 0.0,
            "access_mb": access / 1e6, "wide_share": wide / access if access else 0.0,
            "allowed_mb": allowed / 1e6, "wide_share_allowed": wide / allowed if allowed else 0.0,
            "narrow_mb_by_reason": {r: round(b / 1e6, 2) for r, b in reasons.most_common()},
            "kernels_1mb": big, "under_128_threads": small_blocks, "under_2_blocks_per_sm": few_blocks,
            "launches": launches, "one_unit_block_launches": one_warp,
            "launch_shapes": [{"kernels": n, **dict(shape)} for shape, n in shapes.items()],
            "plan_s": planned}


def _launch_shape(k, target) -> tuple:
    """What a kernel that misses the launch-shape bar is: its first op (the repeated layers' kernels
    share it), blocks, threads, units, modelled time and bound, and the most 128-thread blocks its
    tiling could make (units / units per 128 threads): below two per SM, the bar needs a finer
    tiling (a row or an output split over units), not a different block size."""
    prim, e = k.graph.prim, k.estimate
    per_128 = max(1, 128 // target.lanes_per_unit)
    first = k.ops[0].split("/")[-2:] if k.ops else [k.name]
    return tuple({"op": "/".join(first)[:40], "blocks": prim.num_blocks, "threads": prim.units_per_block * target.lanes_per_unit,
                  "units": prim.num_units, "mb": round(e.dram_bytes / 1e6, 2), "us": round(e.seconds * 1e6, 2),
                  "bound": e.bound, "blocks_of_128": prim.num_units // per_128}.items())


def ptx_counts(name: str, target_name: str, out: Path) -> dict:
    """Global loads and stores in the PTX `gir compile` writes: 128-bit ones against all."""
    from gir.cli import main
    folder = out / f"{name}_{target_name}"
    main(["compile", _model_file(name, out), "--target", target_name, "-o", str(folder), "--quiet"])
    text = "\n".join(p.read_text() for p in folder.rglob("*.ptx"))
    loads, stores = re.findall(r"\bld\.global[.\w]*", text), re.findall(r"\bst\.global[.\w]*", text)
    return {"loads": len(loads), "v4_loads": sum(".v4" in x for x in loads),
            "stores": len(stores), "v4_stores": sum(".v4" in x for x in stores)}


def kernel_facts(spec: str, target_name: str, limit: int) -> str:
    """One line of static facts of the kernel `MODEL:PREFIX` names (see the module docstring)."""
    from gir.backends.cuda.compiler import compile_cuda
    from gir.backends.cuda.emitter import CudaEmitter
    from gir.backends.kernels import split_kernels
    from gir.fusion.perf import estimate
    name, prefix = spec.split(":", 1)
    target = get_target(target_name)
    p = plan(load(models.build(name)), target, limit=limit)
    step = next((s for s in p.steps if getattr(s, "estimate", None) and s.name.startswith(prefix)), None)
    if step is None:
        raise SystemExit(f"gpu_static.py: {name} has no planned kernel named {prefix}...")
    g, emitter = step.graph, CudaEmitter(target)
    kernels = split_kernels(g)
    binary = compile_cuda(emitter.prelude() + "\n".join(emitter.kernel_source(k) for k in kernels), target.arch)
    registers = [getattr(binary.resources.get(k.name), "registers", None) for k in kernels]
    widths = sorted({vector_width(op, g.buffers) for _, op in g.ops()
                     if isinstance(op, Move) and DRAM in (g.buffers[op.src.buffer].level, g.buffers[op.dst.buffer].level)})
    e = estimate(g, registers_per_lane=max((r for r in registers if r), default=None))
    return (f"{name} {step.name[:60]}: launches (blocks, threads) {[(k.num_blocks, k.block_threads) for k in kernels]}, "
            f"DRAM access widths (elements per lane) {widths}, registers {registers}, occupancy {e.occupancy:.0%}, "
            f"bytes in flight {e.bytes_in_flight / 1e6:.2f} MB, modelled {e.seconds * 1e6:.1f} us for "
            f"{e.dram_bytes / 1e6:.2f} MB of DRAM")


def _model_file(name: str, out: Path) -> str:
    import onnx
    path = out / f"{name}.onnx"
    onnx.save(models.build(name), path)
    return str(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="+", default=["cuda:sm_90"])
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--out", help="write OUT.md and OUT.json")
    ap.add_argument("--ptx", nargs="*", default=[], help="models to compile for the first target and count PTX accesses of")
    ap.add_argument("--kernels", nargs="+", metavar="MODEL:PREFIX", help="only these kernels' static facts (first target)")
    ap.add_argument("--before", metavar="JSON", help="an earlier run's OUT.json (another tree): a before/after table")
    ap.add_argument("--before-label", default="before", help="what the earlier run was (a commit)")
    ap.add_argument("models", nargs="*", default=sorted(set(models.MODELS) - {"gpt2_b128"}))
    args = ap.parse_args()
    if args.kernels:
        for spec in args.kernels:
            print(kernel_facts(spec, args.targets[0], args.limit), flush=True)
        return
    rows, copies = [], {}
    for t in args.targets:
        copies[t] = copy_share(get_target(t))
        print(f"{t}: 64 MB device copy modelled at {copies[t][0]:.1%} of peak ({copies[t][1]})", flush=True)
        for name in args.models:
            r = measure(name, t, args.limit)
            rows.append(r)
            print(f"{name:16s} {t:7s} {r['kernels']:4d} kernels {r['modelled_us']:9.1f} us modelled, "
                  f"{r['modelled_peak_share']:.0%} of peak, {r['wide_share']:.0%} of {r['access_mb']:.1f} MB accesses wide, "
                  f"{len(r['under_128_threads'])}/{r['kernels_1mb']} big kernels under 128 threads, "
                  f"{len(r['under_2_blocks_per_sm'])} under 2 blocks/SM, {r['wide_share_allowed']:.0%} wide where allowed ({r['plan_s']:.1f} s)", flush=True)
    ptx = {}
    if args.ptx:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.ptx:
                ptx[name] = ptx_counts(name, args.targets[0], Path(tmp))
                print(f"PTX {name} {args.targets[0]}: {ptx[name]}", flush=True)
    if args.out:
        write(rows, copies, ptx, args)


def write(rows, copies, ptx, args):
    out = Path(args.out)
    head = (f"Produced by `PYTHONPATH=. python scripts/gpu_static.py --targets {' '.join(args.targets)} --out {args.out}"
            f"{' --ptx ' + ' '.join(args.ptx) if args.ptx else ''}"
            f"{f' --before {args.before} --before-label {args.before_label!r}' if args.before else ''}` on {time.strftime('%Y-%m-%d')} ({platform.machine()}, "
            f"no GPU). Every figure is modelled (gir/fusion/perf.py, constants in gir/ir/target.py) or static "
            f"(from the plan's GIR); none was measured on a GPU.\n")
    lines = [head, "## 64 MB device-to-device copy, as modelled\n", "| target | modelled share of peak | estimate |", "|---|---|---|"]
    lines += [f"| {t} | {s:.1%} | {e} |" for t, (s, e) in copies.items()]
    lines += ["", "## Zoo models\n",
              "| model | target | kernels | modelled us | DRAM MB | modelled share of peak | DRAM access MB | 16-byte share | "
              "16-byte share where the extent allows | "
              "kernels >= 1 MB | of which < 128 threads | of which < 2 blocks per SM | launches of one-unit blocks (32 threads on CUDA, 64 on HIP) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['target']} | {r['kernels']} | {r['modelled_us']:.1f} | {r['dram_mb']:.1f} | "
                     f"{r['modelled_peak_share']:.0%} | {r['access_mb']:.1f} | {r['wide_share']:.0%} | "
                     f"{r['wide_share_allowed']:.0%} of {r['allowed_mb']:.1f} MB | {r['kernels_1mb']} | "
                     f"{len(r['under_128_threads'])} | {len(r['under_2_blocks_per_sm'])} | "
                     f"{r['one_unit_block_launches']} of {r['launches']} |")
    lines += ["", "DRAM access MB: the bytes the kernels' DRAM Moves move, each unit's distinct elements once "
              "(gir/ir/vector_access.py `access_census`; a per-channel value every lane of a unit reads counts once "
              "per unit). Where the extent allows: leaving out the bytes of tensors whose innermost dimension is not "
              "a whole number of 16-byte vectors, unless a unit's elements form whole aligned vectors anyway "
              "(`extent_allows`: rows of 197 floats start at 4-byte offsets).",
              "", "## DRAM access bytes not moved by 16-byte accesses, by reason (MB)\n"]
    for r in rows:
        lines.append(f"- {r['model']} {r['target']}: " + (", ".join(f"{k} {v}" for k, v in r["narrow_mb_by_reason"].items()) or "none"))
    lines += ["", "## Kernels of 1 MB or more with small blocks or few blocks\n"]
    for r in rows:
        if r["under_128_threads"] or r["under_2_blocks_per_sm"]:
            lines.append(f"- {r['model']} {r['target']}: under 128 threads: {', '.join(r['under_128_threads']) or 'none'}; "
                         f"under 2 blocks per SM: {', '.join(r['under_2_blocks_per_sm']) or 'none'}")
    targets = [get_target(t) for t in args.targets]
    per_block = ", ".join(f"{max(1, 128 // t.lanes_per_unit)} on {t.name}" for t in targets)
    bar = ", ".join(f"{2 * t.processors} on {t.name}" for t in targets)
    lines += ["", "### The same kernels by launch shape\n",
              "Alike kernels (the repeated layers') counted once. Blocks of 128 at most: the 128-thread blocks the "
              f"kernel's tiling could make (its units, {per_block} to a block); where that is under two per "
              f"SM/CU ({bar}), no block size meets the bar without a finer tiling.\n",
              "| model | target | kernels | first op | blocks x threads | units | blocks of 128 at most | MB | modelled us | bound |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for s in sorted(r.get("launch_shapes", []), key=lambda s: -s["mb"]):
            lines.append(f"| {r['model']} | {r['target']} | {s['kernels']} | {s['op']} | {s['blocks']} x {s['threads']} | "
                         f"{s['units']} | {s['blocks_of_128']} | {s['mb']} | {s['us']} | {s['bound']} |")
    if args.before:
        lines += _before_after(json.loads(Path(args.before).read_text()), rows, ptx, args.before_label)
    if ptx:
        lines += ["", f"## PTX global accesses ({args.targets[0]}, `gir compile`)\n", "| model | loads | 128-bit loads | stores | 128-bit stores |", "|---|---|---|---|---|"]
        lines += [f"| {m} | {c['loads']} | {c['v4_loads']} | {c['stores']} | {c['v4_stores']} |" for m, c in ptx.items()]
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")
    Path(f"{out}.json").write_text(json.dumps({"rows": rows, "copy": {t: s for t, (s, _) in copies.items()}, "ptx": ptx}, indent=1) + "\n")


def _before_after(before: dict, rows: list[dict], ptx: dict, label: str) -> list[str]:
    """Per model and target, the earlier run's figures -> this run's."""
    old = {(r["model"], r["target"]): r for r in before["rows"]}
    arrow = lambda a, b, f: f"{f(a)} -> {f(b)}"  # noqa: E731
    pct = lambda x: f"{x:.0%}"  # noqa: E731
    lines = ["", f"## Before ({label}) and after\n",
             "| model | target | modelled us | 16-byte share | where the extent allows | big kernels under 128 threads | "
             "under 2 blocks per SM |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        b = old.get((r["model"], r["target"]))
        if b is None:
            continue
        lines.append(f"| {r['model']} | {r['target']} | {arrow(b['modelled_us'], r['modelled_us'], lambda x: f'{x:.1f}')} | "
                     f"{arrow(b['wide_share'], r['wide_share'], pct)} | "
                     f"{arrow(b.get('wide_share_allowed', 0.0), r['wide_share_allowed'], pct)} | "
                     f"{len(b['under_128_threads'])} -> {len(r['under_128_threads'])} of {r['kernels_1mb']} | "
                     f"{len(b['under_2_blocks_per_sm'])} -> {len(r['under_2_blocks_per_sm'])} |")
    for m, c in ptx.items():
        if m in before.get("ptx", {}):
            o = before["ptx"][m]
            lines.append(f"\nPTX {m}: 128-bit loads {o['v4_loads']} of {o['loads']} -> {c['v4_loads']} of {c['loads']}, "
                         f"128-bit stores {o['v4_stores']} of {o['stores']} -> {c['v4_stores']} of {c['stores']}.")
    return lines


if __name__ == "__main__":
    main()
