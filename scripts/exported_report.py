"""Table of the torch.onnx-exported models (models/exported/): per file its ops, the plan for
cuda:sm_90 (kernels, DRAM bytes against the compulsory bound) and the CPU target's max relative
error against PyTorch; then every op type found across the exports with its status in GIR.

    python scripts/exported_report.py [--out results/exported.md] [--only KEY ...] [--compile]

--compile also builds every kernel of every sm_90 plan with NVRTC (PTX and cubin), as
`gir compile --target cuda:sm_90` does.

Writes the markdown table and a .json beside it. Needs no PyTorch (the references are in the
.npz files). Relative error: max |gir - torch| / max |torch|, the worst output.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gir  # noqa: E402
from gir.frontend.decompose import REGISTRY  # noqa: E402
from gir.frontend.loader import DEFAULT_DOMAINS  # noqa: E402
from gir.fusion.plan import plan  # noqa: E402
from gir.ir import get_target  # noqa: E402
from models.exported_files import load_bound, manifest, reference, rel_err  # noqa: E402

TOLERANCE = 1e-4


def _one_line(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]


def measure(key: str, entry: dict, nvrtc: bool = False) -> dict:
    """Plan for cuda:sm_90 (and build it with NVRTC) and run on the CPU target; a failure is
    recorded, not raised."""
    row = {"key": key, "model": entry["model"], "exporter": entry["exporter"], "opset": entry["opset"],
           "nodes": entry["nodes"], "ops": [o.split("::")[1] for o in entry["ops"]], "kb": entry["bytes"] / 1024}
    try:
        start = time.perf_counter()
        result = plan(load_bound(entry), get_target("cuda:sm_90"), limit=2)
        row.update(plan_s=time.perf_counter() - start, kernels=len(result.kernels),
                   library=len(result.partition.library),
                   gir_bytes=sum(s.gir_bytes for s in result.subgraphs),
                   bound_bytes=sum(s.bound_bytes for s in result.subgraphs))
    except Exception as err:  # noqa: BLE001 - the table says what failed
        row["plan_error"] = _one_line(err)
    if nvrtc and "plan_error" not in row:
        from gir.build import build_steps
        try:
            start = time.perf_counter()
            built = build_steps(result)
            row.update(nvrtc_s=time.perf_counter() - start, nvrtc_kernels=sum(".cubin" in b.binaries for b in built))
        except Exception as err:  # noqa: BLE001
            row["nvrtc_error"] = _one_line(err)
    try:
        feeds, want = reference(entry)
        got = gir.Session(load_bound(entry), target="cpu").run(list(want), feeds)
        row["max_rel_err"] = max(rel_err(g, w) for g, w in zip(got, want.values()))
    except Exception as err:  # noqa: BLE001
        row["cpu_error"] = _one_line(err)
    return row


def op_status(rows: list[dict], entries: dict) -> list[dict]:
    """Each op type across the exports: whether GIR's frontend decomposes it, and in which files."""
    found: dict[str, list[str]] = {}
    for key, entry in entries.items():
        for op in entry["ops"]:
            found.setdefault(op, []).append(key)
    passed = {r["key"] for r in rows if "plan_error" not in r and r.get("max_rel_err", 1) < TOLERANCE}
    out = []
    for op, keys in sorted(found.items(), key=lambda kv: kv[0].split("::")[1]):
        domain, name = op.split("::")
        supported = domain in DEFAULT_DOMAINS and name in REGISTRY
        out.append({"op": name, "domain": domain, "supported": supported, "files": len(keys),
                    "files_passing": sum(k in passed for k in keys)})
    return out


def _mb(n) -> str:
    return f"{n / 1e6:.3f}"


def markdown(rows: list[dict], ops: list[dict], seconds: float) -> str:
    lines = [
        "# Exported models (torch.onnx)", "",
        f"`python scripts/exported_report.py`, {date.today()}, {platform.machine()} with "
        f"{__import__('os').cpu_count()} cores, {seconds:.0f} s. Files: `models/exported/` "
        "(`python scripts/export_models.py` regenerates them; PyTorch "
        f"{next(iter(manifest().values()))['torch']}). Exporters: dynamo (PyTorch's default, opset 18) and "
        "TorchScript (opset 17); symbolic batch/sequence dims bound to the reference inputs' sizes.",
        "DRAM columns: GIR's plan for cuda:sm_90 against the compulsory bound (each external input read "
        "once, each escaping output written once), memory-intensive part only. Error: the CPU target's "
        "max |gir - torch| / max |torch| over the outputs. At these tiny sizes every MatMul, Gemm and Conv "
        "falls below the ridge point and is planned as memory-intensive (0 library ops), so its products "
        "count in the DRAM columns. Plan s: wall seconds of the sm_90 plan on a shared machine. NVRTC "
        "(`--compile`): kernels built to cubin for sm_90 and the wall seconds it took (binaries come from "
        "the compile cache where an identical kernel was built before).", "",
        "| file | exporter | opset | KiB | nodes | op types | library ops | kernels | GIR MB | bound MB | GIR/bound "
        "| max rel err | plan s | NVRTC |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "plan_error" in r:
            plan_cells = ["-"] * 5 + ["-"]
        else:
            plan_cells = [str(r["library"]), str(r["kernels"]), _mb(r["gir_bytes"]), _mb(r["bound_bytes"]),
                          f"{r['gir_bytes'] / max(r['bound_bytes'], 1):.2f}x", None]
        err = f"{r['max_rel_err']:.1e}" if "max_rel_err" in r else "error"
        plan_s = f"{r['plan_s']:.1f}" if "plan_s" in r else "-"
        built = (f"{r['nvrtc_kernels']} cubins, {r['nvrtc_s']:.0f} s" if "nvrtc_s" in r
                 else "error" if "nvrtc_error" in r else "not run")
        cells = [r["key"], r["exporter"], str(r["opset"]), f"{r['kb']:.0f}", str(r["nodes"]), str(len(r["ops"])),
                 *plan_cells[:5], err, plan_s, built]
        lines.append("| " + " | ".join(cells) + " |")
    failures = [r for r in rows if "plan_error" in r or "cpu_error" in r or "nvrtc_error" in r]
    if failures:
        lines += ["", "Failures:", ""]
        lines += [f"- {r['key']}: " + "; ".join(r[k] for k in ("plan_error", "cpu_error", "nvrtc_error") if k in r) for r in failures]
    lines += ["", "## Op types per file", ""]
    lines += [f"- {r['key']}: {', '.join(r['ops'])}" for r in rows]
    lines += ["", "## Ops found across the exports", "",
              f"{len(ops)} op types; {sum(o['supported'] for o in ops)} supported by GIR's frontend.", "",
              "| op | domain | status | files holding it | of those, passing |", "|---|---|---|---:|---:|"]
    lines += [f"| {o['op']} | {o['domain']} | {'supported' if o['supported'] else 'not supported'} | {o['files']} "
              f"| {o['files_passing']} |" for o in ops]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "exported.md"))
    ap.add_argument("--only", nargs="+", metavar="KEY", help="files by manifest key (e.g. bert_dynamo)")
    ap.add_argument("--compile", action="store_true", help="also build every sm_90 kernel with NVRTC")
    args = ap.parse_args(argv)
    entries = manifest()
    keys = args.only or list(entries)
    unknown = [k for k in keys if k not in entries]
    if unknown:
        print(f"exported_report: unknown key(s) {', '.join(unknown)}; keys are {', '.join(entries)}", file=sys.stderr)
        return 1
    start, rows = time.perf_counter(), []
    for key in keys:
        rows.append(measure(key, entries[key], args.compile))
        r = rows[-1]
        print(f"{key:<28} kernels {r.get('kernels', '-')!s:>4}  err {r.get('max_rel_err', float('nan')):.1e}  "
              f"{r.get('plan_error', '') or r.get('cpu_error', '')}", flush=True)
    ops = op_status(rows, {k: entries[k] for k in keys})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(rows, ops, time.perf_counter() - start))
    out.with_suffix(".json").write_text(json.dumps({"files": rows, "ops": ops}, indent=1) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
