"""Full-size zoo models on a GPU target through the device runtime on the recording stand-in
(gir/backends/harness/recording.py: GIR's kernels on the CPU harness, GEMMs and convolutions in
numpy with cuBLAS's and cuDNN's conventions), against onnxruntime. Checks, without a GPU, the
plans and library calls a GPU would run (CI does the same on the bundled tiny models:
tests/test_device_runtime.py). Prints one line per model: the ops the time check gave back to
the library, the library path and the largest error relative to the output's largest value.

    PYTHONPATH=. python3 scripts/standin_zoo.py [--target cuda:sm_90] MODEL ...
"""
import argparse
import time

import numpy as np
import onnxruntime as ort

import gir
import models
from gir.backends import device_engine as device
from gir.backends.harness.recording import RecordingLauncher, harness_toolchain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--target", default="cuda:sm_90")
    args = ap.parse_args()
    for name in args.models:
        launcher = RecordingLauncher(dialect=args.target.split(":")[0])
        device.open_launcher = lambda backend: launcher
        device._toolchain = harness_toolchain
        model = models.build(name)
        feeds = models.example_inputs(model, 0)
        start = time.perf_counter()
        session = gir.Session(model, target=args.target)
        got = session.run(None, feeds)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        err = max(float(np.abs(g.astype(np.float64) - w).max() / max(1.0, float(np.abs(w).max())))
                  for g, w in zip(got, want))
        given = sum(d.given_back for d in session.plan.partition.decisions)
        print(f"{name} on {args.target}: {given} ops given back to the library; {session.engine.library_path}; "
              f"max rel err {err:.2e} ({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
