"""Everything `gir compile` writes, as {path relative to the output folder: bytes}: per kernel
step its source, binaries, GIR text and Graphviz DOT; plan.json (docs/PLAN_JSON.md);
explain.json; the report (report.md, report.html, report/*.svg).

Why one mapping and not files written along the way: the compile cache stores it whole, so a
second compile of the same model writes exactly the same bytes without planning or building.
"""
from __future__ import annotations

import json

from gir.build import build_steps, source_suffix
from gir.ir import to_dot, to_text
from gir.report import report_files


def compile_outputs(graph, result, explain: dict, jobs: int = 1, on_built=None) -> dict[str, bytes]:
    """`graph`: the loaded model; `result`: its plan; `explain`: what `gir explain --json` prints."""
    target = result.target
    suffix = source_suffix(target)
    built = {b.index: b for b in build_steps(result, jobs, on_built)}
    files, steps = {}, []
    for i, step in enumerate(result.steps):
        if i not in built:
            steps.append({"kind": "library", "op": step.kind, "name": step.name, "inputs": step.inputs,
                          "outputs": step.outputs, **_epilogue(step)})
            continue
        stem, source = f"kernels/k{i:03d}", f"kernels/k{i:03d}{suffix}"
        files[stem + ".gir.txt"] = (to_text(step.graph) + "\n").encode()
        files[stem + ".dot"] = (to_dot(step.graph) + "\n").encode()
        files[source] = built[i].source.encode()
        files.update({stem + ext: data for ext, data in built[i].binaries.items()})
        steps.extend({"kind": "launch", "step": step.name, "kernel": launch["kernel"], "source": source, **launch}
                     for launch in built[i].launches)
    buffers = {n: {"shape": list(t.shape), "dtype": t.dtype} for n, t in graph.tensors.items() if t.value is None}
    files["plan.json"] = json.dumps({"model": graph.model_name, "target": target.name, "arch": target.arch,
                                     "aliases": result.aliases, "buffers": buffers, "steps": steps}, indent=1).encode()
    files["explain.json"] = json.dumps(explain, indent=1).encode()
    files.update(report_files(result))
    return files


def _epilogue(step) -> dict:
    """A library step's absorbed epilogue (gir/fusion/epilogue.py), {} for none: `bias` (a
    matmul's third input is its bias) and `epilogue`, the steps after it in order."""
    if not step.attrs.get("absorbed"):
        return {}
    return {"bias": bool(step.attrs.get("bias")),
            "epilogue": [{"kind": k, "alpha": a, "beta": b} if k != "residual" else {"kind": k, "input": int(a)}
                         for k, a, b in step.attrs.get("epilogue", ())]}
