"""CPU A/B comparisons of session 17's changes, each one switched off and on in one process
(issues 23 and 25), so the numbers in its closing note come from a command:

- merge: EfficientNet-B0's 3x3 depthwise conv + SiLU over 1152x7x7 and 480x14x14, the kernel in
  the row form and with the plane's rows merged into one SIMD loop (gir/ir/across_units.py
  merges_rows), timed alone (gir.runtime.profile), with the GB/s it reaches (the 14x14 one is
  not merged on either side: rows of MERGE_BELOW or more keep the row form; it is there to show it).
- fold: SAR-DRN with and without an inference BatchNormalization folded into its conv
  (gir/fusion/epilogue.py, the "scale" step), and onnxruntime, alternating whole runs. Without
  the fold the convs are not adjacent, so that side also lacks the hand-offs the fold enables.
- handoff: SAR-DRN with and without oneDNN hand-offs between blocked convs
  (NativeCpuEngine._hand_off), and onnxruntime, alternating whole runs.
- bind: the torch.onnx exports of BERT and EfficientNet-B0: one run, and the part of it that
  binds the run's pointers (NativeCpuEngine.bind).

    OMP_NUM_THREADS=1 PYTHONPATH=. python3 scripts/cpu_ab.py [--only merge fold handoff bind] [--runs 7]

Writes results/cpu_ab.md. Medians; the two sides of each row are measured in turn in one
process, so their ratio is the figure to read on a noisy machine."""
from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

import gir.backends.across_units as emitter_form
import gir.fusion.epilogue as epilogue
import models
from gir.backends.cpu.engine import NativeCpuEngine
from gir.runtime import Session
from gir.runtime.profile import profile


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def _ort(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _depthwise(c: int, hw: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((c, 1, 3, 3)).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    io = lambda n: helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, c, hw, hw])  # noqa: E731
    g = helper.make_graph(nodes, "dw", [io("x")], [io("y")], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def merge(runs: int) -> list[str]:
    rows = ["| shape | row form us | row form GB/s | merged us | merged GB/s | row form / merged |", "|---|---|---|---|---|---|"]
    shipped = emitter_form.merges_rows
    for c, hw in ((1152, 7), (480, 14)):
        model = _depthwise(c, hw)
        feeds = {"x": np.random.default_rng(1).standard_normal((1, c, hw, hw)).astype(np.float32)}
        emitter_form.merges_rows = lambda *a: False
        try:
            row_form = Session(model, target="cpu")
        finally:
            emitter_form.merges_rows = shipped
        merged = Session(model, target="cpu")
        a, b = [], []
        for _ in range(runs):
            a.append(profile(row_form, feeds, 10)[0])
            b.append(profile(merged, feeds, 10)[0])
        ra, rb = (sorted(x, key=lambda r: r.seconds)[len(x) // 2] for x in (a, b))  # the median profile row
        rows.append(f"| {c}x{hw}x{hw} 3x3 + SiLU | {ra.seconds * 1e6:.0f} | {ra.gbps:.1f} | {rb.seconds * 1e6:.0f} | "
                    f"{rb.gbps:.1f} | {ra.seconds / rb.seconds:.2f}x |")
    return rows


def _alternate(model, feeds, sessions: dict, runs: int) -> dict:
    ref = _ort(model)
    out = {name: [] for name in (*sessions, "onnxruntime")}
    for _ in range(runs):
        for name, s in sessions.items():
            out[name].append(_median_ms(lambda s=s: s.run(None, feeds), 1))
        out["onnxruntime"].append(_median_ms(lambda: ref.run(None, feeds), 1))
    return {name: float(np.median(v)) for name, v in out.items()}


def fold(runs: int) -> list[str]:
    model, shipped = models.build("sardrn"), epilogue._recognise
    feeds = models.example_inputs(model, 0)
    epilogue._recognise = lambda canon, ext: None if (r := shipped(canon, ext)) is not None and r[0] == "scale" else r
    try:
        without = Session(model, target="cpu")
    finally:
        epilogue._recognise = shipped
    ms = _alternate(model, feeds, {"without": without, "with": Session(model, target="cpu")}, runs)
    return ["| SAR-DRN | without fold ms | with fold ms | onnxruntime ms |", "|---|---|---|---|",
            f"| whole model | {ms['without']:.1f} | {ms['with']:.1f} | {ms['onnxruntime']:.1f} |"]


def handoff(runs: int) -> list[str]:
    model, shipped = models.build("sardrn"), NativeCpuEngine._hand_off
    feeds = models.example_inputs(model, 0)
    NativeCpuEngine._hand_off = lambda self: []
    try:
        without = Session(model, target="cpu")
    finally:
        NativeCpuEngine._hand_off = shipped
    with_ = Session(model, target="cpu")
    ms = _alternate(model, feeds, {"without": without, "with": with_}, runs)
    return ["| SAR-DRN | without hand-offs ms | with hand-offs ms | hand-offs | onnxruntime ms |", "|---|---|---|---|---|",
            f"| whole model | {ms['without']:.1f} | {ms['with']:.1f} | {len(with_.engine.handoffs)} | {ms['onnxruntime']:.1f} |"]


def bind(runs: int) -> list[str]:
    from models.exported_files import load_bound, manifest, reference
    rows = ["| export | run us | bind us | calls |", "|---|---|---|---|"]
    for key in ("bert_dynamo", "efficientnet_b0_dynamo"):
        entry = manifest()[key]
        feeds, want = reference(entry)
        s = Session(load_bound(entry), target="cpu")
        s.run(list(want), feeds)
        run_ms = _median_ms(lambda: s.run(list(want), feeds), 20 * runs)
        bind_ms = _median_ms(lambda: s.engine.bind(feeds), 20 * runs)
        rows.append(f"| {key} | {run_ms * 1e3:.0f} | {bind_ms * 1e3:.0f} | {len(s.engine.calls)} |")
    return rows


PARTS = {"merge": merge, "fold": fold, "handoff": handoff, "bind": bind}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=list(PARTS), choices=list(PARTS))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default="results/cpu_ab")
    args = ap.parse_args()
    text = [f"# CPU A/B comparisons (session 17)\n",
            f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, OMP_NUM_THREADS="
            f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {os.getloadavg()[0]:.2f} at the start: "
            f"`PYTHONPATH=. python3 scripts/cpu_ab.py --runs {args.runs}`. Each row's sides in turn in one "
            "process, medians of the runs.\n"]
    notes = {"merge": "The 480x14x14 conv takes the row form on both sides (rows of 8 or more are not merged).\n",
             "fold": "Without the fold SAR-DRN's convs are not adjacent: that side also lacks the hand-offs.\n"}
    for part in args.only:
        rows = PARTS[part](args.runs)
        print("\n".join(rows), flush=True)
        text += [f"## {part}\n", notes.get(part, ""), *rows, ""]
    Path(args.out + ".md").write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
