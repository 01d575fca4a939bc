"""The `gir` command line: targets, explain, run, compile, cache.

Every failure a user can cause (missing or corrupt file, unsupported op, bad target, bad
inputs, bad usage, missing toolchain) ends as one line on stderr and a documented exit code:
0 ok, 1 bad input or usage, 2 unsupported model, 3 toolchain or GPU device missing, 4 internal error.
Planning, compiling and whole compiles go through the persistent compile cache (gir/cache.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

EXIT_OK, EXIT_INPUT, EXIT_UNSUPPORTED, EXIT_TOOLCHAIN, EXIT_INTERNAL = 0, 1, 2, 3, 4


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_INPUT):
        super().__init__(message)
        self.code = code


def _target(name: str):
    from gir.ir import get_target
    try:
        with _backend_errors():  # a target described by the device it finds needs that toolchain
            return get_target(name)
    except KeyError as err:
        raise CliError(str(err.args[0])) from None


def _load(path: str, shapes: dict | None = None):
    from gir.frontend import FrontendError, UnsupportedOpError, load
    from gir.frontend.errors import UnsupportedDtypeError
    try:
        return load(path, input_shapes=shapes or None)
    except (UnsupportedOpError, UnsupportedDtypeError) as err:
        raise CliError(str(err).splitlines()[0] if "\n" in str(err) else str(err), EXIT_UNSUPPORTED) from None
    except FrontendError as err:
        raise CliError(str(err)) from None


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`--shape NAME=1x128`: an input's whole shape, or `--shape seq=128`: one symbolic dim's size."""
    name, eq, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split("x")) if eq and name and dims else None
    except ValueError:
        shape = None
    if shape is None or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=DIMS (an input: --shape input_ids=1x128; "
                                         f"a symbolic dim: --shape seq=128)")
    return name, shape


def _shapes(args) -> dict:
    shapes = {}
    for name, shape in args.shape or ():
        if name in shapes and shapes[name] != shape:
            raise CliError(f"--shape {name} given twice with different sizes")
        shapes[name] = shape
    return shapes


def _plan_store(args, target):
    """The persistent cache of searched kernels (keyed by group structure, target, `--limit`
    and GIR version)."""
    from gir.cache import Store, gir_version
    return Store("plan", gir_version(), repr(target), args.limit)


def _progress(args):
    def progress(i, n, text):
        if not args.quiet:
            print(f"[{i + 1}/{n}] subgraph: {text}", file=sys.stderr, flush=True)
    return progress


def _plan(args, graph, target):
    from gir.fusion.plan import plan
    store = _plan_store(args, target)
    result = plan(graph, target, limit=args.limit, progress=_progress(args), cache=store)
    _verbose_cache(args, store)
    return result


def _verbose(args, text: str) -> None:
    if args.verbose and not args.quiet:
        print(f"[verbose] {text}", file=sys.stderr, flush=True)


def _verbose_cache(args, store):
    _verbose(args, f"plan cache: {store.hits} hit(s), {store.misses} miss(es), {store.rebuilt} corrupt entr(ies) rebuilt")


@contextmanager
def _backend_errors():
    """A missing compiler is exit 3; a kernel a compiler rejects is GIR's fault, exit 4."""
    from gir.backends.errors import CompileError, ResourceError, ToolchainMissingError
    try:
        yield
    except ToolchainMissingError as err:
        raise CliError(str(err).splitlines()[0], EXIT_TOOLCHAIN) from None
    except (CompileError, ResourceError) as err:
        raise CliError(str(err).splitlines()[0], EXIT_INTERNAL) from None


def cmd_targets(args) -> int:
    """Every target `--target` takes, as the backends registered them (gir/backends/registry.py).
    A target described by its device is listed without opening the device: its figures are
    queried when a command uses it."""
    from gir.backends.registry import entries
    print(f"{'target':<12} {'name':<8} {'unit':<10} {'lanes':>5} {'units/blk':>9} {'DRAM GB/s':>10} {'fp32 TFLOP/s':>12} {'ridge':>6}")
    described = []
    for _, entry in entries():
        if entry.on_device:
            described.append(entry.name)
            continue
        t = entry.describe()
        print(f"{entry.name:<12} {t.name:<8} {t.hierarchy[-2]:<10} {t.lanes_per_unit:>5} {t.max_units_per_block:>9} "
              f"{t.dram_bandwidth / 1e9:>10.0f} {t.peak_flops / 1e12:>12.1f} {t.ridge_point():>6.1f}")
    for key in described:
        print(f"{key:<12} described by the device found when used ($GIR_{key.upper()}_DEVICE picks one by name)")
    return EXIT_OK


def explain_data(result, node: str | None = None) -> dict:
    """Everything `gir explain` shows, as plain data (also its --json form)."""
    from gir.ir import to_text
    from gir.ir.vector_access import wide_share
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
                "modelled_peak_share": round(k.estimate.bandwidth_share(result.target), 4),
                "threads_per_block": k.graph.prim.units_per_block * result.target.lanes_per_unit,
                "blocks": k.graph.prim.num_blocks, "occupancy": round(k.estimate.occupancy, 3),
                "wide_access_share": round(wide_share(k.graph), 4), "bytes_in_flight": k.estimate.bytes_in_flight,
                "rules": [str(s) for s in k.log], "gir_before": to_text(k.before), "gir_after": to_text(k.graph),
            })
        subgraphs.append({"index": i, "ops": names, "unfused_dram_bytes": sub.unfused_bytes,
                          "gir_dram_bytes": sub.gir_bytes, "gir_dram_access_bytes": sub.gir_access_bytes,
                          "bound_dram_bytes": sub.bound_bytes, "kernels": kernels,
                          "above_bound": [e.as_dict() for e in sub.excess]})
    return {
        "model": result.graph.model_name, "target": result.target.name,
        "partition": [{"op": d.op, "library": d.library, "reason": d.reason} for d in result.partition.decisions],
        "library_ops": len(result.partition.library), "subgraphs": subgraphs,
        "kernels": len(result.kernels), "launches": sum(k.estimate.kernels for k in result.kernels),
        "search_seconds": round(result.search_seconds, 3),
    }


def cmd_explain(args) -> int:
    graph = _load(args.model, _shapes(args))
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
        for e in sub["above_bound"]:
            print(f"  above bound: {e['bytes']} bytes of {e['tensor']}: {e['reason']}" + (f" ({e['detail']})" if e["detail"] else ""))
        for k in sub["kernels"]:
            print(f"  kernel {k['name'][:90]}: {len(k['ops'])} ops, {k['launches']} launch(es), modelled {k['modelled_us']} us "
                  f"({k['bound']}-bound), {k['modelled_peak_share']:.0%} of peak DRAM bandwidth (modelled), "
                  f"{k['blocks']} x {k['threads_per_block']} threads, occupancy {k['occupancy']:.0%}, "
                  f"{k['wide_access_share']:.0%} of DRAM access bytes wide{' [reused]' if k['reused'] else ''}")
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
        with np.load(path, allow_pickle=False) as archive:
            data = dict(archive)
    except OSError as err:
        raise CliError(f"{path}: cannot read inputs ({err.strerror or err})") from None
    except Exception:  # noqa: BLE001 - not a zip, a plain .npy, pickled data, a damaged member, ...
        raise CliError(f"{path}: not a readable .npz archive (one array per input, np.savez)") from None
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


def _npz_names(graph) -> None:
    """An .npz member is named by the output: a NUL byte would cut the name short in the zip
    (the output would silently be missing or renamed), so such a model is refused before running."""
    for name in graph.outputs:
        if "\0" in name:
            raise CliError(f"{graph.model_name}: output {name!r} has a NUL byte in its name, which an .npz "
                           f"cannot store (-o); rename the output or run without -o")


def _check_writable(path: str) -> None:
    """Before running: an -o that cannot be written is bad usage, found before the work."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        why = "is a folder" if os.path.isdir(path) else f"folder {folder} does not exist or is not writable"
        raise CliError(f"{path}: cannot write the outputs there ({why})")


def _write_npz(path: str, outputs: dict) -> None:
    """Exactly the named file (np.savez would add `.npz` to a name without it)."""
    try:
        with open(path, "wb") as f:
            np.savez(f, **outputs)
    except OSError as err:
        raise CliError(f"{path}: cannot write the outputs there ({err.strerror or err})") from None


def _engine(args, target) -> str:
    """The engine `gir run` uses: the target's native one, or the interpreter where its backend
    registers none, said on stderr."""
    from gir.runtime.session import has_native_engine
    if args.engine == "native" and not has_native_engine(target):
        if not args.quiet:
            print(f"gir: {target.name} ({target.backend}) has no native engine yet: running its kernels "
                  f"in the interpreter engine", file=sys.stderr)
        return "interpreter"
    return args.engine


def _profiler(target):
    """`profile(session, feeds, repeat) -> text` of the engine the target's backend registers,
    where it can time each step alone; else None."""
    from gir.backends.registry import BackendError, for_target
    try:
        engine = for_target(target).engine
    except BackendError:
        return None
    return engine.profile if engine else None


def _latency(session, feeds, repeat: int) -> str:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return f"latency over {repeat} runs: median {np.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms"


def _cached_graph(args, shapes: dict):
    """The graph of a model `gir run` planned before (gir.Session's cache), without loading it."""
    from gir.runtime.session import cached_graph
    try:
        store = _plan_store(args, _target(args.target))
    except CliError:  # an unknown target: reported after the model is loaded, as before
        return None
    return cached_graph(args.model, shapes or None, args.target, args.limit, store)


def cmd_run(args) -> int:
    """Runs through gir.Session: the target's own kernels through its backend's engine or, with
    `--engine interpreter` (and on backends that register no engine), the reference
    interpreter on any machine."""
    from gir.backends.errors import NoDeviceError
    from gir.runtime import Session
    from gir.runtime.indices import GatherIndexError
    from gir.runtime.session import SessionError
    if args.output is not None and not args.output.strip():
        raise CliError("-o needs a file name, not an empty string")
    if args.profile and (args.engine != "native" or _profiler(_target(args.target)) is None):
        raise CliError(f"--profile times the kernels of a native engine that can time its steps alone "
                       f"(not --target {args.target} --engine {args.engine})")
    shapes = _shapes(args)
    graph = _cached_graph(args, shapes) or _load(args.model, shapes)
    if args.output:
        _npz_names(graph)
        _check_writable(args.output)
    feeds = _read_inputs(args.inputs, graph) if args.inputs else _random_inputs(graph)
    target = _target(args.target)
    engine = _engine(args, target)
    store = _plan_store(args, target)
    start = time.perf_counter()
    try:
        with _backend_errors():  # the file (not the graph): a model planned before is read back whole
            session = Session(args.model, args.target, engine=engine, limit=args.limit, input_shapes=shapes or None,
                              progress=_progress(args), plan_cache=store)
    except NoDeviceError as err:
        raise CliError(f"{str(err).splitlines()[0]} (--engine interpreter runs {target.name} kernels on the host)",
                       EXIT_TOOLCHAIN) from None
    _verbose_cache(args, store)
    _verbose(args, f"session ready in {time.perf_counter() - start:.2f} s "
                   f"({'plan read back from the cache' if session.cached else 'plan, memory'}, build)")
    start = time.perf_counter()
    try:
        values = session.run(None, feeds)
    except (SessionError, GatherIndexError) as err:  # the inputs do not fit the model (an index out of range)
        raise CliError(str(err).splitlines()[0]) from None
    seconds = time.perf_counter() - start
    outputs = dict(zip(graph.outputs, values))
    for name, value in outputs.items():
        print(f"{name}: {_summary(value)}")
    if not args.quiet:
        print(f"ran {len(session.plan.kernels)} kernels with the {engine} engine on {target.name} in {seconds:.3f} s "
              f"(arena {_size(session.memory.peak_bytes)})", file=sys.stderr)
        note = getattr(session.engine, "library_note", "")
        print(f"library ops: {session.library_path}{f' ({note})' if note else ''}", file=sys.stderr)
    if args.repeat:
        print(_latency(session, feeds, args.repeat))
    if args.profile:
        if not args.quiet:
            print("gir: timing each step alone, then a copy loop for the machine's bandwidth", file=sys.stderr)
        print(_profiler(target)(session, feeds, args.repeat or 20))
    if args.output:
        _write_npz(args.output, outputs)
    return EXIT_OK


def _summary(value: np.ndarray) -> str:
    """dtype, shape, mean and max |x| (a zero-size output has no mean or max: says so)."""
    head = f"{value.dtype}{list(value.shape)}"
    if value.size == 0:
        return f"{head} (empty)"
    return f"{head} mean {float(np.mean(value)):.6g} max|x| {float(np.max(np.abs(value))):.6g}"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def cmd_compile(args) -> int:
    """A model compiled before with the same target, options, compilers and GIR version is
    written from the compile cache; otherwise it is loaded, planned and built, and cached."""
    from gir.backends.registry import BackendError, compiler
    from gir.build import toolchain_version
    from gir.cache import Store, cache_root, gir_version
    from gir.compile_outputs import compile_outputs
    from gir.frontend import FrontendError
    from gir.model_digest import model_digest
    if not args.output.strip():
        raise CliError("-o needs a folder name, not an empty string")
    target = _target(args.target)
    try:
        compiler(target)
    except BackendError as err:
        raise CliError(str(err)) from None
    with _backend_errors():
        store = Store("model", gir_version(), repr(target), args.limit, toolchain_version(target))
    start = time.perf_counter()
    try:  # external data is validated before anything is read to hash it
        digest = model_digest(args.model)
    except FrontendError as err:
        raise CliError(str(err)) from None
    shapes = _shapes(args)
    key = (digest, tuple(sorted(shapes.items()))) if shapes else digest  # the bound shapes change the build
    files = store.get(key) if digest else None
    _verbose(args, f"model cache: {'hit' if files else 'miss'} ({time.perf_counter() - start:.2f} s to hash the model)")
    if files is None:
        start = time.perf_counter()
        graph = _load(args.model, shapes)
        _verbose(args, f"loaded in {time.perf_counter() - start:.2f} s")
        result = _plan(args, graph, target)
        _verbose(args, f"planned in {result.search_seconds:.2f} s")

        def built(done, total, step):
            if not args.quiet:
                print(f"[{done}/{total}] built {result.steps[step.index].name[:70]}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with _backend_errors():
            files = compile_outputs(graph, result, explain_data(result), args.jobs, built)
        _verbose(args, f"built and reported in {time.perf_counter() - start:.2f} s with {args.jobs} job(s)")
        if digest:
            store[key] = files
    elif not args.quiet:
        print(f"{args.model}: compiled before with the same target, options and compilers: "
              f"outputs from the compile cache ({cache_root()})", file=sys.stderr)
    out = Path(args.output)
    try:
        for path, data in files.items():
            (out / path).parent.mkdir(parents=True, exist_ok=True)
            (out / path).write_bytes(data)
    except OSError as err:
        raise CliError(f"{args.output}: cannot write the outputs there ({err.strerror or err})") from None
    plan = json.loads(files["plan.json"])
    launches = sum(s["kind"] == "launch" for s in plan["steps"])
    libs = sum(s["kind"] == "library" for s in plan["steps"])
    print(f"{plan['model']} -> {args.output}: {launches} kernel launches ({target.name} {target.arch}), {libs} library calls")
    return EXIT_OK


def cmd_cache_info(args) -> int:
    from gir.cache import cache_root, gir_version, info, kinds
    data, what = info(), kinds()
    if args.json:
        print(json.dumps({"root": str(cache_root()), "gir_version": gir_version(), "kinds": data}, indent=1))
        return EXIT_OK
    print(f"compile cache {cache_root()} (GIR {gir_version()}; set GIR_CACHE_DIR to move it)")
    print(f"{'kind':<8} {'entries':>8} {'MB':>9}  holds")
    for kind, d in data.items():
        print(f"{kind:<8} {d['entries']:>8} {d['bytes'] / 1e6:>9.2f}  {what[kind]}")
    print(f"{'total':<8} {sum(d['entries'] for d in data.values()):>8} {sum(d['bytes'] for d in data.values()) / 1e6:>9.2f}")
    return EXIT_OK


def cmd_cache_clear(args) -> int:
    from gir.cache import cache_root, clear
    freed = clear()
    print(f"cleared the compile cache {cache_root()}: {freed / 1e6:.2f} MB freed")
    return EXIT_OK


def cmd_calibrate(args) -> int:
    """Measure this CPU's constants for the time model and store them with the compile cache."""
    from gir.backends.registry import HOST_TARGET, for_target
    host = for_target(_target(HOST_TARGET))
    if host.calibration is None:
        raise CliError(f"the host's backend {host.name!r} registers no calibration")
    calibration = host.calibration()
    measure, save, stored = calibration.measure, calibration.save, calibration.stored
    if args.show:
        cal = stored()
        if cal is None:
            print("this CPU is not calibrated: the cpu target uses nominal figures (run `gir calibrate`)")
        else:
            print(json.dumps(cal.__dict__, indent=1))
        return EXIT_OK
    say = (lambda *_: None) if args.quiet else (lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    if not args.quiet:
        print("calibrating the cpu target (copy bandwidth, launch cost, issue rate, library calls; about 15 s)", file=sys.stderr)
    cal = measure(progress=say)
    path = save(cal)
    print(f"calibrated {cal.cpu}: copy {cal.copy_bandwidth / 1e9:.1f} GB/s with {cal.threads} threads, "
          f"{cal.unit_bandwidth / 1e9:.1f} GB/s with one, launch {cal.launch_s * 1e6:.1f} us, "
          f"{cal.issue_per_s / 1e9:.1f} G SIMD instructions/s per thread; stored in {path}")
    return EXIT_OK


def cmd_port_new(args) -> int:
    from gir.backends.scaffold import ScaffoldError, new_backend
    try:
        folder = new_backend(args.name, Path(args.dir) if args.dir else None)
    except ScaffoldError as err:
        raise CliError(str(err)) from None
    spec = args.name if not args.dir else str(folder)
    found = "" if not args.dir else (f"\n`gir` finds it with GIR_BACKEND_PATH={folder.parent} (or an entry point of "
                                     f"group gir.backends)")
    print(f"wrote {folder}: write the TODO(port) places (docs/PORTING.md), then check it with\n"
          f"  python3 -m pytest tests/conformance --backend {spec}{found}")
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """Usage errors end like any other bad input: one line, exit code 1 (argparse's own is 2,
    which here means an unsupported model)."""

    def error(self, message):
        print(f"gir: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_INPUT)


def _at_least(option: str, least: int, what: str):
    """An argparse type: a whole number >= least (a bad one is a usage error, exit 1)."""
    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"{option} takes a whole number of {what} >= {least}, not {text!r}")
        return int(text)
    return parse


_jobs = _at_least("--jobs", 1, "processes")


def parser() -> argparse.ArgumentParser:
    from gir.backends.registry import HOST_TARGET, PLAN_TARGET
    ap = _Parser(prog="gir", description="Fuse the memory-intensive part of an ONNX model into GIR kernels.")
    ap.add_argument("--version", action="version", version=f"gir {_release()}")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("targets", help="list hardware targets").set_defaults(fn=cmd_targets)

    def common(p, target=PLAN_TARGET):
        p.add_argument("model", help="ONNX file")
        p.add_argument("--target", default=target, help=f"a target name (`gir targets` lists them; default {target})")
        p.add_argument("--limit", type=_at_least("--limit", 1, "structures"), default=4,
                       help="parallel structures searched per fused group (>= 1)")
        p.add_argument("--shape", action="append", type=_shape, metavar="NAME=DIMS",
                       help="bind symbolic dims: an input's shape (input_ids=1x128) or one dim by its "
                            "dim_param (seq=128); repeatable")
        p.add_argument("--quiet", action="store_true", help="no progress output")
        p.add_argument("--verbose", action="store_true",
                       help="also show phase times and cache hits; explain: GIR before/after rewriting and the rule log")

    p = sub.add_parser("explain", help="partition, fused kernels, rewrite log, DRAM bytes")
    common(p)
    p.add_argument("--node", help="only the subgraph holding this basic op (shows its GIR and rules)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("run", help="run the model through gir.Session on inputs")
    common(p, HOST_TARGET)
    p.add_argument("--engine", choices=("native", "interpreter"), default="native",
                   help="native: the target's compiled kernels (default); interpreter: the reference interpreter")
    p.add_argument("--inputs", help=".npz with one array per model input (default: seeded random)")
    p.add_argument("-o", "--output", help="write the outputs, one array per output, to exactly this file (.npz format)")
    p.add_argument("--repeat", type=_at_least("--repeat", 1, "runs"), default=0,
                   help="run N more times and print the latency (median, min)")
    p.add_argument("--profile", action="store_true",
                   help="host engines: time each kernel and library op alone (median of --repeat runs, default 20) and print "
                        "its GB/s against this machine's copy bandwidth")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("compile", help="emit and compile every kernel; write plan.json and the report")
    common(p)
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--jobs", type=_jobs, default=1, help="kernels compiled in parallel (processes)")
    p.set_defaults(fn=cmd_compile)
    p = sub.add_parser("cache", help="the persistent compile cache ($GIR_CACHE_DIR, default ~/.cache/gir)")
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("info", help="entries, bytes and folder per kind of entry")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(fn=cmd_cache_info)
    actions.add_parser("clear", help="remove every entry").set_defaults(fn=cmd_cache_clear)
    p = sub.add_parser("calibrate", help="measure this CPU for the time model (stored with the compile cache)")
    p.add_argument("--show", action="store_true", help="print the stored figures instead of measuring")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(fn=cmd_calibrate)
    p = sub.add_parser("port", help="porting kit (docs/PORTING.md)")
    q = p.add_subparsers(dest="action", required=True).add_parser("new", help="scaffold a backend folder")
    q.add_argument("name", help="the backend's name (a Python package name)")
    q.add_argument("--dir", help="write DIR/NAME instead of gir/backends/NAME")
    q.set_defaults(fn=cmd_port_new)
    return ap


def _release() -> str:
    from gir.cache import gir_release, gir_version
    return f"{gir_release()} (sources {gir_version().rsplit('+', 1)[-1]})"


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (a kernel that spills, ...) as one line each, like the errors."""
    print(f"gir: warning: {str(message).splitlines()[0] if str(message) else category.__name__}", file=file or sys.stderr)


def main(argv=None) -> int:
    shown, warnings.showwarning = warnings.showwarning, _warning_line
    try:
        return _main(argv)
    finally:
        warnings.showwarning = shown


def _main(argv) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # plain `gir`: what a newcomer types first; help, and success
        parser().print_help()
        return EXIT_OK
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
        if os.environ.get("GIR_TRACEBACK") == "1":  # the trace, same exit code
            traceback.print_exc()
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
