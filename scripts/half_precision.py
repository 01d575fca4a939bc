"""The zoo in half precision on a target (the CPU by default): each model built with fp16 and with bf16 weights
and activations (`models.build(name, dtype=...)`, models/half.py: LayerNorm and softmax in fp32
between Casts) runs through gir.Session (target cpu, native engine, or --target cuda:sm_90 on a GPU: cuBLASLt and
cuDNN in half precision) and is compared with the fp32
model in onnxruntime on the same seeded inputs (rounded to the half type for GIR).

Error per model: the worst over its outputs of max |gir - ort| / max |ort| of that output (relative
to the largest reference magnitude, as scripts/check_zoo.py). For scale, two parts of it measured
alone in onnxruntime's fp32 model: "inputs only" feeds it the inputs rounded to the half type,
"weights only" rounds the initializers the half model stores in the half type (and back to fp32). What the half
model adds beyond those is the rounding of every stored activation. "onnxruntime fp16" is the same
error of onnxruntime running the fp16 model itself (an independent half-precision implementation;
onnxruntime has no CPU kernels for bf16 Conv or Add, so none for bf16).

    PYTHONPATH=. python scripts/half_precision.py [--tiny] [--dtype fp16 bf16] [--reference]
        [--target cpu] [--runs N] [--out FILE] [MODEL ...]

--runs N also times the half session and the fp32 model's session on the same target (median of
N runs after one warm-up, host to host as Session.run is).

--reference also runs the half model through GIR's frontend numpy reference (gir.frontend.
run_reference: every ONNX op's result rounded to the half type, the semantics GIR's kernels
implement, with no kernels involved) and reports its error and GIR's distance from it.

Writes a markdown table (default results/half_precision.md, results/half_precision_tiny.md with
--tiny) and the same rows as JSON next to it. A model that fails gets a row saying why.
"""
import argparse
import json
import os
import platform
import time
from datetime import date

import numpy as np
import onnxruntime as ort

import gir
import models
from check_zoo import median_ms
from gir.frontend.errors import one_line
from models.half import HALF, _round
from onnx import TensorProto, numpy_helper

EXPECTED = {"fp16": 1e-3, "bf16": 1e-2}  # the expectation, order of magnitude


def rel_error(got: list, want: list) -> float:
    return max(float(np.abs(np.asarray(g, np.float64) - w).max()) / max(float(np.abs(w).max()), 1e-30)
               for g, w in zip(got, want))


def weights_rounded(model, half):
    """The fp32 model with the float initializers the half model holds in a half type rounded to
    it and back (LayerNorm's scale and bias stay fp32 in both)."""
    rounded = {t.name: numpy_helper.to_array(t) for t in half.graph.initializer
               if t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)}
    m = type(model)()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT and t.name in rounded:
            t.CopyFrom(numpy_helper.from_array(rounded[t.name].astype("float32"), t.name))
    return m


def half_feeds(feeds: dict, dtype: np.dtype) -> dict:
    return {k: v.astype(dtype) if v.dtype == np.float32 else v for k, v in feeds.items()}


def run_one(name: str, tiny: bool, precisions: list[str], limit: int, reference: bool = False,
            target: str = "cpu", runs: int = 0) -> list[dict]:
    fp32 = models.build(name, tiny=tiny)
    feeds = models.example_inputs(fp32, 0)
    ref = ort.InferenceSession(fp32.SerializeToString(), providers=["CPUExecutionProvider"])
    want = [np.asarray(w, np.float64) for w in ref.run(None, feeds)]
    fp32_ms = None
    if runs:
        try:
            fp32_session = gir.Session(fp32, target=target, limit=limit)
            fp32_ms = median_ms(lambda: fp32_session.run(None, feeds), runs)
        except Exception as err:  # noqa: BLE001 -- the half rows still run
            print(f"{name} fp32: {type(err).__name__}: {one_line(err)[:200]}", flush=True)
    rows = []
    for p in precisions:
        row = {"model": name, "dtype": p, "target": target}
        try:
            dtype = HALF[p][1]
            hfeeds = half_feeds(feeds, dtype)
            rounded = {k: v.astype(np.float32) if v.dtype == dtype else v for k, v in hfeeds.items()}
            row["inputs_only"] = rel_error(ref.run(None, rounded), want)
            half = models.build(name, tiny=tiny, dtype=p)
            wref = ort.InferenceSession(weights_rounded(fp32, half).SerializeToString(), providers=["CPUExecutionProvider"])
            row["weights_only"] = rel_error(wref.run(None, feeds), want)
            del wref
            ort_half = None
            if p == "fp16":
                oh = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
                ort_half = [np.asarray(o, np.float64) for o in oh.run(None, hfeeds)]
                row["ort_half"] = rel_error(ort_half, want)
                del oh
            start = time.perf_counter()
            session = gir.Session(half, target=target, limit=limit)
            row["session_s"] = time.perf_counter() - start
            got = session.run(None, hfeeds)
            assert all(g.dtype == dtype for g in got if g.dtype.kind != "i"), [g.dtype for g in got]
            row["rel_err"] = rel_error(got, want)
            if ort_half is not None:
                row["gir_vs_ort_half"] = rel_error(got, ort_half)
            if reference:
                from gir.frontend import load, run_reference
                env = run_reference(load(half), hfeeds)
                ref_out = [np.asarray(env[o.name], np.float64) for o in half.graph.output]
                row["reference"] = rel_error(ref_out, want)
                row["gir_vs_reference"] = rel_error(got, ref_out)
            row["per_output"] = {o.name: rel_error([g], [w]) for o, g, w in zip(session.get_outputs(), got, want)}
            row["library"] = session.library_path
            if runs:
                row["ms"], row["fp32_ms"] = median_ms(lambda: session.run(None, hfeeds), runs), fp32_ms
        except Exception as err:  # noqa: BLE001 -- one row per failure, the others still run
            row["error"] = f"{type(err).__name__}: {one_line(err)[:200]}"
        print(f"{name} {p}: {row.get('rel_err', row.get('error'))}", flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict], tiny: bool, limit: int, target: str = "cpu") -> str:
    lines = [f"# The zoo in half precision on the {'CPU' if target == 'cpu' else target} target against fp32 onnxruntime "
             f"({'tiny' if tiny else 'full size'})",
             "", "| model | dtype | max rel err | inputs only | weights only | onnxruntime fp16 | GIR vs onnxruntime fp16 | within ~expected | worst output | session s |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['dtype']} | failed: {r['error']} | | | | | | | |")
            continue
        worst = max(r["per_output"], key=r["per_output"].get)
        ok = "yes" if r["rel_err"] <= 3 * EXPECTED[r["dtype"]] else "no"
        lines.append(f"| {r['model']} | {r['dtype']} | {r['rel_err']:.3g} | {r['inputs_only']:.3g} | {r['weights_only']:.3g} | "
                     f"{format(r['ort_half'], '.3g') if 'ort_half' in r else '-'} | "
                     f"{format(r['gir_vs_ort_half'], '.3g') if 'gir_vs_ort_half' in r else '-'} | {ok} | "
                     f"{worst} | {r['session_s']:.1f} |")
    timed = [r for r in rows if "ms" in r]
    if timed:
        lines += ["", "| model | dtype | half ms | fp32 ms | half/fp32 |", "|---|---|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['dtype']} | {r['ms']:.3f} | "
                  + (f"{r['fp32_ms']:.3f} | {r['ms'] / r['fp32_ms']:.2f} |" if r.get("fp32_ms") else "- | - |")
                  for r in timed]
    library = sorted({r["library"] for r in rows if r.get("library")})
    lines += ["", f"gir.Session(half model, target={target!r}, limit={limit}) ({'; '.join(library) or 'no library'}); onnxruntime "
              f"{ort.__version__} CPUExecutionProvider on the fp32 model. Inputs: models.example_inputs(seed 0), "
              "rounded to the half type for GIR. max rel err: worst output's max |gir - ort| / max |ort|. "
              "inputs only: the fp32 model in onnxruntime on the rounded inputs, same measure; weights only: the fp32 "
              "model with its weights rounded to the half type, on the fp32 inputs; onnxruntime fp16: onnxruntime running "
              "the fp16 model on the rounded inputs, same measure; GIR vs onnxruntime fp16: GIR's output against that one. within ~expected: "
              "at most 3x the issue's expectation (1e-3 fp16, 1e-2 bf16). "
              f"{platform.machine()}, {os.cpu_count()} cores (shared), {date.today().isoformat()}.", ""]
    return "\n".join(lines)


def reference_table(rows: list[dict]) -> str:
    lines = ["", "## Against GIR's numpy reference (per-op rounding, no kernels)", "",
             "| model | dtype | GIR vs fp32 onnxruntime | reference vs fp32 onnxruntime | GIR vs reference |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['dtype']} | {r['rel_err']:.3g} | {r['reference']:.3g} | {r['gir_vs_reference']:.3g} |"
              for r in rows if "reference" in r]
    return "\n".join(lines + ["", "Same error measure as above; the reference is gir.frontend.run_reference on the half "
                              "model (numpy, each op's result rounded to the half type, MatMul/Conv accumulating in fp32).", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(models.MODELS))
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--dtype", nargs="+", choices=list(HALF), default=list(HALF))
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--reference", action="store_true", help="also run GIR's frontend numpy reference")
    ap.add_argument("--target", default="cpu", help="where the half sessions run (cpu, cuda:sm_90, ...)")
    ap.add_argument("--runs", type=int, default=0, help="also time half and fp32 sessions (median of N runs)")
    args = ap.parse_args()
    out = args.out or f"results/half_precision{'_tiny' if args.tiny else ''}.md"
    rows = []
    for name in args.models:  # written after each model: a run cut short keeps what it measured
        rows += run_one(name, args.tiny, args.dtype, args.limit, args.reference, args.target, args.runs)
        text = table(rows, args.tiny, args.limit, args.target) + (reference_table(rows) if args.reference else "")
        with open(out, "w") as f:
            f.write(text)
        with open(os.path.splitext(out)[0] + ".json", "w") as f:
            json.dump(rows, f, indent=1, default=str)
    print(text)


if __name__ == "__main__":
    main()
