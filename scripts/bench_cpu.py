"""CPU latency of gir.Session and onnxruntime, each runtime alone in its own process.

    PYTHONPATH=. python3 scripts/bench_cpu.py [--models NAME ...] [--threads 1 0] [--runs 20]
        [--rounds 1] [--runtimes gir ort] [--before CHECKOUT] [--tiny] [--out results/bench_cpu]

Per (model, thread count, runtime) one fresh process builds the model, creates the session
(GIR's plan cache is the persistent one, so only the first process of a model searches),
runs once to warm up, then reports the median of --runs runs and its peak resident memory.
Runtimes: `gir` (library ops through oneDNN where installed), `gir-numpy` (the numpy
fallback, GIR_CPU_LIBRARY=numpy) and `ort` (onnxruntime's CPUExecutionProvider). Threads 0
means each runtime's default; 1 sets OMP_NUM_THREADS=1 (GIR's OpenMP and oneDNN, OpenBLAS)
and onnxruntime's intra_op_num_threads=1. Prints a table of GIR/onnxruntime ratios; --out
writes OUT.json and OUT.md. Nothing is paired: interleaving runtimes in one process slows
the one after a run of the other (issue 25). --rounds R repeats the processes of one model and
thread count R times, runtimes in turn, and keeps each runtime's fastest median: on a machine
shared with other work, a slow round is another process's load, not the runtime's.
--busy also times each runtime while a CPU-bound process (a pure Python loop) holds one core,
right after its idle process, and prints busy/idle per runtime (issue 25 asks <= 2.5x).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

RUNTIMES = ("gir", "gir-numpy", "ort")  # and gir-before with --before


def child(name: str, runtime: str, threads: int, runs: int, tiny: bool) -> dict:
    import resource

    import numpy as np
    import models
    from models.exported_files import EXPORTED, input_shapes, manifest, reference
    exported = manifest().get(name)
    if exported:  # a torch.onnx export (models/exported/): its file, and the inputs PyTorch ran
        model, shapes = str(EXPORTED / exported["file"]), input_shapes(exported)
        feeds = reference(exported)[0]
    else:
        model, shapes = (models.load_bundled(name) if tiny else models.build(name)), None
        feeds = models.example_inputs(model, 0)
    start = time.perf_counter()
    if runtime == "ort":
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        session = ort.InferenceSession(model if exported else model.SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        path = "onnxruntime"
    else:
        import gir
        from gir.cache import Store, gir_version
        from gir.ir import get_target
        store = Store("plan", gir_version(), repr(get_target("cpu")), 2)
        session = gir.Session(model, target="cpu", plan_cache=store, input_shapes=shapes)
        path = getattr(session.engine, "library_path", "numpy")
    ready = time.perf_counter() - start
    session.run(None, feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t)
    return {"model": name, "runtime": runtime, "threads": threads, "ms": float(np.median(times)) * 1e3,
            "session_s": ready, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "path": path}


class Hog:
    """A CPU-bound process for the duration of a `with` block: one core is taken."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)  # let it reach the scheduler's run queue
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def _before_cache(before: str) -> str:
    """The earlier checkout's own compile cache, holding this machine's CPU calibration (`gir
    calibrate`): without it that tree plans with the nominal constants (another ridge point:
    other convs and matmuls in the library), and the before/after table compares two plans."""
    from gir.cache import cache_root
    cache, mine = Path(before) / ".bench-cache", cache_root() / "calibration"
    if mine.is_dir() and not (cache / "calibration").is_dir():
        shutil.copytree(mine, cache / "calibration")
    return str(cache)


def measure(name: str, runtime: str, threads: int, runs: int, tiny: bool, before: str | None = None,
            extra_env: dict | None = None) -> dict:
    """One child process. `gir-before`: GIR from the checkout `before` (PYTHONPATH and its own
    compile cache under it), for before/after tables. `extra_env`: set in the child (a value of
    None removes the variable), e.g. OpenMP's wait settings (omp_wait_ab.py)."""
    env = dict(os.environ)
    for key, value in (extra_env or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    if runtime == "gir-before":
        env.update(PYTHONPATH=before, GIR_CACHE_DIR=_before_cache(before))
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if runtime == "gir-numpy":
        env["GIR_CPU_LIBRARY"] = "numpy"
    child_runtime = "gir" if runtime == "gir-before" else runtime
    cmd = [sys.executable, __file__, "--child", name, child_runtime, str(threads), str(runs)] + (["--tiny"] if tiny else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        return {"model": name, "runtime": runtime, "threads": threads, "error": proc.stderr.strip().splitlines()[-1:]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "runtime": runtime}


def table(rows: list[dict], runtimes: list[str]) -> str:
    by = {(r["model"], r["threads"], r["runtime"]): r for r in rows}
    gir_runtimes = [r for r in runtimes if r != "ort"]
    busy = any("busy_ms" in r for r in rows)
    head = (["model", "threads"] + [f"{r} ms" for r in runtimes] + [f"{r}/ort" for r in gir_runtimes]
            + ([f"{r} busy ms (busy/idle)" for r in runtimes] if busy else [])
            + [f"{r} peak MB" for r in runtimes])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, threads in dict.fromkeys((r["model"], r["threads"]) for r in rows):
        cells = [model, str(threads or "default")]
        ms = {rt: by.get((model, threads, rt), {}).get("ms") for rt in runtimes}
        cells += [f"{ms[rt]:.2f}" if ms[rt] else "error" for rt in runtimes]
        cells += [f"{ms[rt] / ms['ort']:.2f}x" if ms[rt] and ms.get("ort") else "" for rt in gir_runtimes]
        if busy:
            slow = {rt: by.get((model, threads, rt), {}).get("busy_ms") for rt in runtimes}
            cells += [f"{slow[rt]:.2f} ({slow[rt] / ms[rt]:.2f}x)" if slow[rt] and ms[rt] else "" for rt in runtimes]
        cells += [f"{by[(model, threads, rt)]['peak_mb']:.0f}" if ms[rt] else "" for rt in runtimes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, name, runtime, threads, runs, *rest = sys.argv
        print(json.dumps(child(name, runtime, int(threads), int(runs), "--tiny" in rest)))
        return
    sys.path.insert(0, os.getcwd())
    import models
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=[n for n in models.MODELS if n != "gpt2_b128"])
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 0])
    ap.add_argument("--runtimes", nargs="*", default=["gir", "ort"], choices=RUNTIMES)
    ap.add_argument("--before", metavar="CHECKOUT", help="also time GIR from this checkout (`gir-before`), "
                    "e.g. an earlier commit unpacked with git archive")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--exported", action="store_true", help="the torch.onnx exports of models/exported/ instead")
    ap.add_argument("--busy", action="store_true", help="also time each runtime with one core taken by another process")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.exported:
        from models.exported_files import manifest
        args.models = list(manifest())
    runtimes = (["gir-before"] if args.before else []) + args.runtimes
    rows = []
    for name in args.models:
        for rt in runtimes:  # plans once (the session cache), so later processes' peak memory is a run's
            if rt.startswith("gir"):
                measure(name, rt, 0, 1, args.tiny, args.before)
        for threads in args.threads:
            best = {}
            for _ in range(args.rounds):
                for runtime in runtimes:
                    row = measure(name, runtime, threads, args.runs, args.tiny, args.before)
                    if args.busy and "ms" in row:
                        with Hog():
                            row["busy_ms"] = measure(name, runtime, threads, args.runs, args.tiny, args.before).get("ms")
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    if runtime not in best or row.get("ms", float("inf")) < best[runtime].get("ms", float("inf")):
                        best[runtime] = row
            rows += best.values()
    text = table(rows, runtimes)
    print(text)
    if args.out:
        write_results(args.out, "GIR and onnxruntime on the CPU, each alone in its own process", rows, text,
                      f"median of {args.runs} runs after one warm-up, fastest of {args.rounds} round(s)"
                      + ("; busy: the same, while a pure-Python loop in another process holds a core" if args.busy else ""))


def write_results(out: str, title: str, rows: list[dict], table_text: str, method: str) -> None:
    """OUT.json (the rows) and OUT.md (title, the command, date, cores, `method`, the table)."""
    with open(out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(f"# {title}\n\n`{' '.join(['python3'] + sys.argv)}`, {time.strftime('%Y-%m-%d %H:%M')} UTC, "
                f"{os.cpu_count()} cores; {method}.\n\n{table_text}\n")


if __name__ == "__main__":
    main()
