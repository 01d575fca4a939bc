"""GPU half of scripts/bench.py (`--gpu`), for an NVIDIA machine whose Python has torch:
the bandwidth ceiling (a device-to-device copy), the achieved bandwidth of every kernel GIR
generated, and model latency of gir.Session against PyTorch eager and torch.compile.

Why these choices: kernels are launched through the session's own CudaLauncher (the exact
launches a run makes: DeviceEngine.program) and timed with CUDA events on the launcher's stream,
behind a short GPU spin so that the host's launch overhead is not counted; median of many runs
after warm-up, each run on another copy of the kernel's buffers so that the L2 cache (50 MB on
an H100) does not serve a run from the previous one. Bytes moved per kernel are the plan's
modelled DRAM bytes (each distinct element read or written once). The PyTorch side needs an
ONNX -> torch converter (onnx2torch); without one those columns are skipped, not hand-written.
Model latencies are host to host on both sides (inputs uploaded, outputs downloaded), as
gir.Session.run is.

Alone (without the CPU half of bench.py), on a GPU machine:

    PYTHONPATH=.:scripts python3 scripts/bench_gpu.py [--models NAME ...] [--runs 20]
        [--no-torch-compile] [--out results/bench_gpu]

writes OUT.json after each model (a run cut short keeps what it measured) and OUT.md at the end.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
from contextlib import contextmanager

import numpy as np
import onnxruntime as ort

import gir
import time_check_gpu
from check_zoo import errors, failure, median_ms
from gir.backends.errors import NoDeviceError
from gir.backends.launcher_base import DeviceBuffer
from gir.cache import Store, gir_version
from gir.runtime import session as session_module

WARMUP, KERNEL_RUNS = 10, 100
ROTATED_BYTES = 4            # the buffer copies of one kernel cover this many times the L2 cache
MAX_COPIES, MAX_COPY_BYTES = 64, 4 << 30
COPY_BYTES = 1 << 30         # the device-to-device copy that measures the bandwidth ceiling
SPIN_CYCLES = 600_000        # about 0.3 ms of GPU clock: longer than enqueueing one kernel's launches or library call


class GpuUnavailable(RuntimeError):
    """No GPU run possible here; the message says what is missing, in one line."""


class Gpu:
    """torch (events, the copy, the PyTorch models) and what is known about the device."""

    def __init__(self, runs: int, torch_compile: bool = True):
        try:
            import torch
        except ImportError as err:
            raise GpuUnavailable(f"needs PyTorch with CUDA ({err})") from None
        if not torch.cuda.is_available():
            raise GpuUnavailable("PyTorch sees no CUDA GPU here")
        try:
            from gir.backends.cuda.launcher import CudaLauncher
            CudaLauncher()  # GIR's own way onto the device; the sessions open theirs
        except NoDeviceError as err:
            raise GpuUnavailable(str(err)) from None
        self.torch, self.runs, self.torch_compile = torch, runs, torch_compile
        props = torch.cuda.get_device_properties(0)
        self.name, self.l2_bytes = props.name, getattr(props, "L2_cache_size", 50 << 20)
        self.copy_bytes_per_s = self.copy_bandwidth()
        self._scratch = None

    def flush_l2(self) -> None:
        """Write twice the L2 cache on the current stream, so that the next work reads DRAM."""
        if self._scratch is None:
            self._scratch = self.torch.empty(2 * self.l2_bytes, dtype=self.torch.uint8, device="cuda")
        self._scratch.zero_()

    def event_seconds(self, fn, stream=None, before=None) -> float:
        """GPU time of the work `fn` enqueues on `stream` (a torch stream; the current one if
        None). The GPU first spins on that stream for about a millisecond, so that the Python
        launch overhead is hidden and not timed; `before` (untimed) is enqueued ahead of the spin."""
        torch = self.torch
        stream = stream or torch.cuda.current_stream()
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        with torch.cuda.stream(stream):
            if before is not None:
                before()
            torch.cuda._sleep(SPIN_CYCLES)
            start.record(stream)
            fn()
            end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def median_seconds(self, fn_of_run, runs: int, stream=None, before=None) -> float:
        for i in range(WARMUP):
            fn_of_run(i)
        return statistics.median(self.event_seconds(lambda: fn_of_run(WARMUP + i), stream, before)
                                 for i in range(runs))

    def launcher_stream(self, launcher):
        """The launcher's own (non-blocking) stream as a torch stream: events on the default
        stream would not order with it."""
        return self.torch.cuda.ExternalStream(launcher.stream_handle)

    def copy_bandwidth(self) -> float:
        """Bytes read + written per second by a 1 GiB device-to-device copy."""
        src = self.torch.empty(COPY_BYTES, dtype=self.torch.uint8, device="cuda")
        dst = self.torch.empty_like(src)
        seconds = self.median_seconds(lambda i: dst.copy_(src), self.runs)
        return 2 * COPY_BYTES / seconds

    def measure(self, model, feeds: dict, target: str, limit: int, path: str | None = None) -> dict:
        """Per-kernel bandwidth and model latencies of one model; errors against onnxruntime (CPU).
        `path`: the model saved there, which the sessions open (see `open_session`)."""
        reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        source = path or model
        session = open_session(source, target, limit)
        got = session.run(None, feeds)
        kernels = kernel_times(self, session)
        result = {"gir_ms": median_ms(lambda: session.run(None, feeds), self.runs),
                  "gir_max_rel_err": errors(got, reference)[1], "kernels": kernels,
                  "kernel_ms": sum(k["seconds"] for k in kernels) * 1e3,
                  "library_path": session.engine.library_path,
                  "library_calls": time_check_gpu.library_times(self, session)}
        if session.engine.library_convs:  # the same plan with its convs as im2col + cuBLASLt
            result.update(self.im2col_latency(source, feeds, reference, target, limit))
        result["given_back"] = sum(d.given_back for d in session.plan.partition.decisions)
        if result["given_back"]:  # the plan of the ridge rule alone, against the time check's
            with ridge_rule_alone():
                latency, ridge = self.variant_latency("ridge_only", source, feeds, reference, target, limit)
            result.update(latency)
            result["time_checks"] = time_check_gpu.time_check_rows(self, session, ridge, result["library_calls"],
                                                                   kernel_times)
            del ridge
        result.update(self.torch_latencies(model, feeds, reference))
        return result

    def variant_latency(self, label: str, model, feeds: dict, reference: list, target: str, limit: int) -> tuple:
        """(gir_{label}_ms and its error, the session): a second session, opened as the caller set
        things up."""
        session = open_session(model, target, limit)
        got = session.run(None, feeds)
        return {f"gir_{label}_ms": median_ms(lambda: session.run(None, feeds), self.runs),
                f"gir_{label}_max_rel_err": errors(got, reference)[1]}, session

    def im2col_latency(self, model, feeds: dict, reference: list, target: str, limit: int) -> dict:
        """The convolution library against the fallback path, on the same (cached) plan."""
        os.environ["GIR_DEVICE_CONV"] = "im2col"
        try:
            return self.variant_latency("im2col", model, feeds, reference, target, limit)[0]
        finally:
            del os.environ["GIR_DEVICE_CONV"]

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
        ways = [("eager", module)] + ([("compile", self.torch.compile(module))] if self.torch_compile else [])
        for label, fn in ways:
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


@contextmanager
def ridge_rule_alone():
    """Sessions opened inside plan without the partition's time check (gir/fusion/plan.py
    `time_checked`): their target has no library-call model, which also keys caches apart."""
    from dataclasses import replace
    real = session_module.get_target
    session_module.get_target = lambda name: replace(
        real(name), extra={k: v for k, v in real(name).extra.items() if k != "library_calls"})
    try:
        yield
    finally:
        session_module.get_target = real


class _PlanCache:
    """The persistent store of searched kernels as the plain mapping `plan` takes: not a Store,
    so that a session writes no whole-session entry (those hold the model's weights)."""

    def __init__(self, store: Store):
        self.store = store

    def __contains__(self, key) -> bool:
        return key in self.store

    def __getitem__(self, key):
        return self.store[key]

    def __setitem__(self, key, value) -> None:
        self.store[key] = value


def open_session(source, target: str, limit: int, engine: str = "native"):
    """gir.Session with the persistent cache ($GIR_CACHE_DIR, `gir compile`'s). A model file
    (`source` a path) planned before, here or by `--plan-only` on another machine from a file of
    the same bytes, is read back whole (its entry refers to the file's weights, holds no copy); a
    ModelProto gets the searched kernels only (a whole entry would hold its weights)."""
    store = Store("plan", gir_version(), repr(session_module.get_target(target)), limit)
    cache = store if isinstance(source, (str, os.PathLike)) else _PlanCache(store)
    return gir.Session(source, target=target, limit=limit, engine=engine, plan_cache=cache)


def plan_only(source, target: str, limit: int) -> int:
    """Fill the cache for the sessions `Gpu.measure` opens (no GPU needed); the given-back count."""
    session = open_session(source, target, limit, engine="interpreter")
    given_back = sum(d.given_back for d in session.plan.partition.decisions)
    if given_back:
        with ridge_rule_alone():
            open_session(source, target, limit, engine="interpreter")
    return given_back


def saved(model, name: str, folder: str | None) -> str | None:
    """`model` written to FOLDER/NAME.onnx (None without a folder), and its digest printed: a
    plan made elsewhere is read back only where the bytes are the same."""
    if folder is None:
        return None
    import hashlib
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.onnx")
    data = model.SerializeToString()
    with open(path, "wb") as f:
        f.write(data)
    print(f"[{name}] {path}: sha256 {hashlib.sha256(data).hexdigest()[:16]}", file=sys.stderr)
    return path


def kernel_times(gpu: Gpu, session, only: set[str] | None = None) -> list[dict]:
    """Median time of each fused kernel of the plan (all its launches), on rotated buffer copies;
    `only`: the kernels of these names. Call after one session.run, so that the copies start
    from the values a run leaves."""
    engine = session.engine  # DeviceEngine: its program is the exact launch list a run replays
    by_step: dict[int, list] = {}
    for step, call in zip(engine.kernel_steps, engine.program):
        if step is not None and (only is None or session.plan.steps[step].name in only):
            by_step.setdefault(step, []).append(call[1:])  # (kernel, grid, block, shared, args)
    rows = []
    for i, launches in by_step.items():
        step = session.plan.steps[i]
        seconds = time_rotated(gpu, engine.launcher, launches)
        rows.append({"kernel": step.name, "launches": len(launches), "bytes": step.estimate.dram_bytes,
                     "seconds": seconds, "bytes_per_s": step.estimate.dram_bytes / seconds,
                     "modelled_s": step.estimate.seconds,  # the time model as the session planned
                     "shapes": [[_count(grid), _count(block)] for _, grid, block, _, _ in launches]})
    return rows


def _count(dims) -> int:
    """Blocks or threads of a launch dimension given as an int or a tuple."""
    return math.prod(dims) if isinstance(dims, (tuple, list)) else int(dims)


def time_rotated(gpu: Gpu, launcher, launches: list) -> float:
    """Each buffer a kernel touches is copied `count` times, the copies starting from the
    buffer's contents; run i uses copy i % count, so that the copies together exceed the L2."""
    sizes: dict[int, int] = {}
    for *_, args in launches:
        for buf in args:
            sizes[buf.ptr] = max(sizes.get(buf.ptr, 0), buf.nbytes)
    total = max(1, sum(sizes.values()))
    count = max(2, min(MAX_COPIES, math.ceil(ROTATED_BYTES * gpu.l2_bytes / total)))
    count = max(1, min(count, MAX_COPY_BYTES // total))
    copies = [{p: launcher.alloc(max(1, n)) for p, n in sizes.items()} for _ in range(count)]
    try:
        for ptr, n in sizes.items():
            host = np.empty(n, np.uint8)
            launcher.download(DeviceBuffer(ptr, n), host)
            for copy in copies:
                launcher.upload(copy[ptr], host)
        launcher.synchronize()

        def run(i):
            copy = copies[i % count]
            for kernel, blocks, threads, shared, args in launches:
                launcher.launch(kernel, blocks, threads, shared, [copy[b.ptr] for b in args])
        return gpu.median_seconds(run, KERNEL_RUNS, gpu.launcher_stream(launcher))
    finally:
        for copy in copies:
            for buf in copy.values():
                launcher.free(buf)

def main(argv=None) -> int:
    import bench  # the report format and model list are bench.py's; imported here, not at the top
    import models
    ap = argparse.ArgumentParser(description="GIR's fused kernels and sessions on an NVIDIA GPU")
    ap.add_argument("--models", nargs="+", default=bench.SEVEN, metavar="NAME")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per model latency (median)")
    ap.add_argument("--target", default="cuda:sm_90")
    ap.add_argument("--limit", type=int, default=2, help="parallel structures searched per fused group")
    ap.add_argument("--no-torch-compile", action="store_true", help="PyTorch eager only (compiling takes minutes)")
    ap.add_argument("--out", default="results/bench_gpu", help="writes OUT.json and OUT.md")
    ap.add_argument("--plan-only", action="store_true",
                    help="only plan the sessions into $GIR_CACHE_DIR (no GPU needed): a lent GPU then skips the search")
    ap.add_argument("--model-dir", help="save each model there and open sessions from the file, so that a "
                                        "--plan-only run with the same folder name elsewhere is read back whole")
    args = ap.parse_args(argv)
    if args.plan_only:
        for name in args.models:
            start = time.perf_counter()
            model = models.build(name)
            given_back = plan_only(saved(model, name, args.model_dir) or model, args.target, args.limit)
            bench.progress(name, f"planned for {args.target} ({given_back} ops given back) in "
                                 f"{time.perf_counter() - start:.1f} s")
        return 0
    try:
        gpu = Gpu(args.runs, torch_compile=not args.no_torch_compile)
    except GpuUnavailable as err:
        print(f"bench_gpu.py: {err}", file=sys.stderr)
        return bench.EXIT_NO_GPU
    results = {"command": "PYTHONPATH=.:scripts python3 scripts/bench_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "machine": bench.machine(), "options": vars(args),
               "gpu": {"device": gpu.name, "copy_bytes_per_s": gpu.copy_bytes_per_s}, "models": []}
    bench.progress("gpu", f"{gpu.name}: device-to-device copy {gpu.copy_bytes_per_s / 1e9:.0f} GB/s")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    for name in args.models:
        start = time.perf_counter()
        model = models.build(name)
        row = {"model": name, "gpu": bench.gpu_numbers(gpu, model, models.example_inputs(model, 0), args,
                                                       path=saved(model, name, args.model_dir))}
        row["seconds"] = round(time.perf_counter() - start, 1)
        results["models"].append(row)
        g = row["gpu"]
        bench.progress(name, g["error"] if "error" in g else
                       f"GIR {g['gir_ms']:.2f} ms (kernels {g['kernel_ms']:.3f} ms), max rel err {g['gir_max_rel_err']:.2g}, "
                       f"torch eager {g.get('torch_eager_ms', '-')} ms; {row['seconds']} s")
        with open(args.out + ".json", "w") as f:
            json.dump(results, f, indent=1)
    report = bench.gpu_report(results) + "\n" + time_check_gpu.report(results["models"], bench.markdown_table)
    with open(args.out + ".md", "w") as f:
        f.write(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
