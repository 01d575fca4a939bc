"""RedNet-50 in two forms, planned for cuda:sm_90: the zoo's hand-built involution unfold
(Pad + K*K Slice + Concat, models/rednet50.py) and the one torch's TorchScript exporter writes
for nn.Unfold (Pad + Gather with constant window indices + Transpose,
scripts/export_involution.py). Writes results/involution_forms.md.

    python scripts/involution_forms.py [--tiny] [--exported FILE.onnx]

Without --exported, the exported form is made now (needs torch); FILE.onnx skips that.
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import onnx  # noqa: E402

import models.rednet50 as rednet50  # noqa: E402
from gir.frontend import load  # noqa: E402
from gir.fusion.plan import plan  # noqa: E402
from gir.ir import get_target  # noqa: E402


def measure(form: str, model) -> dict:
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    graph = load(proto)
    start = time.perf_counter()
    result = plan(graph, get_target("cuda:sm_90"), limit=2)
    return {"form": form, "nodes": len(proto.graph.node), "unfold ops": ", ".join(
                f"{k} {ops[k]}" for k in ("Pad", "Slice", "Concat", "Gather", "Transpose") if ops[k]),
            "gathers left": sum(op.kind == "gather" for op in graph.ops), "kernels": len(result.kernels),
            "gir": sum(s.gir_bytes for s in result.subgraphs), "bound": sum(s.bound_bytes for s in result.subgraphs),
            "plan_s": time.perf_counter() - start}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny configuration (as CI tests it)")
    ap.add_argument("--exported", help="the exported form, already written by scripts/export_involution.py")
    ap.add_argument("--baseline", action="store_true",
                    help="add a row: the exported form with its constant gathers kept as index gathers "
                         "(what GIR did before constant affine Gathers became views)")
    ap.add_argument("--out", default=str(ROOT / "results" / "involution_forms.md"))
    args = ap.parse_args(argv)
    cfg = rednet50.TINY if args.tiny else rednet50.FULL
    exported = args.exported
    if exported is None:
        from export_involution import export
        exported = str(Path(tempfile.mkdtemp()) / "rednet_exported.onnx")
        export(cfg, Path(exported), None)
    rows = [measure("hand-built (zoo: Slice + Concat)", rednet50.build(tiny=args.tiny)),
            measure("exported (torch nn.Unfold: Gather)", exported)]
    if args.baseline:
        import gir.frontend.decompose.layout as layout
        layout.affine_strides = lambda values: None  # every constant Gather stays an index gather
        rows.append(measure("exported, gathers kept as index gathers (before)", exported))
    ratio = rows[1]["gir"] / rows[0]["gir"]
    size = f"{'tiny' if args.tiny else 'RedNet-50'} ({cfg['image']}x{cfg['image']}, batch {cfg['batch']})"
    lines = [f"# RedNet involution: exported form against hand-built form, {size}, cuda:sm_90", "",
             "GIR DRAM bytes of every memory-intensive subgraph of the plan (library ops excluded), "
             "against the compulsory bound. Command: `python scripts/involution_forms.py"
             + (" --tiny" if args.tiny else "") + (" --baseline" if args.baseline else "") + "`.", "",
             "| form | ONNX nodes | unfold ops | gathers after decomposition | GIR kernels | GIR DRAM MB | bound MB | plan s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['form']} | {r['nodes']} | {r['unfold ops']} | {r['gathers left']} | {r['kernels']} | "
                     f"{r['gir'] / 1e6:.1f} | {r['bound'] / 1e6:.1f} | {r['plan_s']:.0f} |")
    lines += ["", f"Exported / hand-built DRAM bytes: **{ratio:.3f}x** (goal: within 1.2x).", ""]
    text = "\n".join(lines)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0 if ratio <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
