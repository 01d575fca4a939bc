#!/usr/bin/env bash
# Everything that needs a real NVIDIA GPU, in one command, for a machine lent for minutes:
# the versions GIR runs against, the gpu-marked tests, the time model's ranking of candidate
# kernels measured on the GPU (scripts/perf_model_rank.py --target cuda:sm_90), then
# scripts/bench_gpu.py.
#
#   bash scripts/gpu_check.sh OUTDIR [bench_gpu.py options...]
#
# Each stage has its own time limit (GPU_TESTS_S, GPU_RANK_S, GPU_BENCH_S seconds; 0 skips a
# stage) so that a hang in one still leaves the others' logs in OUTDIR; the ranking's files
# land in OUTDIR/rank.tgz. The exit status is the tests' (0 when they pass).
set -u
out=${1:?usage: gpu_check.sh OUTDIR [bench_gpu options]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 - <<'EOF'
from importlib import metadata
for dist in ("cuda-bindings", "cuda-core", "nvidia-cuda-nvrtc", "nvidia-cublas", "nvmath-python", "nvidia-cudnn-cu13",
             "nvidia-cudnn-frontend", "numpy", "onnx", "onnxruntime", "networkx", "torch", "onnx2torch"):
    try:
        print(f"{dist}=={metadata.version(dist)}")
    except metadata.PackageNotFoundError:
        print(f"{dist}: not installed")
try:
    from gir.backends.cuda.launcher import CudaLauncher
    launcher = CudaLauncher()
    print("convolution library:", launcher.open_conv() or launcher.conv_note)
except Exception as e:  # noqa: BLE001 -- a report line, not the end of the check
    print("convolution library: error:", e)
EOF
} 2>&1 | tee "$out/env.txt"

timeout "${GPU_TESTS_S:-240}" python3 -m pytest -q -rsP -m gpu -p no:cacheprovider tests/test_toolchain.py \
  tests/test_session.py tests/test_device_runtime.py tests/test_gpu_epilogue.py 2>&1 | tee "$out/tests.txt"
tests=${PIPESTATUS[0]}

if [ "${GPU_RANK_S:-150}" != 0 ]; then
  rank=$(mktemp -d)
  timeout "${GPU_RANK_S:-150}" python3 scripts/perf_model_rank.py --target cuda:sm_90 --count 24 --out-dir "$rank" \
    --subgraphs softmax attention layernorm gelu gemv dwconv_silu 2>&1 | tee "$out/rank.txt"
  tar czf "$out/rank.tgz" -C "$rank" .
fi

if [ "${GPU_BENCH_S:-300}" != 0 ]; then
  timeout "${GPU_BENCH_S:-300}" python3 scripts/bench_gpu.py --out "$out/bench_gpu" "$@" 2>&1 | tee "$out/bench.txt"
fi
exit "$tests"
