"""Every kernel of a model's GPU plan compiled with the target's real compiler (NVRTC, hiprtc;
no GPU needed), with what it reports: kernels that spill and the most registers any uses.

    PYTHONPATH=. python3 scripts/gpu_spills.py MODEL.onnx [...] [--target cuda:sm_90] [--limit 2]

An exported model with symbolic dims takes its input shapes from the .npz beside it (models/
exported). Prints one line per model, and one per kernel that spills or uses over 80% of the
registers its block leaves a thread.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np
import onnx

from gir.backends.registry import compiler
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir.target import get_target


def check(path: str, target_name: str, limit: int) -> bool:
    t = get_target(target_name)
    proto = onnx.load(path)
    npz = os.path.splitext(path)[0] + ".npz"
    names = {i.name for i in proto.graph.input}
    shapes = {k: v.shape for k, v in np.load(npz).items() if k in names} if os.path.exists(npz) else None
    p = plan(load(proto, input_shapes=shapes), t, limit=limit)
    kernels, spilled, most = 0, 0, 0
    for step in p.steps:
        g = getattr(step, "graph", None)
        if g is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # counted below
            built = compiler(t).compile(g, t)
        for k in built.kernels:
            res = built.binary.resources[k.name]
            regs = res.registers
            kernels, spilled, most = kernels + 1, spilled + res.spilled, max(most, regs)
            if res.spilled or regs * k.block_threads > 0.8 * (t.register_file_bytes // 4):
                print(f"  {k.name}: {k.block_threads} threads, {regs} registers, {res.stack_bytes} bytes of stack"
                      f"{', spills' if res.spilled else ''}")
    print(f"{os.path.basename(path)} on {target_name}: {kernels} kernels, {spilled} spill, at most {most} registers",
          flush=True)
    return spilled == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--target", default="cuda:sm_90")
    ap.add_argument("--limit", type=int, default=2)
    args = ap.parse_args()
    return 0 if all([check(m, args.target, args.limit) for m in args.models]) else 1


if __name__ == "__main__":
    sys.exit(main())
