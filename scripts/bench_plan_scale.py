"""Planning time against model size (issue 22): elementwise chains of 100, 1,000 and 10,000
nodes (Relu; Add reading the graph input at every step), a Concat of 500 inputs, and Softmax
chains and Relu+Add ladders of 50 and 500 (groups cut at $GIR_MAX_GROUP_OPS), planned
for cuda:sm_90 and cpu. For the smaller ones the cpu plan is also built and run by the native
engine and compared with onnxruntime. Each case runs in a fresh process (a plan warms caches),
with the time limit per case. Prints the table and writes results/plan_scale.md and .json.

    PYTHONPATH=. python scripts/bench_plan_scale.py [--sizes 100 1000 10000] [--run-up-to 10000]
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper


def chain(n: int, op: str, shape=(64, 256)):
    nodes, prev = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node(op, [prev, "x"] if op == "Add" else [prev], [out], name=f"{op.lower()}{i}"))
        prev = out
    g = helper.make_graph(nodes, f"{op.lower()}_chain_{n}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return _model(g)


def concat(n: int, shape=(4, 64)):
    ins = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, shape) for i in range(n)]
    node = helper.make_node("Concat", [f"x{i}" for i in range(n)], ["y"], axis=1, name="concat")
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, (shape[0], n * shape[1]))
    return _model(helper.make_graph([node], f"concat_{n}", ins, [out]))


def softmax_chain(n: int, shape=(64, 256)):
    nodes = [helper.make_node("Softmax", ["x" if i == 0 else f"s{i - 1}"], ["y" if i == n - 1 else f"s{i}"], axis=-1)
             for i in range(n)]
    return _model(helper.make_graph(nodes, f"softmax_chain_{n}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]))


def ladder(n: int, shape=(64, 256)):
    """y = Add(prev, Relu(prev)) n times: every value has two readers, so no chain composes it."""
    nodes, prev = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"a{i}"
        nodes += [helper.make_node("Relu", [prev], [f"r{i}"]), helper.make_node("Add", [prev, f"r{i}"], [out])]
        prev = out
    return _model(helper.make_graph(nodes, f"ladder_{n}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]))


def _model(g):
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def _case(kind: str, n: int):
    builders = {"Concat": concat, "Softmax chain": softmax_chain, "Relu+Add ladder": ladder}
    return builders[kind](n) if kind in builders else chain(n, kind)


def _measure(kind, n, target, run, queue):
    os.environ["GIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="gir-plan-scale-")  # cold: no cached plan or C build
    from gir.frontend import load
    from gir.fusion.plan import plan
    from gir.ir import get_target
    model = _case(kind, n)
    start = time.perf_counter()
    graph = load(model)
    loaded = time.perf_counter() - start
    start = time.perf_counter()
    p = plan(graph, get_target(target))
    row = {"case": f"{kind} x {n}", "nodes": len(model.graph.node), "target": target, "load_s": loaded,
           "plan_s": time.perf_counter() - start, "kernels": len(p.kernels)}
    if run:
        import onnxruntime as ort

        import gir
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
                 for i in model.graph.input}
        start = time.perf_counter()
        got = gir.Session(model, target="cpu").run(None, feeds)[0]
        row["session_s"] = time.perf_counter() - start
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        row["max_rel_err"] = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1)))
        row["matches"] = bool(np.allclose(got, want, rtol=1e-4, atol=1e-4))
    shutil.rmtree(os.environ["GIR_CACHE_DIR"], ignore_errors=True)
    queue.put(row)


def measure(kind, n, target, run, limit_s):
    queue = mp.get_context("fork").Queue()
    proc = mp.get_context("fork").Process(target=_measure, args=(kind, n, target, run, queue))
    start = time.perf_counter()
    proc.start()
    proc.join(limit_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"case": f"{kind} x {n}", "nodes": len(_case(kind, n).graph.node), "target": target,
                "error": f"over {limit_s} s"}
    if queue.empty():
        return {"case": f"{kind} x {n}", "target": target, "error": f"exit {proc.exitcode}",
                "wall_s": time.perf_counter() - start}
    return queue.get()


def table(rows) -> str:
    head = "| case | ONNX nodes | target | load s | plan s | kernels | cpu session s (plan + build + run) | matches onnxruntime |"
    lines = [head, "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r.get('nodes', '')} | {r['target']} | | {r['error']} | | | |")
            continue
        ses = f"{r['session_s']:.2f}" if "session_s" in r else "not run"
        ok = ("yes" if r["matches"] else f"NO (max rel err {r['max_rel_err']:.2e})") if "matches" in r else ""
        lines.append(f"| {r['case']} | {r['nodes']} | {r['target']} | {r['load_s']:.2f} | {r['plan_s']:.2f} | "
                     f"{r['kernels']} | {ses} | {ok} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--concat", type=int, default=500)
    ap.add_argument("--ladders", type=int, nargs="+", default=[50, 500], help="Softmax chain and Relu+Add ladder lengths")
    ap.add_argument("--targets", nargs="+", default=["cuda:sm_90", "cpu"])
    ap.add_argument("--run-up-to", type=int, default=10000, help="run on cpu and compare for chains up to this length")
    ap.add_argument("--limit-s", type=float, default=600)
    ap.add_argument("--out", default="results/plan_scale")
    args = ap.parse_args()
    cases = [(op, n) for op in ("Relu", "Add") for n in args.sizes] + [("Concat", args.concat)]
    cases += [(kind, n) for kind in ("Softmax chain", "Relu+Add ladder") for n in args.ladders]
    rows = []
    for kind, n in cases:
        for target in args.targets:
            run = target == "cpu" and (kind not in ("Relu", "Add") or n <= args.run_up_to)
            rows.append(measure(kind, n, target, run, args.limit_s))
            print(rows[-1], flush=True)
    text = table(rows)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    note = (f"# Planning time against model size\n\n{date.today()}, {platform.machine()}, "
            f"{mp.cpu_count()} cores (shared with other jobs): `PYTHONPATH=. python scripts/bench_plan_scale.py`. "
            "Chains: `x[64, 256]` through n Relu nodes, or n `Add(previous, x)` nodes; Concat: 500 inputs "
            "`[4, 64]` on axis 1; Softmax chain: n Softmax ops in a line on `x[64, 256]`; Relu+Add ladder: "
            "n times `Add(prev, Relu(prev))`. Each case in a fresh process. `plan s` is `gir.fusion.plan.plan` alone; the "
            "session column is `gir.Session(model, target='cpu')` plus one run (plan, C build with an empty compile "
            "cache, run).\n\n")
    out.with_suffix(".md").write_text(note + text + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
