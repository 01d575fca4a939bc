"""How this CPU's vendor library runs a call, measured by `gir calibrate`: the CPU target's
`library_calls` (gir/fusion/partition.py `library_call_seconds`), so that the planner's time
check gives a lowered conv or matmul back to oneDNN where its GIR kernels model slower.

Why measured: the ridge point alone decides which ops are lowered, from a nominal peak of
3 GHz x 8 fp32 lanes x 2 per core, which understates an AVX-512 core; and the CPU target had
no model of a library call at all, so an op lowered at 4.4 FLOP/B against a 5.5 FLOP/B ridge
stayed in GIR whatever its kernels cost (SAR-DRN's 64 -> 1 output conv: 57.7 ms in GIR on a
2-core Cascade Lake guest, results/kernel_profile_cpu_cascadelake.md).

The fit has the form the GPU presets use: per kind, a fixed cost per call (the fastest call of
a probe of a few thousand multiply-adds) and a share of the target's peak FLOP/s (the median,
over the probes that the model finds compute-bound, of what the call reached after its fixed
cost). A dense conv counts its output channels rounded up to the blocked layout's channel
block: oneDNN ran the conv to one channel in 3.7-4.0 ms, 16x its FLOPs at the dense convs' rate
(brgconv:avx512_core, 2-core Cascade Lake guest). Depthwise convs are bytes-bound: they take a
share of the copy bandwidth of their own (`byte_efficiency`), measured on three of EfficientNet-
B0's shapes; oneDNN ran them at 1.7-3.5 GB/s against an 18 GB/s copy there (its blocked layout's
reorders included), where GIR's fused depthwise kernels were faster. A matmul's byte share is
measured on a GEMV whose weights come from DRAM (`_cold_seconds`): a decode step's weights are
read once a run, and timed warm the probe ran 3x faster than cold. Each probe runs as the CPU
engine runs the op: `onednn.prepare` picks the layout and thread count by timing, then the
fastest of several calls counts.
"""
from __future__ import annotations

import numpy as np

from gir.frontend.basic import BasicGraph, BasicOp, Tensor
from gir.fusion.partition import GROUPED, op_cost, padded_channels

# (x shape, weight shape, pad) per conv probe; (a shape, b shape) per matmul probe. The first of
# each kind is tiny (its time is the fixed cost), the rest span the zoo's shapes: a dense 3x3
# conv, a 1x1 conv, a conv to one channel (SAR-DRN's last), a square GEMM and a wide one.
CONV_PROBES = (((1, 8, 8, 8), (8, 8, 1, 1), 0),
               ((1, 64, 56, 56), (64, 64, 3, 3), 1),
               ((1, 128, 28, 28), (128, 128, 1, 1), 0),
               ((1, 64, 128, 128), (1, 64, 3, 3), 1))
# depthwise convs (channels, size, kernel, stride): EfficientNet-B0's and ShuffleNet-v2's kind
GROUPED_PROBES = ((32, 112, 3, 1), (144, 56, 5, 2), (240, 28, 5, 1))
MATMUL_PROBES = (((16, 16), (16, 16)),
                 ((256, 512), (512, 512)),
                 ((128, 768), (768, 3072)))
# a GEMV (GPT-2's c_fc at one token): bytes-bound, timed over enough weight matrices in turn
# that they stream from DRAM, as a decode step's do (`_cold_seconds`)
GEMV_PROBE = ((1, 768), (768, 3072))
REPEATS = 5
BATCHES = 3


def measure(copy_bandwidth: float, progress=print, peak_flops: float | None = None) -> dict | None:
    """The `library_calls` figures (None where oneDNN is not installed: numpy runs library ops,
    and the target keeps no library model). `peak_flops`: the CPU target's, by default: the
    nominal 3 GHz x 8 lanes x 2 per core an AVX-512 core exceeds (its efficiencies may pass 1)."""
    from gir.runtime import onednn
    if peak_flops is None:
        from gir.backends.cpu.target import local_cpu
        peak_flops = local_cpu().peak_matrix_flops
    if onednn.library() is None:
        progress(f"library calls: not measured ({onednn.unavailable()})")
        return None
    call_s, efficiency, byte_share, block = {}, {}, {}, channel_block()
    for kind, probes in (("conv", [_conv(*p) for p in CONV_PROBES]), ("matmul", [_matmul(*p) for p in MATMUL_PROBES])):
        timed = []  # (FLOPs as the library computes them, bytes, seconds) per probe
        for g in probes:
            flops, nbytes = op_cost(g.ops[0], g)
            timed.append((flops * padded_channels(g.ops[0], g, block), nbytes, _time(g)))
        fixed = timed[0][2]
        shares = [flops / max(seconds - fixed, 1e-9) / peak_flops for flops, nbytes, seconds in timed[1:]
                  if flops / peak_flops > nbytes / copy_bandwidth]
        call_s[kind] = fixed
        efficiency[kind] = round(float(np.median(shares)), 3) if shares else 1.0
        progress(f"library {kind}s (oneDNN): {fixed * 1e6:.1f} us a call, then "
                 + ", ".join(f"{f / 1e6:.0f} MFLOP in {s * 1e3:.2f} ms" for f, _, s in timed[1:])
                 + f": {efficiency[kind]:.2f} of the {peak_flops / 1e9:.0f} GFLOP/s peak")
    gemv = _matmul(*GEMV_PROBE)
    nbytes, seconds = op_cost(gemv.ops[0], gemv)[1], _cold_seconds(gemv)
    byte_share["matmul"] = round(nbytes / max(seconds - call_s["matmul"], 1e-9) / copy_bandwidth, 3)
    progress(f"library GEMV (oneDNN), weights from DRAM: {nbytes / 1e6:.1f} MB in {seconds * 1e3:.3f} ms: "
             f"{byte_share['matmul']:.2f} of the {copy_bandwidth / 1e9:.1f} GB/s copy")
    timed = [(op_cost(g.ops[0], g)[1], _time(g)) for g in (_depthwise(*p) for p in GROUPED_PROBES)]
    byte_share[GROUPED] = round(float(np.median([b / max(s - call_s["conv"], 1e-9) / copy_bandwidth for b, s in timed])), 3)
    progress("library depthwise convs (oneDNN): " + ", ".join(f"{b / 1e6:.1f} MB in {s * 1e3:.2f} ms" for b, s in timed)
             + f": {byte_share[GROUPED]:.2f} of the {copy_bandwidth / 1e9:.1f} GB/s copy")
    return {"convs": "direct", "call_s": call_s, "flop_efficiency": efficiency, "byte_efficiency": byte_share,
            "channel_block": block, "margin": 1.0}


def channel_block() -> int:
    """fp32 channels a oneDNN blocked layout holds together on this CPU: 16 with AVX-512
    (nChw16c), 8 with AVX2 (nChw8c), else 4 (SSE and Arm NEON formats)."""
    from gir.backends.cpu.compiler import host_cpu
    flags = set(host_cpu().rsplit(" | ", 1)[-1].split())
    return 16 if "avx512f" in flags else 8 if "avx2" in flags else 4


def _time(probe: BasicGraph) -> float:
    from gir.runtime import onednn
    (op,), tensors = probe.ops, probe.tensors
    constants = {n: t.value.reshape(-1) for n, t in tensors.items() if t.value is not None}
    made = onednn.prepare(op, tensors, constants)
    if isinstance(made, str):
        raise RuntimeError(f"oneDNN refused its calibration probe {op.name}: {made}")
    # the fastest of several batches: on a shared VM other work only ever makes a call slower
    return min(onednn.timed(made, op, tensors, repeat=REPEATS) for _ in range(BATCHES))


def _cold_seconds(probe: BasicGraph) -> float:
    """One call's time with its weights out of every cache: a primitive per weight copy, as
    many as twice the last-level cache holds (1 GiB at most), called in turn (the fastest of
    several rounds, per call). A bytes-bound call timed on one weight, which the cache then holds, measured
    3x its rate from DRAM (GPT-2's decode GEMVs ran 1.3x slower in oneDNN than in GIR's
    kernels on an AMD EPYC guest, where the warm probe had oneDNN ahead)."""
    import time

    from gir.backends.cpu.target import last_level_cache_bytes
    from gir.runtime import onednn
    (op,), tensors = probe.ops, probe.tensors
    weight = next(n for n, t in tensors.items() if t.value is not None)
    nbytes = tensors[weight].size * 4
    copies = max(2, min(-(-2 * last_level_cache_bytes() // nbytes), (1 << 30) // nbytes))  # at most 1 GiB held
    made = []
    for _ in range(copies):  # each primitive holds its own reordered copy of the weight
        m = onednn.prepare(op, tensors, {weight: np.zeros(tensors[weight].size, np.float32)})
        if isinstance(m, str):
            raise RuntimeError(f"oneDNN refused its calibration probe {op.name}: {m}")
        made.append(m)
    # every operand its own zeroed array per primitive: a plain-layout weight is read from the
    # pointer given at the call, a reordered one from the primitive's copy; either way apart
    operands = [onednn.zeroed_operands(m, tensors) for m in made]  # (arrays kept alive, addresses)
    ptrs = [p for _, p in operands]
    out = onednn.aligned_bytes(tensors[op.outputs[0]].size * 4)
    best = float("inf")
    for i in range(REPEATS + 1):
        start = time.perf_counter()
        for m, p in zip(made, ptrs):
            m.call(*p, out.ctypes.data)
        if i:
            best = min(best, (time.perf_counter() - start) / len(made))
    return best


def _conv(x_shape, w_shape, pad, stride=1, group=1) -> BasicGraph:
    n, _, h, w = x_shape
    y_shape = (n, w_shape[0], (h + 2 * pad - w_shape[2]) // stride + 1, (w + 2 * pad - w_shape[3]) // stride + 1)
    op = BasicOp("calibration conv", "conv", ["x", "w"], ["y"],
                 {"strides": (stride, stride), "pads": (pad,) * 4, "dilations": (1, 1), "group": group}, "gir calibrate")
    return _probe(op, {"x": x_shape, "w": w_shape, "y": y_shape}, "w")


def _depthwise(channels, size, kernel, stride) -> BasicGraph:
    return _conv((1, channels, size, size), (channels, 1, kernel, kernel), kernel // 2, stride, channels)


def _matmul(a_shape, b_shape) -> BasicGraph:
    op = BasicOp("calibration matmul", "matmul", ["a", "b"], ["c"], {}, "gir calibrate")
    return _probe(op, {"a": a_shape, "b": b_shape, "c": (a_shape[0], b_shape[1])}, "b")


def _probe(op: BasicOp, shapes: dict, weight: str) -> BasicGraph:
    """A one-op graph of fp32 tensors, its weight a constant (zeros), as the engine runs one."""
    tensors = {n: Tensor(n, s, "float32", np.zeros(s, np.float32) if n == weight else None) for n, s in shapes.items()}
    return BasicGraph(tensors, [op], [op.inputs[0]], op.outputs, "gir calibrate")
