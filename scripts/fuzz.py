"""GIR's fuzzer (issue 22): every model gets a correct answer or a clean refusal.

    python3 scripts/fuzz.py --seed 1 --valid 1000 --malformed 1000      # the full run
    python3 scripts/fuzz.py --seed 7 --valid 5 --malformed 20           # a quick slice (CI)
    python3 scripts/fuzz.py --seed 13 --valid 150 --malformed 0 --gpu-targets cuda:sm_90 hip:gfx90a

(a) valid: random graphs of 2-12 ops drawn from every supported op (scripts/fuzz_graphs.py),
    run on the cpu target through the native and the interpreter engines and compared with
    onnxruntime (rtol 2e-3, atol 2e-4, NaN equal to NaN). With --gpu-targets, each graph is
    also planned for those targets, built with their real compilers (NVRTC, hiprtc; no GPU
    needed) and its plan executed on the reference interpreter against onnxruntime: the GPU
    planner, validator and emitters on graphs no zoo model has (a step of dead ops, a block
    reduction over 48 KiB of shared memory, ptxas spilling 24 bytes were found this way).
(b) malformed: a random valid graph, then byte flips, truncation, semantic errors, hostile
    names, external-data abuse, huge and zero dimensions; through `gir explain` and `gir run`.
Every case runs in a subprocess under a time limit and an address-space limit (setrlimit).
Outcomes: ok, refused-1/2/3 (clean refusal, exit code), ort-refused (onnxruntime rejects the
valid graph: not compared), internal (exit 4), timeout, signal, mismatch. Each failing case's
model is saved under --failures for replay (`gir explain FILE`, or `scripts/fuzz.py --replay FILE`);
the table goes to stdout and --summary (results/fuzz.md). Deterministic given --seed.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
from fuzz_graphs import random_model  # noqa: E402

FAILING = ("internal", "timeout", "signal", "mismatch")
RTOL, ATOL = 2e-3, 2e-4


# ---- one valid case, in a worker process ------------------------------------------------------

def _case(path: str):
    """(model, feeds, onnxruntime's outputs), or exit 11 when onnxruntime rejects the model."""
    import onnxruntime as ort
    model = onnx.load(path)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.uniform(-2, 2, [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    try:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        return model, feeds, ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:  # noqa: BLE001
        print(f"onnxruntime rejects it: {str(e).splitlines()[0][:300]}")
        return 11


def _refusal(where: str, e: Exception) -> int:
    """The CLI's exit code for an exception (1/2/3 a clean refusal, 4 internal), said in one line."""
    from gir.backends.errors import ToolchainMissingError
    from gir.frontend import FrontendError, UnsupportedOpError
    from gir.frontend.errors import UnsupportedDtypeError
    if isinstance(e, (UnsupportedOpError, UnsupportedDtypeError, FrontendError, ToolchainMissingError)):
        print(f"{where}: {e}")
        return 2 if isinstance(e, (UnsupportedOpError, UnsupportedDtypeError)) else 1 if isinstance(e, FrontendError) else 3
    print(f"{where}: internal error: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
    return 4


def _differs(where: str, name: str, a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape == b.shape and np.allclose(a.astype(np.float64), b.astype(np.float64), RTOL, ATOL, equal_nan=True):
        return False
    diff = float(np.nanmax(np.abs(a - b))) if a.shape == b.shape and a.size else None
    print(f"{where}: output {name!r} differs from onnxruntime: gir {a.dtype}{list(a.shape)} "
          f"ort {b.dtype}{list(b.shape)} max|diff| {diff}")
    return True


def check_valid(path: str) -> int:
    """Exit 0 when both engines match onnxruntime, 10 on a mismatch, 11 when onnxruntime rejects
    the model, the CLI's codes (1/2/3) when GIR refuses it, 4 on an internal error."""
    from gir.runtime import Session
    case = _case(path)
    if isinstance(case, int):
        return case
    model, feeds, want = case
    for engine in ("native", "interpreter"):
        try:
            got = Session(path, target="cpu", engine=engine, limit=1).run(None, feeds)
        except Exception as e:  # noqa: BLE001 -- classified by _refusal
            return _refusal(engine, e)
        if any(_differs(engine, out.name, a, b) and not _near_tie(model, feeds, out.name, a, b)
               for out, a, b in zip(model.graph.output, got, want)):
            return 10
    return 0


def _near_tie(model, feeds: dict, name: str, got, want) -> bool:
    """Whether a differing output is an ArgMax / ArgMin (through Casts) whose indices both
    point at values within tolerance of each other in onnxruntime's own input to it: a tie
    broken differently. onnxruntime computes a vector loop's tail element by other code than
    the rest (sin(tanh(1)) was 0.69007605 in 32 lanes and 0.6900761 in the 33rd), so its
    ArgMax over equal values can pick the last one (fuzz seed 10, case 119)."""
    import onnxruntime as ort
    producer = {o: n for n in model.graph.node for o in n.output}
    node = producer.get(name)
    while node is not None and node.op_type in ("Cast", "Identity"):
        node = producer.get(node.input[0])
    if node is None or node.op_type not in ("ArgMax", "ArgMin"):
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    axis, keep = attrs.get("axis", 0), attrs.get("keepdims", 1)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_value_info(node.input[0], onnx.TypeProto()))
    x = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"]).run([node.input[0]], feeds)[0]
    axis %= x.ndim
    pick = lambda idx: np.take_along_axis(x, np.asarray(idx).astype(np.int64).reshape(  # noqa: E731
        [*(x.shape[:axis]), 1, *(x.shape[axis + 1:])] if not keep else np.asarray(idx).shape), axis)
    try:
        a, b = pick(got), pick(want)
    except (ValueError, IndexError):
        return False
    if not np.allclose(a, b, RTOL, ATOL, equal_nan=True):
        return False
    print(f"  {name!r}: a tie in {node.op_type}'s input, broken differently (values within tolerance): accepted")
    return True


def check_gpu(path: str, target_name: str) -> int:
    """`check_valid` for a GPU target without a GPU: plan, build every kernel with the target's
    compiler, run the plan on the reference interpreter and the emitted kernels on the CPU
    harness. 3 when the compiler is missing."""
    from gir.build import build_steps
    from gir.frontend import load
    from gir.fusion.plan import plan
    from gir.ir.target import get_target
    from gir.runtime import execute
    case = _case(path)
    if isinstance(case, int):
        return case
    model, feeds, want = case
    try:
        p = plan(load(model), get_target(target_name), limit=1)
        build_steps(p)
        env = execute(p, feeds)
        got = dict(zip([o.name for o in model.graph.output], _on_harness(path, target_name, feeds)))
    except Exception as e:  # noqa: BLE001 -- classified by _refusal
        return _refusal(target_name, e)
    for out, b in zip(model.graph.output, want):
        if _differs(f"{target_name} on the interpreter", out.name, env[out.name], b) or \
                _differs(f"{target_name}, emitted kernels", out.name, got[out.name], b):
            return 10
    return 0


def _on_harness(path: str, target_name: str, feeds: dict) -> list:
    """The Session's outputs on the GPU target with its device runtime on the recording stand-in:
    the emitted kernels compiled for and run on the CPU harness (gir/backends/harness)."""
    from gir.backends import device_engine
    from gir.backends.harness.recording import RecordingLauncher, harness_toolchain
    from gir.runtime import Session
    launcher = RecordingLauncher(dialect=target_name.split(":")[0])
    device_engine.open_launcher, device_engine._toolchain = (lambda backend: launcher), harness_toolchain
    return Session(path, target=target_name, limit=1).run(None, feeds)


# ---- malformed models ----------------------------------------------------------------------------

def _byte_flips(rng, data, folder):
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def _truncate(rng, data, folder):
    return data[:rng.randrange(len(data))]


def _semantic(rng, model, folder):
    g = model.graph
    kind = rng.choice(("dangling_input", "duplicate_output", "bad_attr", "wrong_dtype", "missing_output",
                       "bad_opset", "cycle", "bad_init_data", "unknown_op", "negative_dim"))
    node = rng.choice(list(g.node))
    if kind == "dangling_input":
        node.input.append("nowhere")
    elif kind == "duplicate_output":
        g.node.append(helper.make_node("Relu", [g.input[0].name], [node.output[0]]))
    elif kind == "bad_attr":
        node.attribute.append(helper.make_attribute(rng.choice(("axis", "perm", "to", "mode")), rng.choice((99, -99, "x"))))
    elif kind == "wrong_dtype":
        g.input[0].type.tensor_type.elem_type = rng.choice((TensorProto.STRING, TensorProto.INT64, 99))
    elif kind == "missing_output":
        g.output.append(helper.make_tensor_value_info("never", TensorProto.FLOAT, [1]))
    elif kind == "bad_opset":
        model.opset_import[0].version = rng.choice((0, 1, 999))
    elif kind == "cycle":
        g.node[0].input.append(g.node[-1].output[0])
    elif kind == "bad_init_data" and g.initializer:
        t = rng.choice(list(g.initializer))
        t.raw_data = t.raw_data[: len(t.raw_data) // 2] + (b"\0" * rng.randint(0, 64))
    elif kind == "unknown_op":
        node.op_type = rng.choice(("NoSuchOp", "Loop", "RandomNormal", ""))
    else:
        d = g.input[0].type.tensor_type.shape.dim
        d[rng.randrange(len(d))].dim_value = -rng.randint(1, 5)
    return model.SerializeToString()


def _hostile_names(rng, model, folder):
    names = ["", "\0nul", "a\nb", "../../etc/passwd", "x" * 100000, "%s%n", "\u202e\u0000", "名前", "'; rm -rf /"]
    name = rng.choice(names)
    kind = rng.randrange(3)
    if kind == 0:
        old = model.graph.output[0].name
        model.graph.output[0].name = name
        for n in model.graph.node:
            n.output[:] = [name if o == old else o for o in n.output]
    elif kind == 1:
        model.graph.node[0].name = name
        model.graph.name = name
    data = model.SerializeToString()
    if kind == 2:  # a name that is not valid UTF-8
        old = model.graph.input[0].name.encode()
        data = data.replace(old, b"\xff\xfe" + old[2:]) if len(old) > 2 else data
    return data


def _external(rng, model, folder):
    if not model.graph.initializer:
        model.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "unused_w"))
    t = rng.choice(list(model.graph.initializer))
    os.makedirs(os.path.join(folder, "sub"), exist_ok=True)
    nbytes = len(t.raw_data) or 4
    with open(os.path.join(folder, "sub", "w.bin"), "wb") as f:
        f.write(t.raw_data + b"\0" * 8)
    case = rng.choice(("traversal", "absolute", "symlink_out", "fifo", "dev_zero", "proc_self_mem",
                       "beyond", "missing", "ok", "negative_offset", "folder"))
    location, offset, length = {
        "traversal": ("../../../../etc/passwd", None, None), "absolute": ("/etc/passwd", None, None),
        "symlink_out": ("link", None, None), "fifo": ("fifo", None, None), "dev_zero": ("/dev/zero", 0, nbytes),
        "proc_self_mem": ("/proc/self/mem", 4096, nbytes), "beyond": ("sub/w.bin", 16, nbytes),
        "missing": ("nothing.bin", None, None), "ok": ("sub/w.bin", 0, nbytes),
        "negative_offset": ("sub/w.bin", -4, nbytes), "folder": ("sub", None, None)}[case]
    if case == "symlink_out":
        os.symlink("/etc/passwd", os.path.join(folder, "link"))
    if case == "fifo":
        os.mkfifo(os.path.join(folder, "fifo"))
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            t.external_data.add(key=key, value=str(value))
    return model.SerializeToString()


def _dimensions(rng, model, folder):
    d = model.graph.input[0].type.tensor_type.shape.dim
    d[rng.randrange(len(d))].dim_value = rng.choice((0, 2**31, 2**40, 2**62))
    return model.SerializeToString()


MUTATIONS = {"byte_flip": _byte_flips, "truncate": _truncate, "semantic": _semantic,
             "hostile_name": _hostile_names, "external_data": _external, "dimension": _dimensions}


def malformed_case(seed: int, i: int, folder: str) -> tuple[str, str]:
    rng = random.Random(seed * 1_000_003 + 500_009 + i)
    model, _ = random_model(rng)
    kind = rng.choice(sorted(MUTATIONS))
    mutate = MUTATIONS[kind]
    raw = kind in ("byte_flip", "truncate")
    data = mutate(rng, model.SerializeToString() if raw else model, folder)
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(data)
    return path, kind


# ---- running under limits ------------------------------------------------------------------------

def _limits(memory_bytes: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        os.setpgrp()
    return apply


def run_limited(cmd: list[str], timeout: float, memory_bytes: int, cwd: str) -> tuple[str, int, str]:
    """(outcome, exit code, last line of output); the whole process group is killed on timeout."""
    # the case runs in its own folder: this checkout's gir first, installed or not
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", GIR_CACHE_DIR=os.path.join(cwd, ".cache"), PYTHONPATH=path)
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=_limits(memory_bytes))
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        return "timeout", -9, out.decode(errors="replace").strip().splitlines()[-1:] and \
            out.decode(errors="replace").strip().splitlines()[-1] or ""
    text = out.decode(errors="replace").strip()
    last = text.splitlines()[-1] if text else ""
    code = proc.returncode
    if code < 0:
        return "signal", code, last
    if "Traceback (most recent call last)" in text:
        return "internal", code, last
    return {0: "ok", 1: "refused-1", 2: "refused-2", 3: "refused-3", 4: "internal", 10: "mismatch",
            11: "ort-refused"}.get(code, "internal"), code, last


def _save(failures: Path, name: str, folder: str, detail: dict) -> None:
    dest = failures / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(folder, dest, symlinks=True, ignore=lambda d, names: [n for n in names if n in (".cache", "fifo")])
    (dest / "case.json").write_text(json.dumps(detail, indent=1))


def fuzz(args) -> dict:
    failures = Path(args.failures)
    counts = {"valid": collections.Counter(), "malformed": collections.Counter()}
    found, ops_seen = [], collections.Counter()
    me = os.path.abspath(__file__)
    mem = int(args.memory_gb * 2**30)
    order = [(valid, k) for k in range(max(args.valid, args.malformed))
             for valid, n in ((True, args.valid), (False, args.malformed)) if k < n]  # interleaved
    began = time.perf_counter()
    for done, (valid, i) in enumerate(order, 1):
        with tempfile.TemporaryDirectory(prefix="gir-fuzz-") as folder:
            if valid:
                model, ops = random_model(random.Random(args.seed * 1_000_003 + i))
                ops_seen.update(ops)
                path = os.path.join(folder, "model.onnx")
                onnx.save(model, path)
                runs = [("compare", [sys.executable, me, "--check-valid", path])]
                runs += [(f"gpu-{t}", [sys.executable, me, "--check-gpu", path, t]) for t in args.gpu_targets]
                kind = "+".join(ops)
            else:
                path, kind = malformed_case(args.seed, i, folder)
                runs = [(cmd, [sys.executable, "-m", "gir.cli", cmd, path, "--target", "cpu", "--quiet"])
                        for cmd in ("explain", "run")]
            for cmd_name, cmd in runs:
                start = time.perf_counter()
                outcome, code, last = run_limited(cmd, args.timeout, mem, folder)
                seconds = time.perf_counter() - start
                group = "valid" if valid else "malformed"
                counts[group][outcome] += 1
                if outcome in FAILING:
                    name = f"{group}-{args.seed}-{i}-{cmd_name}"
                    detail = dict(group=group, seed=args.seed, case=i, kind=kind, command=cmd_name, outcome=outcome,
                                  exit=code, seconds=round(seconds, 2), message=last[:500])
                    _save(failures, name, folder, detail)
                    found.append(detail)
                    print(f"  {outcome}: {name} ({kind}): {last[:200]}", flush=True)
        if args.progress and done % args.progress == 0:
            print(f"[{done}/{len(order)}] {dict(counts['valid'])} {dict(counts['malformed'])}", flush=True)
            _write(args, table(args, dict(counts=counts, found=found, ops=ops_seen), time.perf_counter() - began,
                               f"partial: {done} of {len(order)} cases so far"))
    return dict(counts=counts, found=found, ops=ops_seen)


def _write(args, text: str) -> None:
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(text)


def table(args, result, seconds, note: str = "complete") -> str:
    outcomes = ["ok", "refused-1", "refused-2", "refused-3", "ort-refused", *FAILING]
    lines = [f"# GIR fuzz run: seed {args.seed}, {args.valid} valid graphs, {args.malformed} malformed models",
             "", f"Command: `python3 scripts/fuzz.py --seed {args.seed} --valid {args.valid} --malformed "
             f"{args.malformed} --timeout {args.timeout:g} --memory-gb {args.memory_gb:g}"
             f"{' --gpu-targets ' + ' '.join(args.gpu_targets) if args.gpu_targets else ''}` ({seconds:.0f} s, {note})", "",
             "| runs | " + " | ".join(outcomes) + " |", "|---|" + "---|" * len(outcomes)]
    for group in ("valid", "malformed"):
        c = result["counts"][group]
        lines.append(f"| {group} | " + " | ".join(str(c.get(o, 0)) for o in outcomes) + " |")
    lines += ["", "Valid runs compare both engines with onnxruntime (and, per GPU target, the plan built with its "
              "compiler and run on the interpreter); malformed runs are `gir explain` and "
              "`gir run` per model.", "", f"Ops drawn in valid graphs: {len(result['ops'])} distinct, "
              f"{sum(result['ops'].values())} in all.", "", "## Failures", ""]
    lines += [f"- {f['outcome']} `{f['group']}-{f['seed']}-{f['case']}-{f['command']}` ({f['kind']}): {f['message']}"
              for f in result["found"]] or ["None."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--valid", type=int, default=20, help="random valid graphs")
    p.add_argument("--malformed", type=int, default=50, help="malformed models")
    p.add_argument("--timeout", type=float, default=60, help="seconds per run")
    p.add_argument("--memory-gb", type=float, default=4, help="address-space limit per run")
    p.add_argument("--failures", default="results/fuzz_failures", help="folder for failing cases")
    p.add_argument("--summary", default="results/fuzz.md")
    p.add_argument("--progress", type=int, default=0, help="print counts every N cases")
    p.add_argument("--gpu-targets", nargs="*", default=[], metavar="TARGET",
                   help="also plan, build (no GPU needed) and interpret each valid graph for these targets")
    p.add_argument("--check-valid", metavar="MODEL", help=argparse.SUPPRESS)
    p.add_argument("--check-gpu", nargs=2, metavar=("MODEL", "TARGET"), help=argparse.SUPPRESS)
    p.add_argument("--replay", metavar="MODEL", help="compare one saved valid graph with onnxruntime")
    args = p.parse_args(argv)
    if args.check_gpu:
        return check_gpu(*args.check_gpu)
    if args.check_valid or args.replay:
        code = check_valid(args.check_valid or args.replay)
        if args.replay:
            print({0: "ok", 10: "mismatch", 11: "onnxruntime rejects it"}.get(code, f"exit {code}"))
        return code
    start = time.perf_counter()
    result = fuzz(args)
    text = table(args, result, time.perf_counter() - start)
    print(text)
    _write(args, text)
    return 1 if result["found"] else 0


if __name__ == "__main__":
    sys.exit(main())
