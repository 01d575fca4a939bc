"""The NVIDIA targets: A100 (sm_80) and H100 (sm_90), vendor peak figures (nominal, not measured).

Timing sources: clocks, SM counts, schedulers and the resident-block limit from NVIDIA's H100
and A100 datasheets and whitepapers and the CUDA C++ Programming Guide's compute-capability
table. Latencies and achievable bandwidths are public microbenchmark figures, rounded:
  DRAM latency: pointer-chase latency to HBM of about 450-600 ns on A100/H100 (Chips and
    Cheese, "Nvidia's H100: Funny L2, and Tons of Bandwidth", 2023; Luo et al., "Dissecting
    the NVIDIA Hopper Architecture through Microbenchmarking", arXiv:2501.12084); 600 ns is
    taken, loaded latency being above the unloaded one.
  copy efficiency: device-to-device copy / STREAM figures of 3.0-3.1 TB/s on H100 SXM5,
    1.35-1.4 TB/s on A100-40GB (BabelStream results published by the vendor and HPC centres).
  L2 bandwidth: about 5.5 TB/s measured on H100 (Chips and Cheese, same article), ~4.8 TB/s A100.
Block dispatch: 80 ns per block per SM, measured on an H100 80GB HBM3 here (2026-11-25,
  results/perf_model_rank_gpu_gelu.md): the same elementwise kernel with one element per
  warp in 1-, 2- and 4-warp blocks took 239, 121 and 62 us for 393,216 / 196,608 / 98,304
  blocks, about 80 ns per block per SM each time, whatever the block did; the A100 is assumed
  alike (not measured).
loads_in_flight_per_lane (8) and the barrier cost (40 ns) are modelling assumptions: what ptxas
typically batches before the first use, and a __syncthreads of a few dozen clocks. Registers:
255 per thread, the ceiling a kernel may use without forcing spills; shared memory: the
largest per-block allocation.

Library epilogues: a bias, a residual and a ReLU after a library matmul run in its cuBLASLt
call (blas.CUBLASLT_EPILOGUES: what cuBLASLt applies, in its order). Library calls: matmuls in
cuBLASLt, convolutions in cuDNN without an im2col matrix (`library_calls`, fitted to measured
calls below, which the partition's time check reads; without cuDNN installed the runtime falls
back to im2col, not modelled).
"""
from dataclasses import replace

from gir.ir.target import GPU_LAUNCH_S, Timing, gpu_target

from ..blas import CUBLASLT_EPILOGUES

# How the device runtime runs a library op (gir/fusion/partition.py `library_call_seconds`):
# matmuls in cuBLASLt, convolutions in cuDNN without an im2col matrix. The cost of a call is
# fitted to the 360 library calls of the seven zoo models timed alone on an H100 80GB HBM3
# (results/bench_gpu_run6.md, scripts/fit_library_calls.py; rms log error 0.12 for matmuls and
# 0.48 for convs, against 1.20 and 1.68 for a 2 us launch and the full peak): a fixed cost per
# call (the smallest calls took 6.3 us in cuDNN, 7.8 us in cuBLASLt) and a fraction of the
# dtype's peak (cuBLASLt's fp32 GEMMs of 0.6-0.9 GFLOP ran at 21-23 of 67 TFLOP/s). Half-precision
# calls were not timed and take the same fractions; the A100 is assumed alike (not measured).
# The margin of the partition's time check (gir/fusion/plan.py `library_margin`): with calls
# fitted, an op goes back when its GIR kernels model slower at all; replayed over the 92 groups
# that run measured, margin 1 chose 1,887 us against 1,826 us best and 1,908 us as the unfitted
# model chose at margin 3.
CUDA_CALLS = {"convs": "direct", "call_s": {"matmul": 9e-6, "conv": 12e-6},
              "flop_efficiency": {"matmul": 0.40, "conv": 0.35}, "margin": 1.0}
# Shared memory a kernel may declare statically (`__shared__` arrays, what the emitter writes);
# more needs dynamic shared memory and an opt-in attribute, which GIR does not emit (CUDA C++
# Programming Guide, "Shared Memory": 48 KB static). The validator keeps plans within it.
STATIC_SHARED_BYTES = 48 * 1024

H100_TIMING = Timing(clock_hz=1.98e9, issue_per_clock=4, alu_latency_cycles=4, dram_latency_s=600e-9,
                     copy_efficiency=0.92, cache_bandwidth=5.5e12, max_blocks_per_processor=32,
                     loads_in_flight_per_lane=8, barrier_s=40e-9, block_dispatch_s=80e-9,
                     sector_bytes=32,  # CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory"
                     # ptxas (NVRTC, sm_90) fits GIR's streamed 24-channel 1x1 conv in 31 registers
                     # under __launch_bounds__(256, 8), no spill (tests/test_lane_runs.py); a
                     # hand-written streamed one of 232 channels in 32
                     streamed_registers=32,
                     source="H100 SXM5: vendor figures and public microbenchmarks (gir/backends/cuda/target.py)")
A100_TIMING = Timing(clock_hz=1.41e9, issue_per_clock=4, alu_latency_cycles=4, dram_latency_s=600e-9,
                     copy_efficiency=0.89, cache_bandwidth=4.8e12, max_blocks_per_processor=32,
                     loads_in_flight_per_lane=8, barrier_s=40e-9, block_dispatch_s=80e-9,
                     sector_bytes=32,  # as H100: 32-byte sectors
                     streamed_registers=32,  # as H100 (sm_80 checked the same way)
                     source="A100-SXM4-40GB: vendor figures and public microbenchmarks (gir/backends/cuda/target.py)")

A100 = replace(gpu_target("A100", "cuda", "sm_80", "warp", 32, 32, 108, 255, 163 * 1024,
                  1.555e12, 19.5e12, 19.5e12, 312e12, "A100-SXM4-40GB; 48 KiB static shared, 163 KiB opt-in",
                  A100_TIMING, GPU_LAUNCH_S), extra={"library_epilogues": CUBLASLT_EPILOGUES, "library_calls": CUDA_CALLS,
                         "static_shared_bytes": STATIC_SHARED_BYTES})
H100 = replace(gpu_target("H100", "cuda", "sm_90", "warp", 32, 32, 132, 255, 227 * 1024,
                  3.35e12, 31e12, 67e12, 989e12, "H100-SXM5-80GB", H100_TIMING, GPU_LAUNCH_S),
                extra={"library_epilogues": CUBLASLT_EPILOGUES, "library_calls": CUDA_CALLS,
                       "static_shared_bytes": STATIC_SHARED_BYTES})
