"""The compile report: `report.md` (tables, links to the pictures) and `report.html` (the same
with the pictures inline), from a plan. One list of blocks feeds both, so they never disagree.

What it answers: where each op went (library or GIR, and why), how many DRAM bytes each fused
subgraph moves against one kernel per op and against the compulsory bound, which kernels were
formed, their modelled time, and which rewrite rules did the work; pictures show the partition
and each kernel's GIR before and after rewriting.
"""
from __future__ import annotations

from collections import Counter
from html import escape

from gir.ir.vector_access import wide_share

from .pictures import gir_svg, partition_svg


def report_files(plan) -> dict[str, bytes]:
    """{path relative to the output folder: contents}: report.md, report.html, report/*.svg."""
    blocks = _blocks(plan)
    files = {path: svg.encode() for kind, *rest in blocks if kind == "pictures" for path, svg, _ in rest[0]}
    files["report.md"] = _markdown(blocks).encode()
    files["report.html"] = _html(blocks, f"GIR report: {plan.graph.model_name}").encode()
    return files


def _blocks(plan) -> list[tuple]:
    subs, kernels = plan.subgraphs, plan.kernels
    unfused, gir, bound = (sum(getattr(s, f) for s in subs) for f in ("unfused_bytes", "gir_bytes", "bound_bytes"))
    blocks = [
        ("h", 1, f"GIR report: {plan.graph.model_name} on {plan.target.name} ({plan.target.arch})"),
        ("table", ["library calls", "fused subgraphs", "GIR kernels", "launches", "DRAM bytes one kernel per op",
                   "DRAM bytes GIR", "DRAM bytes bound", "modelled GIR time (us)"],
         [[len(plan.partition.library), len(subs), len(kernels), sum(k.estimate.kernels for k in kernels),
           unfused, gir, bound, _us(sum(k.estimate.seconds for k in kernels))]]),
        ("h", 2, "Partition"),
        ("p", "Matmuls and convolutions go to the vendor library when their FLOP per DRAM byte reaches the "
              "target's ridge point; the rest is lowered into basic operators and fused. Blue: library calls, "
              "orange: fused subgraphs; arrows are tensors."),
        ("pictures", [("report/partition.svg", partition_svg(plan), "partition")]),
        ("p", "A library call's epilogue: the bias add, activations and residual add right after it that the "
              "target's library runs as part of the call (oneDNN post-ops on the CPU); those ops leave the fused "
              "subgraphs."),
        ("table", ["op", "placed", "epilogue", "reason"],
         [[d.op, "library" if d.library else "GIR", getattr(d, "epilogue", ""), d.reason.split("; epilogue: ")[0]]
          for d in plan.partition.decisions]),
        ("h", 2, "Fused subgraphs"),
        ("table", ["subgraph", "ops", "kernels", "launches", "DRAM one kernel per op", "DRAM GIR", "DRAM bound",
                   "GIR / bound", "modelled (us)"],
         [[i, len(s.ops), len(s.kernels), sum(k.estimate.kernels for k in s.kernels), s.unfused_bytes, s.gir_bytes,
           s.bound_bytes, f"{s.gir_bytes / max(s.bound_bytes, 1):.2f}", _us(sum(k.estimate.seconds for k in s.kernels))]
          for i, s in enumerate(subs)]),
        ("h", 2, "Rewrite rules"),
        ("table", ["rule", "applications", "DRAM bytes saved"], _rule_rows(kernels)),
        ("h", 2, "Kernels"),
    ]
    for i, sub in enumerate(subs):
        blocks.append(("h", 3, f"Subgraph {i}"))
        blocks.append(("table", ["kernel", "ops", "launches", "modelled (us)", "modelled share of peak DRAM bandwidth",
                                 "bound by", "threads per block", "wide DRAM access bytes", "DRAM bytes", "rules applied"],
                       [[_short(k.name), len(k.ops), k.estimate.kernels, _us(k.estimate.seconds),
                         f"{k.estimate.bandwidth_share(plan.target):.0%}", k.estimate.bound,
                         k.graph.prim.units_per_block * plan.target.lanes_per_unit, f"{wide_share(k.graph):.0%}",
                         k.estimate.dram_bytes, len(k.log)] for k in sub.kernels]))
        for j, k in enumerate(sub.kernels):
            stem = f"report/s{i:03d}_k{j:02d}"
            blocks.append(("pictures", [(f"{stem}_before.svg", gir_svg(k.before, f"before rewriting: {k.name}"),
                                         f"{_short(k.name)}: GIR before rewriting"),
                                        (f"{stem}_after.svg", gir_svg(k.graph, f"after rewriting: {k.name}"),
                                         f"{_short(k.name)}: GIR after rewriting")]))
    return blocks


def _rule_rows(kernels) -> list[list]:
    count, saved = Counter(), Counter()
    for k in kernels:
        for step in k.log:
            count[step.rule] += 1
            saved[step.rule] += step.dram_before - step.dram_after
    return [[rule, n, saved[rule]] for rule, n in count.most_common()]


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}"


def _short(name: str, limit: int = 80) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "…"


def _markdown(blocks) -> str:
    out = []
    for kind, *rest in blocks:
        if kind == "h":
            out.append("#" * rest[0] + " " + rest[1])
        elif kind == "p":
            out.append(rest[0])
        elif kind == "table":
            header, rows = rest
            out.append("\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                                 + ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]))
        elif len(rest[0]) == 1:  # a picture on its own is shown; pairs of kernel pictures are linked
            path, _, caption = rest[0][0]
            out.append(f"![{caption}]({path})")
        else:
            out.append(" · ".join(f"[{caption}]({path})" for path, _, caption in rest[0]))
    return "\n\n".join(out) + "\n"


def _html(blocks, title: str) -> str:
    out = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{escape(title)}</title><style>"
           "body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;margin:1em 0}"
           "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px} figure{display:inline-block;"
           "vertical-align:top;margin:0 1em 1em 0} .pics{overflow-x:auto}</style></head><body>"]
    for kind, *rest in blocks:
        if kind == "h":
            out.append(f"<h{rest[0]}>{escape(rest[1])}</h{rest[0]}>")
        elif kind == "p":
            out.append(f"<p>{escape(rest[0])}</p>")
        elif kind == "table":
            header, rows = rest
            out.append("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
                       + "</table>")
        else:
            figures = "".join(f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"
                              for _, svg, caption in rest[0])
            if len(rest[0]) == 1:
                out.append(f"<div class='pics'>{figures}</div>")
            else:
                out.append(f"<details><summary>{escape(rest[0][0][2].rsplit(':', 1)[0])}: GIR before and after "
                           f"rewriting</summary><div class='pics'>{figures}</div></details>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
