"""The benchmark suite: for every zoo model, what GIR makes of it and how fast it runs.

    PYTHONPATH=. python3 scripts/bench.py [--models NAME ...] [--tiny] [--runs 10] [--target cuda:sm_90]
        [--limit 2] [--skip-compile] [--skip-subgraphs] [--gpu] [--out results/bench]

Per model: ONNX nodes and basic operators, library ops, memory-intensive subgraphs and fused
kernels, DRAM bytes one-kernel-per-op / GIR / compulsory bound for --target (plan_model.py),
`gir compile` cold and warm in fresh processes with a fresh compile cache (bench_compile_cache.py),
and CPU latency of gir.Session against onnxruntime on the same inputs in the same run, with
the worst relative error (check_zoo.py). A second table times each model's memory-intensive
regions alone, cut out as ONNX models (bench_regions.py). `--gpu` adds scripts/bench_gpu.py's
measurements (needs an NVIDIA GPU and PyTorch; without them it exits with status 3 and one line).
Prints the table as it goes (progress on stderr); writes OUT.json and OUT.md.
"""
import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime

import onnx
import onnxruntime as ort

import bench_regions
import models
from bench_compile_cache import CompileFailed, compile_once, snapshot_gir
from check_zoo import TOLERANCE, compare, failure
from plan_model import measure
from perf_model_rank import cpu_name

SEVEN = [n for n in models.MODELS if n != "gpt2_b128"]  # gpt2_b128: the batch-128 variant of gpt2
TOP_REGIONS = 3
TOP_KERNELS = 5
EXIT_NO_GPU = 3  # gir's exit status for a missing toolchain

COLUMNS = ("model", "ONNX nodes", "basic ops", "library ops", "subgraphs", "kernels", "one-kernel-per-op MB",
           "GIR MB", "bound MB", "GIR/bound", "compile cold s", "compile warm s", "GIR CPU ms", "ORT CPU ms",
           "GIR/ORT", "max rel err")
REGION_COLUMNS = ("model", "regions", "distinct", "skipped", "GIR CPU ms", "ORT CPU ms", "GIR/ORT", "max rel err")
TOP_COLUMNS = ("model", "region (first node .. last node)", "nodes", "copies", "GIR ms each", "ORT ms each", "GIR/ORT")


def progress(name: str, text: str) -> None:
    print(f"[{name}] {text}", file=sys.stderr, flush=True)


@contextmanager
def phase(row: dict, label: str):
    """Adds the seconds the block took to row["phase_seconds"], to show where a run's time goes."""
    start = time.perf_counter()
    yield
    row.setdefault("phase_seconds", {})[label] = round(time.perf_counter() - start, 1)


def bench_model(name: str, args, work: str, gpu) -> dict:
    row = {"model": name}
    with phase(row, "build"):
        model = models.load_bundled(name) if args.tiny else models.build(name)
        feeds = models.example_inputs(model, 0)
    row["onnx_nodes"] = len(model.graph.node)
    with phase(row, "plan"):
        row.update(measure(name, args.target, args.limit, model))
    progress(name, f"planned for {args.target} in {row['plan_seconds']} s")
    if not args.skip_compile:
        with phase(row, "compile"):
            row.update(compile_times(name, model, args, work))
    with phase(row, "cpu"):
        cpu, session = compare(model, feeds, args.runs, args.limit)
    row.update(gir_ms=cpu["gir_ms"], ort_ms=cpu["ort_ms"], gir_over_ort=cpu["gir_ms"] / cpu["ort_ms"],
               max_rel_err=cpu["rel"], matches=cpu["rel"] < TOLERANCE, cpu_kernels=cpu["kernels"])
    progress(name, f"CPU: GIR {cpu['gir_ms']:.2f} ms, onnxruntime {cpu['ort_ms']:.2f} ms, max rel err {cpu['rel']:.2g}")
    if not args.skip_subgraphs:
        with phase(row, "regions"):
            row["regions"] = time_regions(name, model, session.plan.partition, feeds, args)
    del session
    if gpu:
        with phase(row, "gpu"):
            row["gpu"] = gpu_numbers(gpu, model, feeds, args)
    return row


def gpu_numbers(gpu, model, feeds: dict, args, path: str | None = None) -> dict:
    try:
        return gpu.measure(model, feeds, args.target, args.limit, path)
    except Exception as err:  # noqa: BLE001 -- the CPU numbers of the model still stand
        return {"error": failure(err)}


def compile_times(name: str, model, args, work: str) -> dict:
    """`gir compile` twice in fresh processes sharing a compile cache that starts empty."""
    path = os.path.join(work, f"{name}.onnx")
    onnx.save(model, path)
    try:
        cold, warm = (compile_once(path, args.target, 1, work, f"cache-{name}", args.limit) for _ in range(2))
    except CompileFailed as err:
        progress(name, str(err))
        return {"compile_error": str(err)}
    finally:
        os.remove(path)
    progress(name, f"gir compile: cold {cold['seconds']} s, warm {warm['seconds']} s")
    return {"compile_cold_s": cold["seconds"], "compile_warm_s": warm["seconds"], "compile_warm_hit": warm["model_hit"],
            "compile_cold_plan_s": cold["plan_seconds"], "compile_cold_build_s": cold["build_seconds"]}


def time_regions(name: str, model, partition, feeds: dict, args) -> dict:
    """GIR and onnxruntime on each distinct memory-intensive region alone; totals count copies."""
    found = bench_regions.regions(model, partition, feeds)
    alike: dict[tuple, list] = {}
    for r in found:
        if r.model is not None:
            alike.setdefault(r.key, []).append(r)
    skipped = [{"first_node": r.nodes[0], "nodes": len(r.nodes), "reason": r.skipped} for r in found if r.model is None]
    timed = []
    for i, same in enumerate(alike.values()):
        first = same[0]
        progress(name, f"region {i + 1}/{len(alike)}: {first.nodes[0]} .. {first.nodes[-1]} (x{len(same)})")
        try:
            result = compare(first.model, first.feeds, args.runs, args.limit)[0]
        except Exception as err:  # noqa: BLE001 -- a region GIR cannot run is reported, the others still run
            skipped += [{"first_node": r.nodes[0], "nodes": len(r.nodes), "reason": failure(err)} for r in same]
            continue
        timed.append({"first_node": first.nodes[0], "last_node": first.nodes[-1], "nodes": len(first.nodes),
                      "copies": len(same), "gir_ms": result["gir_ms"], "ort_ms": result["ort_ms"],
                      "max_rel_err": result["rel"]})
    gir_ms = sum(t["gir_ms"] * t["copies"] for t in timed)
    ort_ms = sum(t["ort_ms"] * t["copies"] for t in timed)
    return {"regions": len(found), "distinct": len(timed), "skipped": skipped, "gir_ms": gir_ms, "ort_ms": ort_ms,
            "gir_over_ort": gir_ms / ort_ms if ort_ms else None,
            "max_rel_err": max((t["max_rel_err"] for t in timed), default=None),
            "matches": all(t["max_rel_err"] < TOLERANCE for t in timed),
            "by_structure": sorted(timed, key=lambda t: -t["gir_ms"] * t["copies"])}


def machine() -> dict:
    return {"platform": platform.platform(), "cores": os.cpu_count(), "cpu": cpu_name(), "load_average": os.getloadavg()[0],
            "python": platform.python_version(), "onnxruntime": ort.__version__}


def number(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table_row(r: dict) -> list[str]:
    if "error" in r:
        return [r["model"], f"error: {r['error']}"] + [""] * (len(COLUMNS) - 2)
    mb = [number(r[k] / 1e6, ".1f") for k in ("unfused_bytes", "gir_bytes", "bound_bytes")]
    wrong = "" if r["matches"] else " (WRONG)"
    return [r["model"], str(r["onnx_nodes"]), str(r["basic_ops"]), str(r["library_ops"]), str(r["subgraphs"]),
            str(r["kernels"]), *mb, number(r["gir_over_bound"], ".2f") + "x",
            number(r.get("compile_cold_s"), ".1f"), number(r.get("compile_warm_s"), ".1f"),
            f"{r['gir_ms']:.2f}", f"{r['ort_ms']:.2f}", f"{r['gir_over_ort']:.2f}x", f"{r['max_rel_err']:.2g}{wrong}"]


def region_rows(r: dict) -> tuple[list, list]:
    g = r.get("regions")
    if not g:
        return [], []
    wrong = "" if g["matches"] else " (WRONG)"
    row = [r["model"], str(g["regions"]), str(g["distinct"]), str(len(g["skipped"])), f"{g['gir_ms']:.2f}",
           f"{g['ort_ms']:.2f}", number(g["gir_over_ort"], ".2f") + "x", number(g["max_rel_err"], ".2g") + wrong]
    top = [[r["model"], f"`{t['first_node']}` .. `{t['last_node']}`", str(t["nodes"]), str(t["copies"]),
            f"{t['gir_ms']:.3f}", f"{t['ort_ms']:.3f}", f"{t['gir_ms'] / t['ort_ms']:.2f}x"]
           for t in g["by_structure"][:TOP_REGIONS]]
    return [row], top


def markdown_table(columns, rows) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def report(results: dict) -> str:
    """The markdown file: what was run where, the tables, and how each number was measured."""
    a, m = results["options"], results["machine"]
    rows = results["models"]
    regions = [region_rows(r) for r in rows]
    parts = [f"# Benchmark: GIR on the model zoo{' (tiny variants)' if a['tiny'] else ''}\n",
             f"`{results['command']}`, {results['date']}, {results['seconds']:.0f} s in all. Machine: {m['cpu']}, "
             f"{m['cores']} cores (load average {m['load_average']:.1f} at the start), {m['platform']}, "
             f"Python {m['python']}, onnxruntime {m['onnxruntime']}.\n",
             "## Whole models\n", markdown_table(COLUMNS, [table_row(r) for r in rows]),
             MODEL_NOTES.format(target=a["target"], limit=a["limit"], runs=a["runs"], tolerance=TOLERANCE)]
    if not a["skip_subgraphs"]:
        parts += ["## Memory-intensive regions alone (CPU)\n",
                  markdown_table(REGION_COLUMNS, [row for rs, _ in regions for row in rs]),
                  f"The {TOP_REGIONS} regions with the most GIR time (time of one copy x copies) per model:\n",
                  markdown_table(TOP_COLUMNS, [row for _, top in regions for row in top]),
                  REGION_NOTES.format(runs=a["runs"], tolerance=TOLERANCE)]
        skipped = [f"- {r['model']}: `{s['first_node']}` ({s['nodes']} nodes): {s['reason']}"
                   for r in rows for s in r.get("regions", {}).get("skipped", [])]
        if skipped:
            parts += ["Regions not timed:\n\n" + "\n".join(skipped) + "\n"]
    failed = [f"- {r['model']}: {r['compile_error']}" for r in rows if "compile_error" in r]
    if failed:
        parts.append("Compiles that failed (their columns show -):\n\n" + "\n".join(failed) + "\n")
    spent = [f"{r['model']}: " + ", ".join(f"{k} {v:.0f}" for k, v in r["phase_seconds"].items())
             for r in rows if "phase_seconds" in r]
    parts.append("Where the time of this run went (seconds per model and phase): " + "; ".join(spent) + ".\n")
    parts.append(gpu_report(results) if results.get("gpu") else
                 f"## GPU\n\nNot measured in this run: {no_gpu_reason()}.\n")
    return "\n".join(parts)


def no_gpu_reason() -> str:
    if not os.path.isdir("/proc/driver/nvidia/gpus") or not os.listdir("/proc/driver/nvidia/gpus"):
        return "this machine has no NVIDIA GPU (no /proc/driver/nvidia/gpus)"
    return "`--gpu` was not given"


MODEL_NOTES = """- ONNX nodes: nodes of the model; basic ops: operators after GIR's decomposition (before
  partitioning). Library ops, subgraphs (memory-intensive), kernels (fused GIR-Graphs) and the
  DRAM columns are the plan for {target} (`--limit {limit}`), from `scripts/plan_model.py`:
  one-kernel-per-op reads every input and writes every output of each operator; GIR counts
  each distinct element a fused kernel touches once; the bound reads each subgraph's external
  inputs once (of a table only gathered from, the gathered rows) and writes its escaping
  outputs once.
- compile cold / warm: wall-clock seconds of `gir compile MODEL --target {target} --limit {limit}`
  in a fresh process, first with an empty `GIR_CACHE_DIR` made for the model, then again with
  the same cache (a whole-model cache hit); it includes Python start-up, planning and NVRTC.
- CPU: gir.Session(target="cpu", native engine: emitted C + OpenMP, library ops through numpy's
  BLAS) against onnxruntime's CPUExecutionProvider on the same seeded inputs
  (`models.example_inputs`, seed 0) in the same process; median of {runs} runs after one
  warm-up. The CPU plan partitions for the CPU target, so its library ops differ from the
  {target} columns. max rel err: the worst output's max |GIR - ORT| / max |ORT|; a row says
  WRONG above {tolerance:g}.
"""

REGION_NOTES = """How: a region is a set of ONNX nodes none of whose basic operators is a library call in the
CPU plan; nodes whose operators share a fused subgraph are in one region. Each is cut out as
an ONNX model (`onnx.utils.Extractor`) whose inputs get the values the full model computes
for them (onnxruntime on the same feeds, the intermediates as extra outputs), so the inputs
are the model's own. GIR (its own plan of the region alone) and onnxruntime (with its usual
graph optimisations) then run it on those inputs; median of {runs} runs after one warm-up.
Regions with the same structure (node types, attributes, wiring, input and weight shapes,
constants of up to 16 elements: the repeated layers) are timed once, on the first copy, and
counted once per copy in the totals. Per-run overheads of both runtimes (binding feeds,
allocating outputs) are paid once per region here, once per model above. WRONG marks a max
relative error above {tolerance:g}.
"""


def gpu_report(results: dict) -> str:
    g = results["gpu"]
    rows = [r for r in results["models"] if "gpu" in r]
    latency = [gpu_latency_row(r["model"], r["gpu"]) for r in rows]
    kernels = [[r["model"], f"`{k['kernel'][:60]}`", str(k["launches"]), f"{k['bytes'] / 1e6:.2f}",
                f"{k['seconds'] * 1e6:.1f}", f"{k['bytes_per_s'] / 1e9:.0f}",
                f"{k['bytes_per_s'] / g['copy_bytes_per_s']:.0%}"]
               for r in rows for k in sorted(r["gpu"].get("kernels", []), key=lambda k: -k["bytes"])[:TOP_KERNELS]]
    return "\n".join([
        f"## GPU: {g['device']}\n",
        f"Device-to-device copy (1 GiB, bytes read + written): {g['copy_bytes_per_s'] / 1e9:.0f} GB/s, "
        "the ceiling below.\n",
        markdown_table(("model", "GIR ms", "GIR kernels only ms", "GIR kernels GB/s", "torch eager ms",
                        "torch.compile ms", "GIR/eager", "GIR/compile", "GIR max rel err", "note"), latency),
        "Library paths; GIR with its convolutions as im2col + cuBLASLt instead (GIR_DEVICE_CONV=im2col, "
        "same plan); and GIR planned by the ridge rule alone, without the time check that gives slow lowered "
        "ops back to the library (given back: how many):\n",
        markdown_table(("model", "library path", "GIR ms", "GIR ms, convs as im2col", "given back",
                        "GIR ms, ridge rule alone"),
                       [[r["model"], r["gpu"].get("library_path", "-"), number(r["gpu"].get("gir_ms"), ".2f"),
                         number(r["gpu"].get("gir_im2col_ms"), ".2f"), str(r["gpu"].get("given_back", "-")),
                         number(r["gpu"].get("gir_ridge_only_ms"), ".2f")] for r in rows]),
        f"The {TOP_KERNELS} largest kernels (modelled DRAM bytes) of each model:\n",
        markdown_table(("model", "kernel", "launches", "MB", "us", "GB/s", "of copy"), kernels),
        GPU_NOTES])


GPU_NOTES = """Model latencies are host to host on both sides (inputs uploaded, outputs downloaded), median
of the runs after one warm-up. GIR: gir.Session on the device runtime (matmuls through
cuBLASLt, convs through cuDNN where installed, else an im2col kernel + cuBLASLt, as the library
path column says; the whole plan replayed as one CUDA graph, one
synchronisation per run); "GIR kernels only" is the sum of its fused kernels' times below, the
part GIR's own code generation is responsible for; GIR kernels GB/s: all their modelled bytes
over that time. torch: the ONNX model converted by onnx2torch (one torch module per ONNX node,
so eager mode is slower than hand-written PyTorch would be), eager and `torch.compile` (default
mode; the first call, which compiles, is not timed). Kernel times: CUDA events on the launcher's
stream, median of 100 runs after 10 warm-up runs, each run on another copy of the kernel's
buffers (the copies cover 4x the L2 cache); bytes are the plan's modelled DRAM bytes; GB/s is
bytes / time, "of copy" that over the device-to-device copy above.
"""


def gpu_latency_row(model: str, g: dict) -> list[str]:
    if "error" in g:
        return [model] + ["-"] * 8 + [f"error: {g['error']}"]
    seconds = sum(k["seconds"] for k in g["kernels"])
    moved = sum(k["bytes"] for k in g["kernels"]) / seconds / 1e9 if seconds else None
    note = "; ".join(g[k] for k in ("torch_note", "torch_eager_error", "torch_compile_error") if k in g)
    return [model, f"{g['gir_ms']:.2f}", f"{g['kernel_ms']:.3f}", number(moved, ".0f"),
            number(g.get("torch_eager_ms"), ".2f"), number(g.get("torch_compile_ms"), ".2f"),
            ratio(g, "torch_eager_ms"), ratio(g, "torch_compile_ms"), f"{g['gir_max_rel_err']:.2g}", note]


def ratio(gpu_row: dict, key: str) -> str:
    return f"{gpu_row['gir_ms'] / gpu_row[key]:.2f}x" if gpu_row.get(key) else "-"


def open_gpu(runs: int):
    """bench_gpu's Gpu, or exit with one line saying what is missing."""
    import bench_gpu
    try:
        return bench_gpu.Gpu(runs)
    except bench_gpu.GpuUnavailable as err:
        print(f"bench.py --gpu: {err}", file=sys.stderr)
        sys.exit(EXIT_NO_GPU)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=SEVEN, metavar="NAME", help=f"default: {' '.join(SEVEN)}")
    ap.add_argument("--tiny", action="store_true", help="the bundled tiny variants")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per latency (median)")
    ap.add_argument("--target", default="cuda:sm_90", help="target of the plan, DRAM and compile columns")
    ap.add_argument("--limit", type=int, default=2, help="parallel structures searched per fused group")
    ap.add_argument("--skip-compile", action="store_true", help="no gir compile timings")
    ap.add_argument("--skip-subgraphs", action="store_true", help="no table of the regions alone")
    ap.add_argument("--gpu", action="store_true", help="also measure on the NVIDIA GPU (needs torch)")
    ap.add_argument("--out", default="results/bench", help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    unknown = [n for n in args.models if n not in models.MODELS]
    if unknown:
        ap.error(f"unknown model {unknown[0]!r} (known: {', '.join(models.MODELS)})")
    gpu = open_gpu(args.runs) if args.gpu else None
    start = time.perf_counter()
    command = ["scripts/bench.py", *(sys.argv[1:] if argv is None else argv)]
    results = {"command": "PYTHONPATH=. python3 " + shlex.join(command),
               "date": datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": machine(), "options": vars(args),
               "models": []}
    if gpu:
        results["gpu"] = {"device": gpu.name, "copy_bytes_per_s": gpu.copy_bytes_per_s}
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS), flush=True)
    with tempfile.TemporaryDirectory(prefix="gir-bench-") as work:
        if not args.skip_compile:
            snapshot_gir(work)
        for name in args.models:
            try:
                row = bench_model(name, args, work, gpu)
            except Exception as err:  # noqa: BLE001 -- one failing model is a row, not the end of the run
                row = {"model": name, "error": failure(err)}
            results["models"].append(row)
            print("| " + " | ".join(table_row(row)) + " |", flush=True)
    results["seconds"] = time.perf_counter() - start
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(report(results))
    print(f"wrote {args.out}.json and {args.out}.md ({results['seconds']:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
