"""The GPU engine (targets cuda and hip): the plan's kernels compiled once into one module
(NVRTC, hiprtc) and launched through the backend's Launcher, intermediates at their planned
offsets in one device arena.

Library ops (matmul, conv) run on the host through numpy (library.py), operands copied over: no
cuBLAS binding is installed (cuda-bindings 13.0 has none) and Debian's ROCm 5.2 ships no
hipBLAS library for hip-python's binding. Correct, not fast; the vendor library is the
place to improve. Sessions open the launcher before planning, so without a GPU the error (the
launcher's one-line NoDeviceError) comes before any work."""
from __future__ import annotations

import threading

import numpy as np

from gir.backends.kernels import check_resources, check_shared
from gir.backends.launcher_base import DeviceBuffer, Launcher
from gir.frontend.basic import BasicOp
from gir.ir.dtypes import np_dtype

from .indices import GatherIndexError, gather_origins
from .library import run_library_op
from .memory import MemoryPlan
from .native import emit_plan, locate, output_roots


BACKENDS = ("cuda", "hip")


def open_launcher(backend: str) -> Launcher:
    """The device's launcher (backend "cuda" or "hip"); NoDeviceError where there is none."""
    if backend == "cuda":
        from gir.backends.cuda.launcher import CudaLauncher
        return CudaLauncher()
    from gir.backends.hip.launcher import HipLauncher
    return HipLauncher()


def _toolchain(backend: str):
    """(emitter class, compile function, static shared-memory limit)."""
    if backend == "cuda":
        from gir.backends.cuda.compiler import compile_cuda
        from gir.backends.cuda.emitter import STATIC_SHARED, CudaEmitter
        return CudaEmitter, compile_cuda, STATIC_SHARED
    from gir.backends.hip.compiler import compile_hip
    from gir.backends.hip.emitter import HipEmitter
    return HipEmitter, compile_hip, None


class DeviceEngine:
    def __init__(self, plan, memory: MemoryPlan, launcher: Launcher):
        self.plan, self.memory, self.launcher = plan, memory, launcher
        target, g = plan.target, plan.graph
        emitter, compile_source, static_shared = _toolchain(target.backend)
        source, launches = emit_plan(emitter(target), plan)
        kernels = [launch[1] for launch in launches if not isinstance(launch, BasicOp)]
        check_shared(kernels, target, static_shared)
        binary = compile_source(source, target.arch)
        check_resources(kernels, binary.resources, target)
        self.arena = self.launcher.alloc(max(1, memory.arena_bytes))
        self.constants = {}
        for n, t in g.tensors.items():
            if t.value is not None:
                self.constants[n] = self.launcher.alloc(max(1, t.value.nbytes))
                self.launcher.upload(self.constants[n], np.ascontiguousarray(t.value, np_dtype(t.dtype)))
        self.calls = []
        gathering = [launch for launch in launches if not isinstance(launch, BasicOp) and launch[1].gathers]
        # one int per kernel that gathers, zeroed and read back once per run (see Kernel.gathers)
        self.flags = self.launcher.alloc(4 * len(gathering)) if gathering else None
        self.gathers = []  # the gather nodes of each flag, for the error
        for launch in launches:
            if isinstance(launch, BasicOp):
                self.calls.append(launch)
                continue
            i, k = launch
            slots = [self._buffer(*locate(plan, memory, i, b), b.nbytes) for b in k.params]
            if k.gathers:
                slots.append(DeviceBuffer(self.flags.ptr + 4 * len(self.gathers), 4))
                self.gathers.append(gather_origins(plan, plan.steps[i].ops))
            self.calls.append((self.launcher.load(binary, k.name), k.num_blocks, k.block_threads, k.shared_bytes, slots))
        if self.flags is not None:  # zero now and again only after a run that set one: no copy per run
            self.launcher.upload(self.flags, np.zeros(len(self.gathers), np.int32))
        self.fresh = output_roots(plan)
        self._lock = threading.Lock()

    def _buffer(self, where: str, what, nbytes: int):
        if where == "arena":
            return DeviceBuffer(self.arena.ptr + what, nbytes)
        return self.constants[what] if where == "const" else what

    def _check_gathers(self) -> None:
        if self.flags is None:
            return
        flags = np.empty(len(self.gathers), np.int32)
        self.launcher.download(self.flags, flags)
        if flags.any():
            self.launcher.upload(self.flags, np.zeros_like(flags))
            raise GatherIndexError(f"{self.plan.graph.model_name}: {self.gathers[int(np.argmax(flags))]}: an index is "
                                   f"outside [-n, n) of the axis it selects from")

    def _tensor(self, name: str, per_run: dict) -> DeviceBuffer:
        name = self.plan.aliases.get(name, name)
        t = self.plan.graph.tensors[name]
        if name in self.memory.offsets:
            return DeviceBuffer(self.arena.ptr + self.memory.offsets[name], t.size * np_dtype(t.dtype).itemsize)
        return self.constants[name] if name in self.constants else per_run[name]

    def _download(self, name: str, per_run: dict) -> np.ndarray:
        t = self.plan.graph.tensors[name]
        host = np.empty(t.shape, np_dtype(t.dtype))
        self.launcher.download(self._tensor(name, per_run), host)
        return host

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g, launcher = self.plan.graph, self.launcher
        per_run = {}
        with self._lock:
            try:
                for n in g.inputs:
                    per_run[n] = launcher.alloc(max(1, feeds[n].nbytes))
                    launcher.upload(per_run[n], feeds[n])
                for root in self.fresh:
                    per_run[root] = launcher.alloc(max(1, g.tensors[root].size * np_dtype(g.tensors[root].dtype).itemsize))
                for call in self.calls:
                    if isinstance(call, BasicOp):
                        launcher.synchronize()
                        args = [self._download(t, per_run) for t in call.inputs]
                        launcher.upload(self._tensor(call.outputs[0], per_run), run_library_op(call, g.tensors, args))
                    else:
                        kernel, blocks, threads, shared, slots = call
                        launcher.launch(kernel, blocks, threads, shared,
                                        [per_run[s] if isinstance(s, str) else s for s in slots])
                launcher.synchronize()
                self._check_gathers()
                return {n: self._download(n, per_run) for n in g.outputs}
            finally:
                for buf in per_run.values():
                    launcher.free(buf)
