"""The device engine every GPU backend shares (each registers a DeviceEngineSpec: its launcher,
emitter, compiler and Python extra): everything stays on the device.

When the Session is created: the plan's kernels (and one im2col kernel per convolution that
needs one) are compiled into one module (NVRTC, hiprtc); the arena of intermediates, the
weights, the inputs and outputs, the im2col buffer and the gather flags are allocated once;
the weights are uploaded once; every library op becomes GEMM calls on device pointers
(blas.Gemm, cuBLASLt through nvmath-python on NVIDIA, hipBLAS through hip-python on AMD).
Where the launcher supports it, the whole plan is captured once as a graph (CUDA graphs;
GIR_DEVICE_GRAPHS=0 launches it call by call instead, as does a capture that fails).

A run: copy the feeds in, launch the plan (or replay the graph) on the launcher's one stream,
copy the outputs out, wait once. No weight moves and no other host-device traffic; a gather
flag is read back (in the same wait) only for kernels whose indices are computed on the
device (indices fed as inputs are checked on the host before the run).

A convolution is one call of the launcher's convolution library where it has one
(`open_conv`: cuDNN through its frontend on NVIDIA; dnn.Conv on the resident pointers, the
bias in the call where the library fuses it, else a rank-1 GEMM after it). Elsewhere (no
cuDNN, hipBLAS, float64, or GIR_DEVICE_CONV=im2col) it is im2col (a generated copy kernel:
(N, C, *kernel, *out) from the padded, strided, dilated windows; skipped for 1x1 stride-1
unpadded convs, whose input already is that matrix) and one strided-batched GEMM per image
over the groups, Y[n, g] = W[g] @ col[n, g], with the bias added as a rank-1 GEMM (bias x
ones, beta = 1). The weights are used where they are: (M, C/g, *kernel) row-major is already
(G, M/G, C/G * taps). `library_path` says which path the convolutions took. A matmul's
absorbed epilogue (gir/fusion/epilogue.py) goes into its Gemms: bias pointer, a residual as C
(beta = 1, C apart from D) and the activation, run by the library (cuBLASLt) in the call.

Sessions open the launcher before planning, so without a GPU or the Python extra the error
(NoDeviceError, or its kind LibraryUnavailable) is one line before any work; a missing
vendor library (no hipBLAS) is one line when the plan needs it, never a host fallback."""
from __future__ import annotations

import importlib.util
import os
import threading
from math import prod

import numpy as np

from dataclasses import dataclass
from typing import Callable

from gir.frontend.basic import BasicOp
from gir.ir.dtypes import np_dtype
from gir.runtime.indices import GatherIndexError, gather_origins
from gir.runtime.memory import MemoryPlan, locate, output_roots

from .blas import DTYPES, bias_rows, row_major_matmul
from .dnn import CONV_DTYPES, conv_call
from .errors import LibraryUnavailable
from .kernels import check_resources, check_shared, emit_plan
from .launcher_base import DeviceBuffer, Launcher
from .registry import Engine, backend as registered

IM2COL_THREADS = 256


@dataclass(frozen=True)
class DeviceEngineSpec(Engine):
    """What a GPU backend gives the shared device engine: its runtime extra (pip name, modules
    it must import), `launcher()` -> Launcher (NoDeviceError without a device) and
    `toolchain()` -> (emitter class, compile(source, arch) -> binary with `.resources`, static
    shared-memory limit or None). Both are called late, so registering imports no driver."""
    extra: tuple = ("", ())
    launcher: Callable = None
    toolchain: Callable = None


def device_engine(extra: tuple, launcher: Callable, toolchain: Callable) -> DeviceEngineSpec:
    """The Engine a GPU backend registers."""
    return DeviceEngineSpec(open=open_engine, extra=extra, launcher=launcher, toolchain=toolchain)


def _spec(backend: str) -> DeviceEngineSpec:
    spec = registered(backend).engine
    if not isinstance(spec, DeviceEngineSpec):
        raise LibraryUnavailable(f"backend {backend!r} does not run on the device engine")
    return spec


def open_engine(target, model: str):
    """Engine.open: the launcher is opened now (before planning); `make(plan, memory)`."""
    launcher = open_launcher(target.backend)
    return lambda plan, memory, **options: DeviceEngine(plan, memory, launcher)


def check_extra(backend: str) -> None:
    """The Python packages of the backend's runtime extra; LibraryUnavailable naming it."""
    extra, modules = _spec(backend).extra
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise LibraryUnavailable(f"the {backend} runtime needs the {extra} extra ({module} is not installed): "
                                     f"pip install '{extra}'")


def open_launcher(backend: str) -> Launcher:
    """The backend's launcher; LibraryUnavailable without its Python extra, NoDeviceError
    without a device."""
    check_extra(backend)
    return _spec(backend).launcher()


def _toolchain(backend: str):
    """(emitter class, compile function, static shared-memory limit)."""
    return _spec(backend).toolchain()


_BITS = {2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def im2col_source(name: str, x_shape, kernel, strides, pads, dilations, out_sp, itemsize: int) -> str:
    """A copy kernel writing col (N, C, *kernel, *out) row-major from x (N, C, *spatial):
    col[n, c, k.., o..] = x[n, c, o * stride - pad + k * dilation] or 0 outside. One thread
    per element; elements move as raw bits (any float type, no headers)."""
    t = _BITS[itemsize]
    sp, nsp = x_shape[2:], len(x_shape) - 2
    total = x_shape[0] * x_shape[1] * prod(kernel) * prod(out_sp)
    body = [f"  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
            f"  if (i >= {total}LL) return;", "  long long r = i;"]
    body += [f"  long long o{d} = r % {out_sp[d]}; r /= {out_sp[d]};" for d in reversed(range(nsp))]
    body += [f"  long long k{d} = r % {kernel[d]}; r /= {kernel[d]};" for d in reversed(range(nsp))]
    index, inside = "r", []
    for d in range(nsp):
        body.append(f"  long long h{d} = o{d} * {strides[d]} - {pads[d]} + k{d} * {dilations[d]};")
        inside.append(f"h{d} >= 0 && h{d} < {sp[d]}")
        index = f"({index}) * {sp[d]} + h{d}"
    body.append(f"  col[i] = ({' && '.join(inside) or '1'}) ? x[{index}] : ({t})0;")
    return f'extern "C" __global__ void {name}(const {t}* __restrict__ x, {t}* __restrict__ col) {{\n' + \
        "\n".join(body) + "\n}\n"


def _direct(attrs, w_shape) -> bool:
    """A 1x1, stride-1, unpadded conv reads its input as the GEMM's matrix (no im2col)."""
    return all(k == 1 for k in w_shape[2:]) and all(s == 1 for s in attrs["strides"]) and not any(attrs["pads"])


def _check_epilogue(g, op: BasicOp, launcher: Launcher) -> None:
    """A library op's epilogue must be one GEMM epilogue the launcher's library runs: a matmul's
    bias along D's rows, then at most one residual (C), then at most one activation, each a
    kind in `launcher.epilogue_kinds` (cuBLASLt: bias, relu, residual, gelu_tanh; hipBLAS:
    none). Anything else is one LibraryUnavailable line, never a dropped step."""
    kinds = [what for what, _ in op.attrs.get("absorbed", ())]
    if not kinds:
        return
    steps = [k for k, *_ in op.attrs.get("epilogue", ())]
    runs = launcher.epilogue_kinds
    acts = [k for k in steps if k != "residual"]
    fits = (op.kind == "matmul" and all(k in runs for k in kinds) and len(acts) <= 1
            and steps in (acts, ["residual", *acts])
            and (not op.attrs.get("bias") or bias_rows(g.tensors[op.inputs[1]].shape)))
    if not fits:
        raise LibraryUnavailable(f"{g.model_name}: {op.origin}: the plan gives this {op.kind} an epilogue "
                                 f"({', '.join(kinds)}) that the GPU library path does not run ({launcher.library} "
                                 f"takes {', '.join(sorted(runs)) or 'none'} after a matmul, in the order bias, "
                                 f"residual, activation): plan the model for this target")


def host_checked_gathers(plan) -> set[str]:
    """Gather ops whose indices are a graph input (through views): checked on the host."""
    g = plan.graph
    views = {op.outputs[0]: op.inputs[0] for op in g.ops if op.kind == "view"}
    found = set()
    for op in g.ops:
        if op.kind == "gather":
            source = op.inputs[1]
            while source in views or source in plan.aliases:
                source = views.get(source) or plan.aliases[source]
            if source in g.inputs:
                found.add(op.name)
    return found


class DeviceEngine:
    def __init__(self, plan, memory: MemoryPlan, launcher: Launcher):
        self.plan, self.memory, self.launcher = plan, memory, launcher
        target, g = plan.target, plan.graph
        emitter, compile_source, static_shared = _toolchain(target.backend)
        source, launches = emit_plan(emitter(target), plan)
        library = [op for op in launches if isinstance(op, BasicOp)]
        for op in library:
            dtype = g.tensors[op.outputs[0]].dtype
            if dtype not in DTYPES or any(g.tensors[t].dtype != dtype for t in op.inputs):
                raise LibraryUnavailable(f"{g.model_name}: {op.origin}: a {op.kind} of {dtype} has no GPU library "
                                         f"kernel here (library ops take {', '.join(DTYPES)})")
            _check_epilogue(g, op, launcher)
        if library:
            launcher.check_library()
        self.library_path = launcher.library if library else "none (no library ops)"
        self.library_note = ""
        convs = [op for op in library if op.kind == "conv"]
        conv_library = self._conv_library(convs)
        # library convs, planned now by shape: id(op) -> True when the call adds the bias, False
        # when a GEMM adds it after; a conv the library cannot run is left out (im2col then)
        fuses = {id(op): launcher.prepare_conv(self._conv(op, placed=False)) for op in convs
                 if conv_library and g.tensors[op.outputs[0]].dtype in CONV_DTYPES}
        self.library_convs = {key: fits for key, fits in fuses.items() if fits is not None}
        if convs:
            self.library_path += "; convolutions: " + self._conv_path(conv_library, len(convs))
        im2col = {}  # id(op) -> kernel name
        for op in library:
            if op.kind == "conv" and id(op) not in self.library_convs and not _direct(op.attrs, g.tensors[op.inputs[1]].shape):
                im2col[id(op)] = name = f"gir_im2col_{len(im2col)}"
                x, w, y = (g.tensors[t] for t in (op.inputs[0], op.inputs[1], op.outputs[0]))
                nsp = len(x.shape) - 2
                source += "\n" + im2col_source(name, x.shape, w.shape[2:], op.attrs["strides"], op.attrs["pads"][:nsp],
                                               op.attrs["dilations"], y.shape[2:], np_dtype(x.dtype).itemsize)
        kernels = [launch[1] for launch in launches if not isinstance(launch, BasicOp)]
        check_shared(kernels, target, static_shared)
        binary = compile_source(source, target.arch)
        check_resources(kernels, binary.resources, target, spills="warn")

        # resident device memory: everything a run touches is allocated and placed now
        self.arena = launcher.alloc(max(1, memory.arena_bytes))
        self.constants = {}
        for n, t in g.tensors.items():
            if t.value is not None:
                self.constants[n] = launcher.alloc(max(1, t.value.nbytes))
                launcher.upload(self.constants[n], np.ascontiguousarray(t.value, np_dtype(t.dtype)))
        self.inputs = {n: launcher.alloc(max(1, self._nbytes(n))) for n in g.inputs}
        self.fresh = {r: launcher.alloc(max(1, self._nbytes(r))) for r in sorted(output_roots(plan))}
        col_bytes = max([self._col_bytes(op) for op in library if id(op) in im2col], default=0)
        self.col = launcher.alloc(col_bytes) if col_bytes else None
        self.conv_calls = {id(op): self._conv(op, bias=not self._bias_by_gemm(op)) for op in convs
                           if id(op) in self.library_convs}
        ones = {}  # dtype -> elements: the longest row of ones a conv bias GEMM reads
        for op in convs:
            if self._bias_by_gemm(op):
                y = g.tensors[op.outputs[0]]
                ones[y.dtype] = max(ones.get(y.dtype, 0), prod(y.shape[2:]))
        self.ones = {dtype: launcher.alloc(count * np_dtype(dtype).itemsize) for dtype, count in ones.items()}
        for dtype, buf in self.ones.items():
            launcher.upload(buf, np.ones(buf.nbytes // np_dtype(dtype).itemsize, np_dtype(dtype)))

        # gather flags: one int per gathering kernel; those a run reads back first
        gathering = [launch for launch in launches if not isinstance(launch, BasicOp) and launch[1].gathers]
        gather_ops, host_checked = {op.name for op in g.ops if op.kind == "gather"}, host_checked_gathers(plan)

        def device_indices(step: int) -> bool:  # conservative: unknown means read it back
            found = [o for o in plan.steps[step].ops if o in gather_ops]
            return not found or any(o not in host_checked for o in found)
        checked = [device_indices(i) for i, _ in gathering]
        order = sorted(range(len(gathering)), key=lambda j: not checked[j])
        slot = {id(gathering[j][1]): s for s, j in enumerate(order)}
        self.read_flags = sum(checked)  # the first read_flags ints: kernels with device-computed indices
        self.flags = launcher.alloc(4 * len(gathering)) if gathering else None
        self.gathers = [gather_origins(plan, plan.steps[gathering[j][0]].ops) for j in order]
        if self.flags is not None:  # zeroed now, and again only after a run that set one
            launcher.upload(self.flags, np.zeros(len(gathering), np.int32))

        self.program = []  # ("launch", kernel, grid, block, shared, args) | ("gemm", Gemm) | ("conv", Conv)
        self.kernel_steps = []  # per program entry: the plan step of a GIR kernel's launch, else None
        self.library_steps = []  # per program entry: the library op it is part of, else None
        for launch in launches:
            if isinstance(launch, BasicOp):
                calls = self._library_calls(launch, binary, im2col)
                self.program += calls
                self.kernel_steps += [None] * len(calls)
                self.library_steps += [launch.name] * len(calls)
                continue
            i, k = launch
            self.kernel_steps.append(i)
            self.library_steps.append(None)
            args = [self._buffer(*locate(plan, memory, i, b), b.nbytes) for b in k.params]
            if k.gathers:
                args.append(DeviceBuffer(self.flags.ptr + 4 * slot[id(k)], 4))
            # 0 bytes of dynamic shared memory: the emitters declare each kernel's shared arrays
            # statically (k.shared_bytes counts them), so passing those bytes again reserved
            # them twice per block and cost occupancy.
            self.program.append(("launch", launcher.load(binary, k.name), k.num_blocks, k.block_threads,
                                 0, args))
        for call in self.program:
            if call[0] == "gemm":
                launcher.prepare_gemm(call[1])
        self.out_host = {n: launcher.host_array(self._nbytes(n)) for n in g.outputs}
        self.in_host = {n: launcher.host_array(self._nbytes(n)) for n in g.inputs}
        self.flags_host = launcher.host_array(4 * max(1, self.read_flags))
        self.graph = None
        if launcher.supports_capture and os.environ.get("GIR_DEVICE_GRAPHS", "1") != "0":
            launcher.begin_capture()
            try:
                self.enqueue()
            except Exception as e:  # noqa: BLE001 -- a call the API cannot capture: launch without a graph
                try:
                    launcher.end_capture()
                except Exception:  # noqa: BLE001 -- the capture was invalidated; the stream is usable again
                    pass
                self.library_note = f"no graph: capture failed ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
            else:
                self.graph = launcher.end_capture()
        launcher.synchronize()  # the weights are on the device before the first run
        self._lock = threading.Lock()

    def _nbytes(self, name: str) -> int:
        t = self.plan.graph.tensors[name]
        return t.size * np_dtype(t.dtype).itemsize

    def _col_bytes(self, op: BasicOp) -> int:
        g = self.plan.graph
        x, w, y = (g.tensors[t] for t in (op.inputs[0], op.inputs[1], op.outputs[0]))
        return x.shape[0] * x.shape[1] * prod(w.shape[2:]) * prod(y.shape[2:]) * np_dtype(x.dtype).itemsize

    def _buffer(self, where: str, what, nbytes: int) -> DeviceBuffer:
        if where == "arena":
            return DeviceBuffer(self.arena.ptr + what, nbytes)
        if where == "const":
            return self.constants[what]
        return self.inputs[what] if what in self.inputs else self.fresh[what]

    def _tensor(self, name: str) -> DeviceBuffer:
        """Where a model tensor lives on the device (views resolved)."""
        name = self.plan.aliases.get(name, name)
        if name in self.memory.offsets:
            return DeviceBuffer(self.arena.ptr + self.memory.offsets[name], self._nbytes(name))
        if name in self.constants:
            return self.constants[name]
        return self.inputs[name] if name in self.inputs else self.fresh[name]

    def _conv_library(self, convs: list) -> str | None:
        """The launcher's convolution library for this plan's convs, or None (im2col + GEMM)."""
        if not convs:
            return None
        if os.environ.get("GIR_DEVICE_CONV", "library") == "im2col":
            self.launcher.conv_note = "GIR_DEVICE_CONV=im2col"
            return None
        return self.launcher.open_conv()

    def _conv_path(self, conv_library: str | None, convs: int) -> str:
        """How the plan's convolutions run, for `library_path`."""
        im2col = f"im2col + {self.launcher.library}"
        if conv_library is None:
            return f"{im2col} ({self.launcher.conv_note})"
        apart = convs - len(self.library_convs)
        return conv_library + (f" ({apart} as {im2col})" if apart else "")

    def _bias_by_gemm(self, op: BasicOp) -> bool:
        """A conv's bias is added by a rank-1 GEMM: an im2col conv's, or a library conv's whose
        library did not fuse it."""
        return len(op.inputs) > 2 and self.library_convs.get(id(op)) is not True

    def _conv(self, op: BasicOp, placed: bool = True, bias: bool = True):
        """The op's dnn.Conv on its device pointers; `placed=False`: the shape alone, before
        allocation (pointers 0, a bias marked by 1), for the library to plan."""
        g = self.plan.graph
        x, w, y = op.inputs[0], op.inputs[1], op.outputs[0]
        ptr = (lambda name: self._tensor(name).ptr) if placed else (lambda name: 0)
        b = (ptr(op.inputs[2]) if placed else 1) if bias and len(op.inputs) > 2 else 0
        return conv_call(g.tensors[y].dtype, ptr(x), g.tensors[x].shape, ptr(w), g.tensors[w].shape, ptr(y),
                         g.tensors[y].shape, op.attrs, b)

    def _library_calls(self, op: BasicOp, binary, im2col: dict) -> list[tuple]:
        g = self.plan.graph
        dtype = g.tensors[op.outputs[0]].dtype
        size = np_dtype(dtype).itemsize
        y = self._tensor(op.outputs[0])
        if op.kind == "matmul":  # the epilogue (checked by _check_epilogue) as cuBLASLt's
            a, b = op.inputs[:2]
            steps = op.attrs.get("epilogue", ())
            residual = [self._tensor(op.inputs[int(i)]).ptr for k, i, _ in steps if k == "residual"]
            act = [k for k, *_ in steps if k != "residual"]
            return [("gemm", gemm) for gemm in row_major_matmul(
                dtype, self._tensor(a).ptr, g.tensors[a].shape, self._tensor(b).ptr, g.tensors[b].shape, y.ptr, size,
                beta=1.0 if residual else 0.0, c_in=residual[0] if residual else 0,
                bias=self._tensor(op.inputs[2]).ptr if op.attrs.get("bias") else 0, activation=act[0] if act else "")]
        x_shape, w_shape, y_shape = (g.tensors[t].shape for t in (op.inputs[0], op.inputs[1], op.outputs[0]))
        n, groups = x_shape[0], op.attrs["group"]
        m, cpg, taps, positions = w_shape[0], w_shape[1], prod(w_shape[2:]), prod(y_shape[2:])
        calls, col = [], self._tensor(op.inputs[0])
        if id(op) in self.library_convs:
            calls.append(("conv", self.conv_calls[id(op)]))
        elif id(op) in im2col:
            total = n * x_shape[1] * taps * positions
            kernel = self.launcher.load(binary, im2col[id(op)])
            calls.append(("launch", kernel, -(-total // IM2COL_THREADS), IM2COL_THREADS, 0, [col, self.col]))
            col = self.col
        if id(op) not in self.library_convs:  # Y[n, g] (M/G x P) = W[g] (M/G x C/G*taps) @ col[n, g] (C/G*taps x P)
            calls += [("gemm", gemm) for gemm in row_major_matmul(
                dtype, self._tensor(op.inputs[1]).ptr, (1, groups, m // groups, cpg * taps),
                col.ptr, (n, groups, cpg * taps, positions), y.ptr, size)]
        if self._bias_by_gemm(op):  # Y[n, g] += bias[g] (M/G x 1) @ ones (1 x P)
            calls += [("gemm", gemm) for gemm in row_major_matmul(
                dtype, self._tensor(op.inputs[2]).ptr, (1, groups, m // groups, 1),
                self.ones[dtype].ptr, (1, 1, 1, positions), y.ptr, size, beta=1.0, c_batch=(n, groups))]
        return calls

    def enqueue(self, program: list | None = None) -> None:
        """Enqueue `program` (entries of self.program; all of it by default) on the launcher's stream."""
        launcher = self.launcher
        for call in self.program if program is None else program:
            if call[0] == "gemm":
                launcher.gemm(call[1])
            elif call[0] == "conv":
                launcher.conv(call[1])
            else:
                launcher.launch(*call[1:])

    def _check_gathers(self) -> None:
        if not self.read_flags:
            return
        flags = self.flags_host[:4 * self.read_flags].view(np.int32)
        if flags.any():
            self.launcher.upload(self.flags, np.zeros(len(self.gathers), np.int32))
            self.launcher.synchronize()
            raise GatherIndexError(f"{self.plan.graph.model_name}: {self.gathers[int(np.argmax(flags))]}: an index is "
                                   f"outside [-n, n) of the axis it selects from")

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Feeds in, the plan (or its graph), outputs out, one wait."""
        g, launcher = self.plan.graph, self.launcher
        with self._lock:
            for n in g.inputs:
                staged = self.in_host[n]
                staged[:] = np.ascontiguousarray(feeds[n]).reshape(-1).view(np.uint8)
                launcher.copy_in(self.inputs[n], staged)
            if self.graph is not None:
                launcher.replay(self.graph)
            else:
                self.enqueue()
            for n in g.outputs:
                launcher.copy_out(self._tensor(n), self.out_host[n])
            if self.read_flags:
                launcher.copy_out(DeviceBuffer(self.flags.ptr, 4 * self.read_flags), self.flags_host[:4 * self.read_flags])
            launcher.sync()
            self._check_gathers()
            return {n: self.out_host[n].view(np_dtype(g.tensors[n].dtype)).reshape(g.tensors[n].shape).copy()
                    for n in g.outputs}
