#!/usr/bin/env bash
# Installs everything GIR and its test suite need on a fresh Debian machine (no GPU needed).
# Idempotent: a second run only checks. Pins live in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

# HIP compiler: Debian 12's ROCm 5.2 hiprtc (lives in libamdhip64.so.5; gir/backends/hip/compiler.py
# points hip-python at it, so no symlink or LD_LIBRARY_PATH is needed), and g++ with OpenMP for the
# CPU harness that runs emitted CUDA/HIP kernels; PoCL, the CPU OpenCL device of the OpenCL backend.
# apt-get update only when a package is unknown.
pkgs=(g++ hipcc libamdhip64-dev libhiprtc-builtins5 rocm-device-libs libamd-comgr2 pocl-opencl-icd ocl-icd-libopencl1)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    apt-cache show "${missing[@]}" >/dev/null 2>&1 || $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python3 - <<'PY'
from gir.backends.cuda.compiler import compile_cuda
from gir.backends.hip.compiler import compile_hip
src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }'
compile_cuda(src, "sm_90")
compile_hip(src, "gfx90a")
print("setup.sh: NVRTC (sm_90) and hiprtc (gfx90a) compile")
import platform
from gir.runtime import onednn
if onednn.library() is None and (platform.system(), platform.machine()) == ("Linux", "x86_64"):
    raise SystemExit(f"setup.sh: oneDNN for the CPU engine's library ops: {onednn.unavailable()}")
print(f"setup.sh: CPU engine library ops on {onednn.version() and 'oneDNN ' + onednn.version() or 'numpy'}")
PY
