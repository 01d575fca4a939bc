"""Command line of the model zoo.

    python -m models build --out DIR [--tiny] [--dtype fp32|fp16|bf16] [--only NAME ...]
    python -m models report [--tiny] [--only NAME ...] [--out FILE.md] [--json [FILE.json]] [--runs N]

``build`` writes ``DIR/NAME.onnx`` (``NAME_tiny.onnx`` with ``--tiny``; ``NAME_fp16.onnx`` or
``NAME_bf16.onnx`` with ``--dtype``: half-precision weights and activations, LayerNorm and
softmax in fp32, see models/half.py), one progress line per model.  ``report`` builds each model and prints a markdown table (parameters, nodes, top-10 op
histogram, onnxruntime CPU latency: median of ``--runs`` runs after two warm-up runs, default
session options).  Errors are one-line messages with a non-zero exit status.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import onnx

from . import DTYPES, MODELS, build, example_inputs, file_name
from ._builder import count_parameters


class CliError(Exception):
    pass


def _names(only: list[str] | None) -> list[str]:
    if not only:
        return list(MODELS)
    unknown = [n for n in only if n not in MODELS]
    if unknown:
        raise CliError(f"unknown model {unknown[0]!r} (known: {', '.join(MODELS)})")
    return list(dict.fromkeys(only))


def op_histogram(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


def measure_latency(model: onnx.ModelProto, runs: int, warmup: int = 2) -> float:
    """Median wall time (ms) of ``runs`` onnxruntime CPU runs after ``warmup`` runs."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = example_inputs(model)
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def cmd_build(args: argparse.Namespace) -> int:
    names = _names(args.only)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot create output directory {str(out)!r}: {e.strerror or e}") from None
    for name in names:
        t0 = time.perf_counter()
        model = build(name, tiny=args.tiny, dtype=args.dtype)
        path = out / file_name(name, args.tiny, args.dtype)
        data = model.SerializeToString()
        try:
            path.write_bytes(data)
        except OSError as e:
            raise CliError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
        print(
            f"{name}: wrote {path} ({_fmt_params(count_parameters(model))} params, "
            f"{len(model.graph.node)} nodes, {len(data) / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f}s",
            flush=True,
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    names = _names(args.only)
    md_path = Path(args.out) if args.out else None
    json_path = None
    if args.json is not None:
        if args.json:
            json_path = Path(args.json)
        elif md_path is not None:
            json_path = md_path.with_suffix(".json")
        else:
            raise CliError("--json needs a file name when --out is not given")
    if args.runs < 1:
        raise CliError("--runs must be at least 1")
    rows = []
    for name in names:
        t0 = time.perf_counter()
        model = build(name, tiny=args.tiny)
        hist = op_histogram(model)
        lat = None if args.no_latency else measure_latency(model, args.runs)
        rows.append(
            dict(
                model=file_name(name, args.tiny)[: -len(".onnx")],
                parameters=count_parameters(model),
                nodes=len(model.graph.node),
                op_histogram=dict(hist.most_common()),
                ort_cpu_latency_ms=lat,
            )
        )
        print(f"{name}: done in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        del model

    lines = [
        "| model | parameters | nodes | op histogram (top 10) | ORT CPU latency (ms) |",
        "|---|---:|---:|---|---:|",
    ]
    for r in rows:
        top = ", ".join(f"{op} {n}" for op, n in list(r["op_histogram"].items())[:10])
        lat = "-" if r["ort_cpu_latency_ms"] is None else f"{r['ort_cpu_latency_ms']:.2f}"
        lines.append(f"| {r['model']} | {r['parameters']:,} | {r['nodes']} | {top} | {lat} |")
    import onnxruntime as ort

    note = (
        f"\nonnxruntime {ort.__version__} CPUExecutionProvider, default session options, "
        f"median of {args.runs} runs after 2 warm-up runs, seeded inputs.\n"
    )
    table = "\n".join(lines) + "\n" + ("" if args.no_latency else note)
    print(table, end="")
    try:
        if md_path is not None:
            md_path.write_text(table)
        if json_path is not None:
            json_path.write_text(json.dumps(rows, indent=2) + "\n")
    except OSError as e:
        raise CliError(f"cannot write report: {e.strerror or e} ({e.filename})") from None
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models", description="GIR model zoo")
    sub = p.add_subparsers(dest="cmd", required=True)
    pb = sub.add_parser("build", help="write the models as ONNX files")
    pb.add_argument("--out", required=True, metavar="DIR")
    pb.add_argument("--tiny", action="store_true", help="the tiny test variants (NAME_tiny.onnx)")
    pb.add_argument("--only", nargs="+", metavar="NAME", help=f"some of: {', '.join(MODELS)}")
    pb.add_argument("--dtype", choices=DTYPES, default="fp32",
                    help="weights and activations: fp32 (default), fp16 or bf16 (LayerNorm and softmax in fp32)")
    pr = sub.add_parser("report", help="print a markdown table of the models")
    pr.add_argument("--tiny", action="store_true")
    pr.add_argument("--only", nargs="+", metavar="NAME")
    pr.add_argument("--out", metavar="FILE.md", help="also write the table to this file")
    pr.add_argument("--json", nargs="?", const="", metavar="FILE.json",
                    help="also write JSON (default: next to --out)")
    pr.add_argument("--runs", type=int, default=5, help="timed runs per model (median)")
    pr.add_argument("--no-latency", action="store_true", help="skip onnxruntime timing")
    args = p.parse_args(argv)
    try:
        return cmd_build(args) if args.cmd == "build" else cmd_report(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
