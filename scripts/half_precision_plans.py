"""cuda:sm_90 plans of the zoo in fp32, fp16 and bf16 (models.build(name, dtype=...)): what the
partition sends to the library at each dtype's ridge point, the DRAM bytes GIR's kernels move
(the plan's modelled footprint, as `gir explain --json` reports it per subgraph) and the library
ops' operand and result bytes, and the share of the kernels' DRAM access bytes (each unit's
distinct elements) that move in 16-byte (128-bit) accesses. Static: planned here, no GPU.

    PYTHONPATH=. python scripts/half_precision_plans.py [--tiny] [--limit 2] [--out FILE] [MODEL ...]

At the half types' ridge point (the matrix peak) more matmuls are memory-bound and lowered into
GIR; their broadcast operands can exceed the planner's tensor limit ($GIR_MAX_TENSOR_ELEMENTS).

Writes a markdown table (default results/half_precision_plans.md) and the rows as JSON next to it.
"""
import argparse
import json
import os
import platform
import time
from datetime import date

import models
from gir.frontend import load
from gir.frontend.basic import BasicOp
from gir.frontend.errors import one_line
from gir.fusion.plan import plan
from gir.ir.dtypes import itemsize
from gir.ir.target import get_target
from gir.ir.vector_access import access_census

DTYPES = ("fp32", "fp16", "bf16")


def measure(name: str, dtype: str, tiny: bool, target_name: str, limit: int) -> dict:
    graph = load(models.build(name, tiny=tiny, dtype=dtype))
    start = time.perf_counter()
    p = plan(graph, get_target(target_name), limit=limit)
    planned = time.perf_counter() - start
    census = [access_census(k.graph) for k in p.kernels]
    access, wide, allowed = (sum(c[key] for c in census) for key in ("total", "wide", "allowed"))
    narrow: dict[str, int] = {}
    for c in census:
        for why, n in c["narrow"].items():
            narrow[why] = narrow.get(why, 0) + n
    library = [s for s in p.steps if isinstance(s, BasicOp)]
    t = p.graph.tensors  # the plan's graph: an absorbed bias is a new constant there
    library_bytes = sum(t[x].size * itemsize(t[x].dtype) for s in library for x in [*s.inputs, *s.outputs])
    return {"model": name, "dtype": dtype, "library_ops": len(library),
            "library_kinds": sorted({s.kind for s in library}), "kernels": len(p.kernels),
            "gir_dram_bytes": sum(k.estimate.dram_bytes for k in p.kernels), "library_bytes": library_bytes,
            "access_bytes": access, "wide_share": wide / access if access else 0.0,
            "allowed_bytes": allowed, "wide_share_allowed": wide / allowed if allowed else 0.0,
            "narrow_mb_by_reason": {k: round(v / 1e6, 2) for k, v in sorted(narrow.items(), key=lambda kv: -kv[1])},
            "plan_s": planned}


def table(rows: list[dict], tiny: bool, target: str, limit: int) -> str:
    base = {r["model"]: r for r in rows if r["dtype"] == "fp32" and "error" not in r}
    lines = [f"# Zoo plans for {target} in fp32, fp16 and bf16 ({'tiny' if tiny else 'full size'})", "",
             "| model | dtype | library ops | GIR kernels | GIR DRAM MB | vs fp32 | library op MB | vs fp32 | "
             "DRAM access MB | 128-bit share | where the extent allows | plan s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['dtype']} | failed: {r['error']} | | | | | | | | | |")
            continue
        b = base.get(r["model"])
        ratio = lambda key: f"{r[key] / b[key]:.2f}" if b and b[key] else "-"  # noqa: E731
        lines.append(f"| {r['model']} | {r['dtype']} | {r['library_ops']} | {r['kernels']} | "
                     f"{r['gir_dram_bytes'] / 1e6:.2f} | {ratio('gir_dram_bytes')} | {r['library_bytes'] / 1e6:.2f} | "
                     f"{ratio('library_bytes')} | {r['access_bytes'] / 1e6:.1f} | {r['wide_share']:.0%} | "
                     f"{r['wide_share_allowed']:.0%} of {r['allowed_bytes'] / 1e6:.1f} MB | {r['plan_s']:.1f} |")
    lines += ["", f"gir.fusion.plan.plan(graph, {target}, limit={limit}). GIR DRAM MB: the kernels' modelled DRAM "
              "footprint (sum of kernel estimates' dram_bytes); library op MB: operands and results of the ops the "
              "partition leaves to the library (cuBLASLt), each counted once per op; DRAM access MB: bytes the "
              "kernels' DRAM Moves move, each unit's distinct elements once (a per-channel operand every lane "
              "reads counts one element per unit; re-reads by several units counted); 128-bit share: of those, "
              "the bytes moved by 16-byte "
              "vector accesses (gir/ir/vector_access.py); where the extent allows: the same share leaving out "
              "tensors whose innermost dimension is not a whole number of 16-byte vectors (`extent_allows`). "
              "Static figures, no GPU. "
              f"{platform.machine()}, {os.cpu_count()} cores (shared), {date.today().isoformat()}.", ""]
    lines += ["## Bytes not moved 16 bytes at a time, by reason (MB)", ""]
    lines += [f"- {r['model']} {r['dtype']}: " + (", ".join(f"{k} {v}" for k, v in r["narrow_mb_by_reason"].items()) or "none")
              for r in rows if "error" not in r]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(models.MODELS))
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--target", default="h100")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    out = args.out or f"results/half_precision_plans{'_tiny' if args.tiny else ''}.md"
    rows = []
    for name in args.models:
        for dtype in DTYPES:
            try:
                rows.append(measure(name, dtype, args.tiny, args.target, args.limit))
            except Exception as err:  # noqa: BLE001 -- a row saying why; the others still run
                rows.append({"model": name, "dtype": dtype, "error": f"{type(err).__name__}: {one_line(err)[:300]}"})
                print(f"{name} {dtype}: {rows[-1]['error']}", flush=True)
                continue
            r = rows[-1]
            print(f"{name} {dtype}: {r['gir_dram_bytes'] / 1e6:.2f} MB, {r['wide_share']:.0%} wide, "
                  f"{r['library_ops']} library ops, {r['plan_s']:.1f} s", flush=True)
            with open(os.path.splitext(out)[0] + ".json", "w") as f:
                json.dump(rows, f, indent=1)
    text = table(rows, args.tiny, "cuda:sm_90 (H100)" if args.target == "h100" else args.target, args.limit)
    with open(out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
