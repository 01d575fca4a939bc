"""GPU half of scripts/bench.py (`--gpu`), for an NVIDIA machine whose Python has torch:
the bandwidth ceiling (a device-to-device copy), the achieved bandwidth of every kernel GIR
generated, and model latency of gir.Session against PyTorch eager and torch.compile.

Why these choices: kernels are launched through the session's own CudaLauncher (the exact
launches a run makes) and timed with CUDA events on the default stream the launcher uses,
behind a short GPU spin so that the host's launch overhead is not counted; median of many runs
after warm-up, each run on another copy of the kernel's buffers so that the L2 cache (50 MB on
an H100) does not serve a run from the previous one. Bytes moved per kernel are the plan's
modelled DRAM bytes (each distinct element read or written once). The PyTorch side needs an
ONNX -> torch converter (onnx2torch); without one those columns are skipped, not hand-written.
Model latencies are host to host on both sides (inputs uploaded, outputs downloaded), as
gir.Session.run is.
"""
import math
import statistics

import numpy as np
import onnxruntime as ort

import gir
from check_zoo import errors, failure, median_ms
from gir.backends.cuda.launcher import CudaLauncher
from gir.backends.errors import NoDeviceError
from gir.backends.kernels import split_kernels
from gir.backends.launcher_base import DeviceBuffer
from gir.frontend.basic import BasicOp
from gir.ir.dtypes import np_dtype

WARMUP, KERNEL_RUNS = 10, 100
ROTATED_BYTES = 4            # the buffer copies of one kernel cover this many times the L2 cache
MAX_COPIES, MAX_COPY_BYTES = 64, 4 << 30
COPY_BYTES = 1 << 30         # the device-to-device copy that measures the bandwidth ceiling
SPIN_CYCLES = 2_000_000      # about 1 ms of GPU clock: longer than enqueueing one kernel's launches


class GpuUnavailable(RuntimeError):
    """No GPU run possible here; the message says what is missing, in one line."""


class Gpu:
    """torch (events, the copy, the PyTorch models) and what is known about the device."""

    def __init__(self, runs: int):
        try:
            import torch
        except ImportError as err:
            raise GpuUnavailable(f"needs PyTorch with CUDA ({err})") from None
        if not torch.cuda.is_available():
            raise GpuUnavailable("PyTorch sees no CUDA GPU here")
        try:
            CudaLauncher()  # GIR's own way onto the device; the sessions open theirs
        except NoDeviceError as err:
            raise GpuUnavailable(str(err)) from None
        self.torch, self.runs = torch, runs
        props = torch.cuda.get_device_properties(0)
        self.name, self.l2_bytes = props.name, getattr(props, "L2_cache_size", 50 << 20)
        self.copy_bytes_per_s = self.copy_bandwidth()

    def event_seconds(self, fn) -> float:
        """GPU time of the work `fn` enqueues on the default stream. The GPU first spins for about
        a millisecond, so that the Python launch overhead is hidden and not timed."""
        start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        self.torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def median_seconds(self, fn_of_run, runs: int) -> float:
        for i in range(WARMUP):
            fn_of_run(i)
        return statistics.median(self.event_seconds(lambda: fn_of_run(WARMUP + i)) for i in range(runs))

    def copy_bandwidth(self) -> float:
        """Bytes read + written per second by a 1 GiB device-to-device copy."""
        src = self.torch.empty(COPY_BYTES, dtype=self.torch.uint8, device="cuda")
        dst = self.torch.empty_like(src)
        seconds = self.median_seconds(lambda i: dst.copy_(src), self.runs)
        return 2 * COPY_BYTES / seconds

    def measure(self, model, feeds: dict, target: str, limit: int) -> dict:
        """Per-kernel bandwidth and model latencies of one model; errors against onnxruntime (CPU)."""
        reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        session = gir.Session(model, target=target, limit=limit)
        got = session.run(None, feeds)
        kernels = kernel_times(self, session, feeds)
        result = {"gir_ms": median_ms(lambda: session.run(None, feeds), self.runs),
                  "gir_max_rel_err": errors(got, reference)[1], "kernels": kernels,
                  "kernel_ms": sum(k["seconds"] for k in kernels) * 1e3}
        result.update(self.torch_latencies(model, feeds, reference))
        return result

    def torch_latencies(self, model, feeds: dict, reference: list) -> dict:
        try:
            from onnx2torch import convert
        except ImportError:
            return {"torch_note": "no ONNX -> torch converter (onnx2torch) installed: PyTorch columns skipped"}
        try:
            module = convert(model).cuda().eval()
        except Exception as err:  # noqa: BLE001
            return {"torch_note": f"onnx2torch cannot convert it: {failure(err)}"}
        result = {}
        for label, fn in (("eager", module), ("compile", self.torch.compile(module))):
            try:
                run = self.host_to_host(fn, [feeds[i.name] for i in model.graph.input if i.name in feeds])
                result[f"torch_{label}_max_rel_err"] = errors(run(), reference)[1]  # the first call compiles
                result[f"torch_{label}_ms"] = median_ms(run, self.runs)
            except Exception as err:  # noqa: BLE001 -- a model torch cannot run is a note, not the end
                result[f"torch_{label}_error"] = failure(err)
        return result

    def host_to_host(self, module, inputs: list):
        torch = self.torch

        def run():
            with torch.no_grad():
                out = module(*[torch.from_numpy(x).cuda() for x in inputs])
            return [o.cpu().numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]
        return run


def kernel_times(gpu: Gpu, session, feeds: dict) -> list[dict]:
    """Median time of each fused kernel of the plan (all its launches), on rotated buffer copies.
    Call after one session.run, so that the copies start from real values."""
    calls = iter(session.engine.calls)  # DeviceEngine: one call per library op or launch, in plan order
    rows = []
    for step in session.plan.steps:
        if isinstance(step, BasicOp):
            next(calls)
            continue
        launches = [next(calls) for _ in split_kernels(step.graph)]
        seconds = time_rotated(gpu, session, launches, feeds)
        rows.append({"kernel": step.name, "launches": len(launches), "bytes": step.estimate.dram_bytes,
                     "seconds": seconds, "bytes_per_s": step.estimate.dram_bytes / seconds})
    return rows


def time_rotated(gpu: Gpu, session, launches: list, feeds: dict) -> float:
    launcher = session.engine.launcher
    sizes = {}
    for *_, slots in launches:
        for s in slots:
            sizes[_key(s)] = max(sizes.get(_key(s), 0), _nbytes(session, s))
    total = max(1, sum(sizes.values()))
    count = max(2, min(MAX_COPIES, math.ceil(ROTATED_BYTES * gpu.l2_bytes / total)))
    count = max(1, min(count, MAX_COPY_BYTES // total))
    copies = [{k: launcher.alloc(max(1, n)) for k, n in sizes.items()} for _ in range(count)]
    try:
        for key, n in sizes.items():
            host = _contents(session, key, n, feeds)
            for copy in copies:
                launcher.upload(copy[key], host)

        def run(i):
            copy = copies[i % count]
            for kernel, blocks, threads, shared, slots in launches:
                launcher.launch(kernel, blocks, threads, shared, [copy[_key(s)] for s in slots])
        return gpu.median_seconds(run, KERNEL_RUNS)
    finally:
        for copy in copies:
            for buf in copy.values():
                launcher.free(buf)


def _key(slot):
    """Slots are device buffers (arena, constants) or names of tensors bound at each run."""
    return slot if isinstance(slot, str) else slot.ptr


def _nbytes(session, slot) -> int:
    if not isinstance(slot, str):
        return slot.nbytes
    t = session.plan.graph.tensors[slot]
    return t.size * np_dtype(t.dtype).itemsize


def _contents(session, key, nbytes: int, feeds: dict) -> np.ndarray:
    """What the buffer holds after a run: a feed for an input, the device memory otherwise
    (an output bound at each run holds nothing yet: zeros)."""
    if isinstance(key, str):
        value = feeds.get(key)
        return np.zeros(nbytes, np.uint8) if value is None else np.ascontiguousarray(value).view(np.uint8).reshape(-1)
    host = np.empty(nbytes, np.uint8)
    session.engine.launcher.download(DeviceBuffer(key, nbytes), host)
    return host
