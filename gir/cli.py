"""The `gir` command line: targets, explain, run, compile.

Every failure a user can cause (missing or corrupt file, unsupported op, bad target, bad
inputs, missing toolchain) ends as one line on stderr and a documented exit code:
0 ok, 1 bad input or usage, 2 unsupported model, 3 toolchain missing, 4 internal error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

EXIT_OK, EXIT_INPUT, EXIT_UNSUPPORTED, EXIT_TOOLCHAIN, EXIT_INTERNAL = 0, 1, 2, 3, 4


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_INPUT):
        super().__init__(message)
        self.code = code


def _target(name: str):
    from gir.ir import get_target
    try:
        return get_target(name)
    except KeyError as err:
        raise CliError(str(err.args[0])) from None


def _load(path: str):
    from gir.frontend import FrontendError, UnsupportedOpError, load
    try:
        return load(path)
    except UnsupportedOpError as err:
        raise CliError(str(err).splitlines()[0] if "\n" in str(err) else str(err), EXIT_UNSUPPORTED) from None
    except FrontendError as err:
        raise CliError(str(err)) from None


def _plan(args, graph, target):
    from gir.fusion.plan import plan

    def progress(i, n, text):
        if not args.quiet:
            print(f"[{i + 1}/{n}] subgraph: {text}", file=sys.stderr, flush=True)
    return plan(graph, target, limit=args.limit, progress=progress)


def cmd_targets(args) -> int:
    from gir.ir.target import ALIASES, PRESETS, local_cpu
    names = {v: k for k, v in ALIASES.items()}
    print(f"{'target':<12} {'name':<8} {'unit':<10} {'lanes':>5} {'units/blk':>9} {'DRAM GB/s':>10} {'fp32 TFLOP/s':>12} {'ridge':>6}")
    for key, t in [*PRESETS.items(), ("cpu", local_cpu())]:
        print(f"{names.get(key, key):<12} {t.name:<8} {t.hierarchy[-2]:<10} {t.lanes_per_unit:>5} {t.max_units_per_block:>9} "
              f"{t.dram_bandwidth / 1e9:>10.0f} {t.peak_flops / 1e12:>12.1f} {t.ridge_point():>6.1f}")
    return EXIT_OK


def explain_data(result, node: str | None = None) -> dict:
    """Everything `gir explain` shows, as plain data (also its --json form)."""
    from gir.ir import to_text
    subgraphs = []
    for i, sub in enumerate(result.subgraphs):
        names = [op.name for op in sub.ops]
        if node and node not in names:
            continue
        kernels = []
        for k in sub.kernels:
            kernels.append({
                "name": k.name, "ops": k.ops, "launches": k.estimate.kernels, "reused": k.reused,
                "explored_structures": k.explored, "modelled_us": round(k.estimate.seconds * 1e6, 3),
                "bound": k.estimate.bound, "dram_bytes": k.estimate.dram_bytes,
                "rules": [str(s) for s in k.log], "gir_before": to_text(k.before), "gir_after": to_text(k.graph),
            })
        subgraphs.append({"index": i, "ops": names, "unfused_dram_bytes": sub.unfused_bytes,
                          "gir_dram_bytes": sub.gir_bytes, "bound_dram_bytes": sub.bound_bytes, "kernels": kernels})
    return {
        "model": result.graph.model_name, "target": result.target.name,
        "partition": [{"op": d.op, "library": d.library, "reason": d.reason} for d in result.partition.decisions],
        "library_ops": len(result.partition.library), "subgraphs": subgraphs,
        "kernels": len(result.kernels), "launches": sum(k.estimate.kernels for k in result.kernels),
        "search_seconds": round(result.search_seconds, 3),
    }


def cmd_explain(args) -> int:
    graph = _load(args.model)
    result = _plan(args, graph, _target(args.target))
    data = explain_data(result, args.node)
    if args.node and not data["subgraphs"]:
        raise CliError(f"{args.model}: no memory-intensive node named {args.node!r}")
    if args.json:
        print(json.dumps(data, indent=1))
        return EXIT_OK
    print(f"{data['model']} on {data['target']}: {data['library_ops']} library ops, {len(result.subgraphs)} "
          f"memory-intensive subgraphs, {data['kernels']} GIR kernels ({data['launches']} launches), "
          f"search {data['search_seconds']} s")
    for d in data["partition"]:
        print(f"  partition {d['op']}: {'library' if d['library'] else 'GIR'} ({d['reason']})")
    for sub in data["subgraphs"]:
        print(f"subgraph {sub['index']}: {len(sub['ops'])} ops; DRAM bytes one-kernel-per-op {sub['unfused_dram_bytes']}, "
              f"GIR {sub['gir_dram_bytes']}, bound {sub['bound_dram_bytes']}")
        for k in sub["kernels"]:
            print(f"  kernel {k['name'][:90]}: {len(k['ops'])} ops, {k['launches']} launch(es), modelled {k['modelled_us']} us "
                  f"({k['bound']}-bound){' [reused]' if k['reused'] else ''}")
            if args.node or args.verbose:
                for rule in k["rules"]:
                    print(f"    rule {rule}")
                print("    GIR before rewriting:\n      " + k["gir_before"].replace("\n", "\n      "))
                print("    GIR after rewriting:\n      " + k["gir_after"].replace("\n", "\n      "))
    return EXIT_OK


def _random_inputs(graph) -> dict:
    rng = np.random.default_rng(0)
    feeds = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        if t.dtype.startswith(("float",)):
            feeds[name] = rng.standard_normal(t.shape).astype(t.dtype)
        elif t.dtype == "bool":
            feeds[name] = rng.random(t.shape) < 0.5
        else:
            feeds[name] = rng.integers(0, 2, t.shape).astype(t.dtype)
    return feeds


def _read_inputs(path: str, graph) -> dict:
    from gir.ir.dtypes import np_dtype
    try:
        data = dict(np.load(path))
    except (OSError, ValueError) as err:
        raise CliError(f"{path}: cannot read inputs ({err})") from None
    unknown = sorted(set(data) - set(graph.inputs))
    if unknown:
        raise CliError(f"{path}: unknown input {unknown[0]!r}; {graph.model_name} takes {', '.join(graph.inputs)}")
    for name in graph.inputs:
        if name not in data:
            raise CliError(f"{path}: missing input {name!r}")
        t = graph.tensors[name]
        if tuple(data[name].shape) != tuple(t.shape):
            raise CliError(f"{path}: input {name!r} has shape {list(data[name].shape)}, {graph.model_name} expects {list(t.shape)}")
        data[name] = data[name].astype(np_dtype(t.dtype))
    return data


def cmd_run(args) -> int:
    from gir.runtime import execute
    graph = _load(args.model)
    feeds = _read_inputs(args.inputs, graph) if args.inputs else _random_inputs(graph)
    result = _plan(args, graph, _target(args.target))
    start = time.perf_counter()
    outputs = execute(result, feeds)
    seconds = time.perf_counter() - start
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)} mean {float(np.mean(value)):.6g} max|x| {float(np.max(np.abs(value))):.6g}")
    if not args.quiet:
        print(f"ran {len(result.kernels)} kernels in the reference interpreter in {seconds:.2f} s", file=sys.stderr)
    if args.output:
        np.savez(args.output, **outputs)
    return EXIT_OK


def _build(graph, target):
    """Emit and compile one GIR-Graph for the target's backend: (source suffix, CompiledGraph,
    {file suffix: bytes})."""
    from gir.backends.errors import CompileError, ResourceError, ToolchainMissingError
    try:
        if target.backend == "cuda":
            from gir.backends.cuda.emitter import compile as build
            built = build(graph, target)
            return ".cu", built, {".ptx": built.binary.ptx.encode(), ".cubin": built.binary.cubin}
        if target.backend == "hip":
            from gir.backends.hip.emitter import compile as build
            built = build(graph, target)
            return ".hip", built, {f".{target.arch}.co": built.binary.code}
        from gir.backends.cpu.compiler import compile as build
        built = build(graph, target)
        return ".c", built, {}
    except ToolchainMissingError as err:
        raise CliError(str(err).splitlines()[0], EXIT_TOOLCHAIN) from None
    except (CompileError, ResourceError) as err:
        raise CliError(f"kernel {graph.name[:80]}: {str(err).splitlines()[0]}", EXIT_INTERNAL) from None


def cmd_compile(args) -> int:
    from gir.ir import to_dot, to_text
    graph = _load(args.model)
    target = _target(args.target)
    result = _plan(args, graph, target)
    os.makedirs(os.path.join(args.output, "kernels"), exist_ok=True)
    steps, launches = [], 0
    for i, step in enumerate(result.steps):
        if not hasattr(step, "graph"):
            steps.append({"kind": "library", "op": step.kind, "name": step.name, "inputs": step.inputs, "outputs": step.outputs})
            continue
        stem = os.path.join(args.output, "kernels", f"k{i:03d}")
        with open(stem + ".gir.txt", "w") as f:
            f.write(to_text(step.graph) + "\n")
        with open(stem + ".dot", "w") as f:
            f.write(to_dot(step.graph) + "\n")
        suffix, built, binaries = _build(step.graph, target)
        with open(stem + suffix, "w") as f:
            f.write(built.source)
        for ext, data in binaries.items():
            with open(stem + ext, "wb") as f:
                f.write(data)
        for k in built.kernels:
            launches += 1
            steps.append({"kind": "launch", "step": step.name, "kernel": k.name, "source": f"kernels/k{i:03d}{suffix}",
                          "grid": [k.num_blocks], "block": [k.block_threads], "shared_bytes": k.shared_bytes,
                          "params": [{"buffer": b.name, "dtype": b.dtype, "elements": b.size, "written": b.name in k.written}
                                     for b in k.params]})
        if not args.quiet:
            print(f"[{i + 1}/{len(result.steps)}] built {step.name[:70]}", file=sys.stderr, flush=True)
    buffers = {n: {"shape": list(t.shape), "dtype": t.dtype} for n, t in graph.tensors.items() if t.value is None}
    with open(os.path.join(args.output, "plan.json"), "w") as f:
        json.dump({"model": graph.model_name, "target": target.name, "arch": target.arch, "aliases": result.aliases,
                   "buffers": buffers, "steps": steps}, f, indent=1)
    with open(os.path.join(args.output, "explain.json"), "w") as f:
        json.dump(explain_data(result), f, indent=1)
    libs = sum(s["kind"] == "library" for s in steps)
    print(f"{graph.model_name} -> {args.output}: {launches} kernel launches ({target.name} {target.arch}), {libs} library calls")
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gir", description="Fuse the memory-intensive part of an ONNX model into GIR kernels.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("targets", help="list hardware targets").set_defaults(fn=cmd_targets)

    def common(p, target="cuda:sm_90"):
        p.add_argument("model", help="ONNX file")
        p.add_argument("--target", default=target, help="cuda:sm_90, cuda:sm_80, hip:gfx908, hip:gfx90a or cpu")
        p.add_argument("--limit", type=int, default=4, help="parallel structures searched per fused group")
        p.add_argument("--quiet", action="store_true", help="no progress output")
        p.add_argument("--verbose", action="store_true", help="show GIR before/after rewriting and the rule log")

    p = sub.add_parser("explain", help="partition, fused kernels, rewrite log, DRAM bytes")
    common(p)
    p.add_argument("--node", help="only the subgraph holding this basic op (shows its GIR and rules)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("run", help="run the planned kernels on inputs (reference interpreter)")
    common(p, "cpu")
    p.add_argument("--inputs", help=".npz with one array per model input (default: seeded random)")
    p.add_argument("-o", "--output", help="write outputs to this .npz")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("compile", help="emit and compile every kernel; write plan.json")
    common(p)
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.set_defaults(fn=cmd_compile)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except CliError as err:
        print(f"gir: error: {err}", file=sys.stderr)
        return err.code
    except BrokenPipeError:  # `gir explain ... | head`: the reader left; not an error
        sys.stdout = open(os.devnull, "w")
        return EXIT_OK
    except KeyboardInterrupt:
        print("gir: interrupted", file=sys.stderr)
        return EXIT_INTERNAL
    except Exception as err:  # a bug in GIR: still one line, with where to look
        print(f"gir: internal error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''} "
              f"(please report; set GIR_TRACEBACK=1 for details)", file=sys.stderr)
        if os.environ.get("GIR_TRACEBACK"):
            raise
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
