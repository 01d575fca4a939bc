"""How fast a gir.Session is ready in a fresh process, before and after a change (issue 25: under
1 s with a warm cache). Writes results/fast_start.md (and .json).

    python scripts/fast_start.py --before REV [--after REV] [--zoo DIR] [--runs 3] [--only NAME ...]
    python scripts/fast_start.py --before X --from-json results/fast_start.json   # the table again

Each revision's `gir/` is extracted with `git archive` into a folder of its own (so its GIR
version, and so its cache keys, stay fixed while the working tree changes) and runs from there
(PYTHONPATH). Per revision and model, a fresh cache folder: one cold process (nothing cached:
load, plan, emit, compile), then `--runs` warm processes, each new, of which the medians are
reported. A process times `import gir; from gir import Session` (the import column), then
`Session(path, target="cpu", plan_cache=Store("plan", gir_version(), repr(get_target("cpu")), 2))`
(the ready column: what the session cache needs to be used, as `gir run` passes it), then runs
the model once on zeros; peak RSS is ru_maxrss after that run. The entry column is the size of
the session cache folder. Python may write bytecode (PYTHONDONTWRITEBYTECODE is unset for the
children), as an installed package has it; PYTHONHASHSEED=0 (see `child`). Models: models/bundled/*.onnx and the zoo's files in
--zoo (built there with `python -m models build` if missing).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ("bert", "gpt2", "gpt2_b128", "vit", "efficientnet_b0", "rednet50", "sardrn", "shufflenet_v2")

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import gir
from gir import Session
t1 = time.perf_counter()
from gir.cache import Store, gir_version
from gir.ir import get_target
cpu = lambda: sum(getattr(resource.getrusage(resource.RUSAGE_SELF), f) for f in ("ru_utime", "ru_stime"))
c1 = cpu()
s = Session(sys.argv[1], target="cpu", plan_cache=Store("plan", gir_version(), repr(get_target("cpu")), 2))
t2 = time.perf_counter()
c2 = cpu()
ready_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
import numpy as np
from gir.ir.dtypes import np_dtype
feeds = {n: np.zeros(s.graph.tensors[n].shape, np_dtype(s.graph.tensors[n].dtype)) for n in s.graph.inputs}
s.run(None, feeds)
print(json.dumps({"import_s": t1 - t0, "ready_s": t2 - t1, "ready_cpu_s": c2 - c1, "cached": s.cached, "gir": gir.__file__,
                  "ready_rss_mb": ready_rss / 1024,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def extract(rev: str, into: Path) -> str:
    """`gir/` (and pyproject.toml) of `rev` in `into`; the commit's id."""
    commit = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit, "gir", "pyproject.toml"], cwd=ROOT, capture_output=True,
                             check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return commit


def child(tree: Path, cache: Path, model: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # one hash seed: before eb973ac a frozenset in the CPU target's repr (56137ba) made every fresh
    # process miss the session cache; the seed lets the 'before' column measure the cache itself
    env.update(PYTHONPATH=str(tree), GIR_CACHE_DIR=str(cache), PYTHONHASHSEED="0")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, str(model)], env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{model.name} ({tree.name}): {done.stderr.strip().splitlines()[-1]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["gir"].startswith(str(tree)):
        raise SystemExit(f"{model.name}: ran {out['gir']}, not the tree {tree}")
    out["process_s"] = time.perf_counter() - start
    out["load"] = os.getloadavg()[0]  # other jobs on the machine, over the last minute
    return out


def measure(tree: Path, model: Path, runs: int, work: Path) -> dict:
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=work))
    cold = child(tree, cache, model)
    warm = [child(tree, cache, model) for _ in range(runs)]
    if cold["cached"] or not all(w["cached"] for w in warm):
        raise SystemExit(f"{model.name} ({tree.name}): cold cached={cold['cached']}, "
                         f"warm cached={[w['cached'] for w in warm]}")
    entry = sum(p.stat().st_size for p in (cache / "session").glob("*.pkl"))
    med = lambda key: statistics.median(w[key] for w in warm)
    return {"cold_s": cold["ready_s"], "import_s": med("import_s"), "ready_s": med("ready_s"),
            "ready_runs_s": [w["ready_s"] for w in warm], "ready_cpu_s": med("ready_cpu_s"), "load": med("load"),
            "entry_mb": entry / 1e6,
            "ready_rss_mb": med("ready_rss_mb"), "peak_rss_mb": med("peak_rss_mb")}


def models(zoo: Path | None, only: list[str]) -> list[Path]:
    paths = sorted((ROOT / "models" / "bundled").glob("*.onnx"))
    if zoo is not None:
        missing = [n for n in ZOO if not (zoo / f"{n}.onnx").exists()]
        if missing:
            subprocess.run([sys.executable, "-m", "models", "build", "--out", str(zoo), "--only", *missing],
                           cwd=ROOT, check=True)
        paths = [zoo / f"{n}.onnx" for n in ZOO] + paths
    return [p for p in paths if not only or p.stem in only]


def table(rows: list[dict], before: str, after: str, command: str) -> str:
    lines = [
        "# Session ready time in a fresh process (issue 25: under 1 s with a warm cache)", "",
        f"`{command}`", "",
        f"Before: {before[:10]}; after: {after[:10]}. CPU target, 2-core VM shared with other jobs. "
        "Cold: the first process, with an empty cache (load, plan, emit, compile). Warm: median of "
        "the next processes, each new, with that cache. Ready: `Session(...)` alone; import: "
        "`import gir; from gir import Session`, reported apart. Entry: the session cache's bytes "
        "for the model. Warm CPU: user + system seconds of the process (every thread) while the session was "
        "made (median), which other jobs on the machine change far less than wall time; load: the one-minute "
        "load average when the warm processes ended (median; the VM has 2 cores). "
        "Peak RSS: ru_maxrss after the session and one run on zeros (warm, median). "
        "Children run with PYTHONHASHSEED=0: at the 'before' revision a frozenset in the CPU target's repr "
        "made every fresh process miss the session cache (fixed by stable_repr in the 'after' one).", "",
        "| model | file MB | cold s before | cold s after | import s after | warm before s | warm after s "
        "| warm CPU s before | warm CPU s after | load before/after | entry before MB | entry after MB "
        "| peak RSS before MB | peak RSS after MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b, a = r["before"], r["after"]
        lines.append(f"| {r['model']} | {r['file_mb']:.1f} | {b['cold_s']:.2f} | {a['cold_s']:.2f} | {a['import_s']:.2f} "
                     f"| {b['ready_s']:.2f} | **{a['ready_s']:.2f}** | {b['ready_cpu_s']:.2f} | {a['ready_cpu_s']:.2f} "
                     f"| {b['load']:.1f}/{a['load']:.1f} | {b['entry_mb']:.1f} | {a['entry_mb']:.1f} "
                     f"| {b['peak_rss_mb']:.0f} | {a['peak_rss_mb']:.0f} |")
    slowest = max(rows, key=lambda r: r["after"]["ready_s"])
    lines += ["", f"Slowest warm start after: {slowest['model']}, {slowest['after']['ready_s']:.2f} s "
                  f"(runs: {', '.join(f'{t:.2f}' for t in slowest['after']['ready_runs_s'])})."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision measured as 'before'")
    ap.add_argument("--after", default="HEAD", help="git revision measured as 'after' (default HEAD)")
    ap.add_argument("--zoo", type=Path, help="folder of the zoo's fp32 models (built there if missing)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "fast_start.md")
    ap.add_argument("--from-json", type=Path, help="only write the table again from a JSON file this script wrote")
    args = ap.parse_args(argv)
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        args.out.write_text(table(data["rows"], data["before"], data["after"], data["command"]))
        return 0
    command = "python scripts/fast_start.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="gir-fast-start-") as tmp:
        work = Path(tmp)
        trees = {}
        for label, rev in (("before", args.before), ("after", args.after)):
            trees[label] = (work / label, extract(rev, work / label))
        rows = []
        for model in models(args.zoo, args.only):
            row = {"model": model.stem, "file_mb": model.stat().st_size / 1e6}
            for label, (tree, _) in trees.items():
                row[label] = measure(tree, model, args.runs, work)
            print(f"{model.stem}: warm {row['before']['ready_s']:.2f} s -> {row['after']['ready_s']:.2f} s", flush=True)
            rows.append(row)
    args.out.write_text(table(rows, trees["before"][1], trees["after"][1], command))
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "before": trees["before"][1],
                                                        "after": trees["after"][1], "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
