"""The AMD targets: MI100 (gfx908) and one GCD of the MI250X (gfx90a), vendor peak figures
(nominal, not measured).

Timing sources: clocks, CU counts and the resident-block limit from AMD's CDNA1/CDNA2
whitepapers and ISA guides (a wave64 VALU instruction occupies a SIMD16 for 4 clocks, so a CU
issues one per clock). DRAM latency: 700 ns, above the 450-600 ns public pointer-chase figures
of HBM on NVIDIA parts, CDNA being measured higher. Copy efficiency: about 80% of nominal on
MI100 and one MI250X GCD (BabelStream results published by the vendor and HPC centres). L2
bandwidth: nominal (64 B/clk per channel). loads_in_flight_per_lane (8) and the barrier cost
(40 ns) are modelling assumptions, as on the NVIDIA targets. Registers: CDNA has 512 VGPRs per
SIMD lane-slot, but a 512-thread block leaves 128 per lane on gfx908.
"""
from dataclasses import replace

from gir.ir.target import GPU_LAUNCH_S, Timing, gpu_target

# How the device runtime runs a library op (gir/fusion/partition.py library_seconds): hipBLAS
# GEMMs, convolutions as an im2col kernel + a GEMM (no MIOpen binding).
HIPBLAS_CALLS = {"convs": "im2col"}

MI100_TIMING = Timing(clock_hz=1.502e9, issue_per_clock=1, alu_latency_cycles=4, dram_latency_s=700e-9,
                      copy_efficiency=0.80, cache_bandwidth=3.0e12, max_blocks_per_processor=32,
                      loads_in_flight_per_lane=8, barrier_s=40e-9,
                      sector_bytes=64,  # CDNA: 64-byte L2 requests (nominal, not measured here)
                      source="MI100: vendor figures, public microbenchmarks, nominal L2 (gir/backends/hip/target.py)")
MI250X_TIMING = Timing(clock_hz=1.7e9, issue_per_clock=1, alu_latency_cycles=4, dram_latency_s=700e-9,
                       copy_efficiency=0.82, cache_bandwidth=3.5e12, max_blocks_per_processor=32,
                       loads_in_flight_per_lane=8, barrier_s=40e-9,
                       sector_bytes=64,  # as MI100
                       source="MI250X GCD: vendor figures, public microbenchmarks, nominal L2 (gir/backends/hip/target.py)")

MI100 = replace(gpu_target("MI100", "hip", "gfx908", "wavefront", 64, 16, 120, 128, 64 * 1024,
                           1.2288e12, 23e12, 23.1e12, 184.6e12, "CDNA1, 64-lane wavefronts", MI100_TIMING,
                           GPU_LAUNCH_S), extra={"library_calls": HIPBLAS_CALLS})
MI250X = replace(gpu_target("MI250X", "hip", "gfx90a", "wavefront", 64, 16, 110, 128, 64 * 1024,
                            1.6384e12, 24e12, 23.9e12, 191.5e12, "one GCD of the MI250X (the unit a kernel runs on)",
                            MI250X_TIMING, GPU_LAUNCH_S), extra={"library_calls": HIPBLAS_CALLS})
