"""EfficientNet-B0's depthwise convs (issue 23): each GIR kernel that computes one (with its
bias and SiLU fused) against onnxruntime's Conv node alone on the same shape, in one process.

GIR's kernels are timed alone by gir.runtime.profile (every step of a native CPU session, in
plan order, median of the repeats); onnxruntime runs a one-node model of the same Conv (weights,
bias, strides, pads, group) with the same thread count, median of as many calls. The GIR
kernel does more (bias, Sigmoid and Mul are fused into it), so the ratio is conservative.

    OMP_NUM_THREADS=1 PYTHONPATH=. python3 scripts/depthwise_vs_onnxruntime.py [--repeat 20]

Writes results/depthwise_vs_onnxruntime.md and .json."""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper, shape_inference

import models
from gir.runtime import Session
from gir.runtime.profile import profile


def depthwise_convs(model: onnx.ModelProto):
    """(node, input shape, weight, bias) of every Conv whose group equals its input channels."""
    inferred = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.input)}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type == "Conv" and group > 1 and shapes.get(node.input[0], [0, 0])[1] == group:
            yield node, shapes[node.input[0]], inits[node.input[1]], inits.get(node.input[2]) if len(node.input) > 2 else None


def ort_conv_seconds(node, shape, weight, bias, threads: int, repeat: int, silu: bool = False) -> float:
    """Median seconds of onnxruntime running this Conv alone (`silu`: followed by Sigmoid and
    Mul, the work GIR's kernel does)."""
    inputs = ["x", "w"] + (["b"] if bias is not None else [])
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    nodes = [helper.make_node("Conv", inputs, ["c" if silu else "y"], **attrs)]
    if silu:
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    inits = [numpy_helper.from_array(weight, "w")] + ([numpy_helper.from_array(bias, "b")] if bias is not None else [])
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    s = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    s.run(None, {"x": x})
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        s.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default="results/depthwise_vs_onnxruntime")
    args = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))
    model = models.build("efficientnet_b0")
    session = Session(model, target="cpu")
    steps = profile(session, models.example_inputs(model, 0), args.repeat)
    rows = []
    for node, shape, weight, bias in depthwise_convs(model):
        kernels = [s for s in steps if s.kind == "kernel" and f"{node.name}/mul" in s.name]
        if not kernels:
            print(f"{node.name}: not a GIR kernel here (a library op or folded away)")
            continue
        gir_s = sum(s.seconds for s in kernels)
        ort_s = ort_conv_seconds(node, shape, weight, bias, threads, args.repeat)
        silu_s = ort_conv_seconds(node, shape, weight, bias, threads, args.repeat, silu=True)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        rows.append({"node": node.name, "input": shape, "kernel": list(attrs.get("kernel_shape", [])),
                     "stride": list(attrs.get("strides", [1, 1])), "gir_us": gir_s * 1e6, "ort_us": ort_s * 1e6,
                     "ratio": gir_s / ort_s, "ort_silu_us": silu_s * 1e6, "ratio_silu": gir_s / silu_s,
                     "fused": kernels[0].name.count("+") + 1})
        print(rows[-1], flush=True)
    load = os.getloadavg()
    lines = [f"# EfficientNet-B0 depthwise convs: GIR kernel against onnxruntime's Conv node\n",
             f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, load average {load[0]:.2f} at the end, "
             f"{threads} thread(s) each (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}): "
             f"`PYTHONPATH=. python3 scripts/depthwise_vs_onnxruntime.py --repeat {args.repeat}`. GIR: the kernel(s) "
             f"computing the conv, with bias and SiLU fused, timed alone (`gir run --profile`); onnxruntime: the Conv "
             f"node alone (with bias, no SiLU), and the Conv followed by Sigmoid and Mul (the work of GIR's kernel). "
             f"Medians of {args.repeat}.\n",
             "| node | input | kernel | stride | ops fused | GIR us | onnxruntime Conv us | GIR / Conv | "
             "onnxruntime Conv+SiLU us | GIR / Conv+SiLU |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['node']} | {'x'.join(map(str, r['input']))} | {'x'.join(map(str, r['kernel']))} | "
                     f"{'x'.join(map(str, r['stride']))} | {r['fused']} | {r['gir_us']:.0f} | {r['ort_us']:.0f} | {r['ratio']:.2f} | "
                     f"{r['ort_silu_us']:.0f} | {r['ratio_silu']:.2f} |")
    if rows:
        ratios = [r["ratio"] for r in rows]
        silu = [r["ratio_silu"] for r in rows]
        lines.append(f"\nAgainst the Conv node: within 2x {sum(r <= 2 for r in ratios)} of {len(rows)}, median ratio "
                     f"{np.median(ratios):.2f}, largest {max(ratios):.2f}. Against Conv+SiLU: within 2x "
                     f"{sum(r <= 2 for r in silu)} of {len(rows)}, median {np.median(silu):.2f}, largest {max(silu):.2f}.")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"threads": threads, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
