"""Every oneDNN choice of a CPU session's library ops, timed alone: what `onednn.prepare` picks
from (layout: blocked, plain NCHW, or a 1x1 conv as a matmul; one thread or the pool's; the
epilogue as post-ops or apart), and what it picked.

    PYTHONPATH=. python3 scripts/library_choices.py MODEL.onnx [--ops NAME ...] [--out results/library_choices]

Each choice is made with `onednn._prepare` and timed with `onednn.timed` (zeroed operands,
fastest of 5 runs after one, best of 3) with the pool awake; a choice oneDNN refuses is listed
with its reason. Prints a Markdown table per op (fastest first); --out also writes OUT.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import onnx

from gir.frontend.basic import BasicOp
from gir.runtime import Session, onednn


def table(session: Session, names: list[str] | None) -> str:
    engine, g = session.engine, session.plan.graph
    out = []
    for call in engine.calls:
        if not isinstance(call, BasicOp) or names and call.name not in names:
            continue
        rows = []
        for blocked, threads, separate in onednn.candidate_choices(call, g.tensors, (0, 1)):
            made = onednn._prepare(call, g.tensors, engine.constants, blocked, threads, separate)
            layout = "as a matmul" if blocked == onednn.MATMUL else "blocked" if blocked else "plain"
            what = f"{layout}, {'one thread' if threads == 1 else 'pool'}, {'epilogue apart' if separate else 'post-ops'}"
            if isinstance(made, str):
                rows.append((float("inf"), what, made))
                continue
            us = min(onednn.timed(made, call, g.tensors, repeat=5) for _ in range(3)) * 1e6
            rows.append((us, what, made.impl))
        shapes = " ".join(str(tuple(g.tensors[n].shape)) for n in call.inputs[:2])
        out.append(f"### {call.name} {shapes}\n\nchosen: {engine.library_ops[call.name]}\n\n| us | choice | oneDNN kernel |\n|---|---|---|")
        out += [f"| {'-' if us == float('inf') else f'{us:.0f}'} | {what} | {impl} |" for us, what, impl in sorted(rows)]
        out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ops", nargs="*")
    ap.add_argument("--out")
    args = ap.parse_args()
    if onednn.library() is None:
        print(f"oneDNN is not available: {onednn.unavailable()}", file=sys.stderr)
        return 1
    session = Session(onnx.load(args.model), target="cpu", plan_cache=None)
    text = table(session, args.ops)
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(f"# oneDNN choices of library ops, each timed alone\n\n`{' '.join(['python3'] + sys.argv)}`, "
                    f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} cores, "
                    f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
