"""The OpenCL plan engine: the whole plan stays on the device between runs.

When the Session is created: every kernel of the plan is emitted into one OpenCL program and
built once; the arena of intermediates (the memory plan's offsets, bound as sub-buffers, which
the plan's 256-byte alignment makes legal on any device asking for at most that), the
weights, inputs, outputs and gather flags are allocated once, and the weights uploaded once.
A run: copy the feeds in, enqueue the kernels in plan order, copy the outputs out. Library
ops (matmul, conv) have no OpenCL BLAS here: their operands are read back, computed in numpy
and written to their place (what the step engine does for every step, done only for them).
"""
from __future__ import annotations

import threading

import numpy as np

from gir.frontend.basic import BasicOp
from gir.ir.dtypes import np_dtype
from gir.runtime.indices import GatherIndexError, gather_origins
from gir.runtime.library import run_library_op
from gir.runtime.memory import ALIGN, MemoryPlan, locate, output_roots

from ..errors import ResourceError
from ..kernels import check_shared, emit_plan
from .compiler import build
from .device import cl, context_and_queue, device
from .emitter import OpenCLEmitter


def open_engine(target, model: str):
    """Engine.open: the device is opened now (ToolchainMissingError, one line, without one)."""
    context_and_queue()
    return lambda plan, memory, **options: OpenCLEngine(plan, memory)


class OpenCLEngine:
    library_path = "numpy"

    def __init__(self, plan, memory: MemoryPlan):
        pyopencl = cl()
        self.plan, self.memory, self.cl = plan, memory, pyopencl
        ctx, self.queue = context_and_queue()
        g = plan.graph
        align = device().mem_base_addr_align // 8
        if ALIGN % align:
            raise ResourceError(f"{g.model_name}: {device().name} aligns sub-buffers to {align} bytes; the memory "
                                f"plan's offsets are multiples of {ALIGN}")
        source, launches = emit_plan(OpenCLEmitter(plan.target), plan)
        kernels = [launch[1] for launch in launches if not isinstance(launch, BasicOp)]
        check_shared(kernels, plan.target)
        program = build(source, g.model_name)
        rw = pyopencl.mem_flags.READ_WRITE
        self.arena = pyopencl.Buffer(ctx, rw, max(ALIGN, memory.arena_bytes))
        pyopencl.enqueue_fill_buffer(self.queue, self.arena, np.uint8(0), 0, self.arena.size)
        self.constants = {}
        for n, t in g.tensors.items():
            if t.value is not None:
                host = np.ascontiguousarray(t.value, np_dtype(t.dtype))
                self.constants[n] = pyopencl.Buffer(ctx, rw | pyopencl.mem_flags.COPY_HOST_PTR,
                                                    hostbuf=host if host.nbytes else np.zeros(1, np.uint8))
        self.inputs = {n: pyopencl.Buffer(ctx, rw, max(1, self._nbytes(n))) for n in g.inputs}
        self.fresh = {r: pyopencl.Buffer(ctx, rw, max(1, self._nbytes(r))) for r in sorted(output_roots(plan))}
        gathering = [launch for launch in launches if not isinstance(launch, BasicOp) and launch[1].gathers]
        self.flags = {id(k): pyopencl.Buffer(ctx, rw, 4) for _, k in gathering}  # one each: sub-buffers must align
        self.gathers = [(self.flags[id(k)], gather_origins(plan, plan.steps[i].ops)) for i, k in gathering]
        self._zero_flags()
        self._args = []  # the sub-buffers the kernels are bound to, kept alive with them
        self.program = []  # ("kernel", Kernel, global size, local size) | ("library", BasicOp)
        for launch in launches:
            if isinstance(launch, BasicOp):
                self.program.append(("library", launch))
                continue
            i, k = launch
            kernel = pyopencl.Kernel(program, k.name)
            args = [self._buffer(*locate(plan, memory, i, b), b.nbytes) for b in k.params]
            if k.gathers:
                args.append(self.flags[id(k)])
            kernel.set_args(*args)
            self._args.append(args)
            self.program.append(("kernel", kernel, (k.prim.num_units,), (k.prim.units_per_block,)))
        self.queue.finish()  # the weights are on the device before the first run
        self._lock = threading.Lock()

    def _nbytes(self, name: str) -> int:
        t = self.plan.graph.tensors[name]
        return t.size * np_dtype(t.dtype).itemsize

    def _buffer(self, where: str, what, nbytes: int):
        if where == "arena":
            return self.arena.get_sub_region(what, max(1, nbytes))
        if where == "const":
            return self.constants[what]
        return self.inputs[what] if what in self.inputs else self.fresh[what]

    def _place(self, name: str):
        """(buffer, byte offset) where a model tensor lives on the device (views resolved)."""
        name = self.plan.aliases.get(name, name)
        if name in self.memory.offsets:
            return self.arena, self.memory.offsets[name]
        if name in self.constants:
            return self.constants[name], 0
        return (self.inputs[name] if name in self.inputs else self.fresh[name]), 0

    def _read(self, name: str) -> np.ndarray:
        t = self.plan.graph.tensors[name]
        host = np.empty(t.shape, np_dtype(t.dtype))
        if host.nbytes:
            buf, offset = self._place(name)
            self.cl.enqueue_copy(self.queue, host, buf, src_offset=offset)
        return host

    def _write(self, name: str, value: np.ndarray) -> None:
        t = self.plan.graph.tensors[name]
        host = np.ascontiguousarray(value, np_dtype(t.dtype))
        if host.nbytes:
            buf, offset = self._place(name)
            self.cl.enqueue_copy(self.queue, buf, host, dst_offset=offset)

    def _zero_flags(self) -> None:
        for buf in self.flags.values():
            self.cl.enqueue_fill_buffer(self.queue, buf, np.int32(0), 0, 4)

    def run(self, feeds: dict) -> dict:
        g, pyopencl = self.plan.graph, self.cl
        with self._lock:
            for n in g.inputs:
                self._write(n, feeds[n])
            for call in self.program:
                if call[0] == "kernel":
                    pyopencl.enqueue_nd_range_kernel(self.queue, *call[1:])
                    continue
                op = call[1]
                args = [self._read(t) for t in op.inputs]
                self._write(op.outputs[0], run_library_op(op, g.tensors, args))
            outputs = {n: self._read(n) for n in g.outputs}
            flags = np.zeros(len(self.gathers), np.int32)
            for j, (buf, _) in enumerate(self.gathers):
                pyopencl.enqueue_copy(self.queue, flags[j:j + 1], buf)
            self.queue.finish()
            if flags.any():
                self._zero_flags()
                self.queue.finish()
                raise GatherIndexError(f"{g.model_name}: {self.gathers[int(np.argmax(flags != 0))][1]}: an index is "
                                       f"outside [-n, n) of the axis it selects from")
            return outputs
