#!/usr/bin/env bash
# Everything that needs a real NVIDIA GPU, in one command, for a machine lent for minutes:
# the versions GIR runs against, the gpu-marked tests, then scripts/bench_gpu.py.
#
#   bash scripts/gpu_check.sh OUTDIR [bench_gpu.py options...]
#
# Each stage has its own time limit (GPU_TESTS_S, GPU_BENCH_S seconds) so that a hang in one
# still leaves the others' logs in OUTDIR; the exit status is the tests' (0 when they pass).
set -u
out=${1:?usage: gpu_check.sh OUTDIR [bench_gpu options]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 - <<'EOF'
from importlib import metadata
for dist in ("cuda-bindings", "cuda-core", "nvidia-cuda-nvrtc", "nvidia-cublas", "nvmath-python", "numpy",
             "onnx", "onnxruntime", "networkx", "torch", "onnx2torch"):
    try:
        print(f"{dist}=={metadata.version(dist)}")
    except metadata.PackageNotFoundError:
        print(f"{dist}: not installed")
EOF
} 2>&1 | tee "$out/env.txt"

timeout "${GPU_TESTS_S:-240}" python3 -m pytest -q -rs -m gpu -p no:cacheprovider \
  tests/test_toolchain.py tests/test_session.py tests/test_device_runtime.py 2>&1 | tee "$out/tests.txt"
tests=${PIPESTATUS[0]}

timeout "${GPU_BENCH_S:-300}" python3 scripts/bench_gpu.py --out "$out/bench_gpu" "$@" 2>&1 | tee "$out/bench.txt"
exit "$tests"
