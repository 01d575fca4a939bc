"""The CPU backend's plan engine: every GIR kernel of a plan emitted as C and built into one shared
library when the session is created; a run binds pointers and calls the kernels in plan order.

Why one library per plan: one compiler call instead of one per kernel (compile time is
dominated by starting gcc), and the build cache then keys a whole model. Intermediates and
kernel-local DRAM buffers live at their planned offsets in one arena, so kernels writing
disjoint parts of a tensor simply write the same memory, and a view shares its storage.
Library ops (matmul, conv) run on oneDNN (gir/runtime/onednn.py: primitives and reordered weights made here,
results written into their arena slots), or through numpy (BLAS, library.py) where oneDNN is
missing or does not take the op; `library_path` says which."""
from __future__ import annotations

import ctypes
import threading
import time
from functools import partial

import numpy as np

from gir.frontend.basic import BasicOp
from gir.ir.dtypes import np_dtype
from gir.runtime import onednn
from gir.runtime.awake_call import awake_plan, awake_thunk
from gir.runtime.indices import GatherIndexError, gather_origins
from gir.runtime.library import run_library_op
from gir.runtime.memory import MemoryPlan, locate, output_roots

from ..kernels import emit_plan, plan_launches
from .awake import woken_kernels
from .compiler import build
from .emitter import CpuEmitter


class NativeCpuEngine:
    """`library_path`: "onednn X.Y.Z" when every library op runs on oneDNN, "numpy" when none
    does (`library_note` says why), both with counts, or "none" for a plan without library
    ops; `library_ops` maps each library op's name to its oneDNN implementation or the reason
    numpy runs it. `library` chooses: None (oneDNN where it can, $GIR_CPU_LIBRARY=numpy turns
    it off) or "numpy". `layouts`: library op name -> (blocked, threads) (onednn.prepare), as
    chosen before (a session read back from the cache); the engine's own choices are its `layouts`.
    `emitted`: emit_plan's (source, launches) of this plan, kept with it (the session cache), else
    emitted here; the engine's `emitted`."""

    def __init__(self, plan, memory: MemoryPlan, library: str | None = None, layouts: dict | None = None,
                 emitted: tuple | None = None):
        self.plan, self.memory = plan, memory
        g = plan.graph
        if emitted is None:
            launches = plan_launches(plan)
            emitter = CpuEmitter(plan.target)
            emitter.woken = woken_kernels(plan, launches)
            emitted = emit_plan(emitter, plan, launches) + (sorted(emitter.woken),)
        source, launches, woken = self.emitted = emitted
        team = CpuEmitter(plan.target)  # whether a kernel forks the pool: the emitter's own rule
        team.woken = frozenset(woken)
        lib = build(source, g.model_name)
        self.arena = onednn.aligned_bytes(memory.arena_bytes, 256)  # the memory plan's ALIGN, from its start
        self.constants = {n: np.ascontiguousarray(t.value, np_dtype(t.dtype)).reshape(-1)
                          for n, t in g.tensors.items() if t.value is not None}
        self.calls = []
        self.call_steps = []  # the plan step of each call (a fused group can need several kernels)
        forks = []  # per call: whether it forks the pool (a library op's: decided when it is made)
        self.oob = ctypes.c_int.in_dll(lib, "gir_gather_oob")  # set by a kernel that clamped an index
        self.gathers = {}  # kernel call -> the gather nodes it runs, for the error
        for launch in launches:
            if isinstance(launch, BasicOp):
                self.call_steps.append(next(i for i, s in enumerate(plan.steps) if s is launch))
                self.calls.append(launch)
                forks.append(None)
                continue
            i, k = launch
            self.call_steps.append(i)
            forks.append(team.forks_team(k))
            fn = getattr(lib, k.name)
            fn.argtypes, fn.restype = [ctypes.c_void_p] * len(k.params), None
            if k.gathers:
                self.gathers[len(self.calls)] = gather_origins(plan, plan.steps[i].ops)
            self.calls.append((fn, [self._address(*locate(plan, memory, i, b)) for b in k.params]))
        self.dnnl, self.library_ops, self.layouts = {}, {}, dict(layouts or {})
        for c, call in enumerate(self.calls):
            if isinstance(call, BasicOp):
                # the pool is awake only right after a call that forked it (the first call of a
                # run follows the caller's own work)
                asleep = c == 0 or not forks[c - 1]
                made = (onednn.prepare(call, g.tensors, self.constants, self.layouts.get(call.name), asleep)
                        if library != "numpy" else "library='numpy'")
                forks[c] = not isinstance(made, str) and made.threads != 1
                if isinstance(made, str):
                    self.library_ops[call.name] = f"numpy: {made}"
                else:
                    self.dnnl[c] = made
                    self.library_ops[call.name] = (f"onednn: {made.impl}" + (f" ({made.layout})" if made.layout else "")
                                                   + (" (one thread)" if made.threads == 1 else "")
                                                   + (" (epilogue apart)" if made.separate else ""))
                    self.layouts[call.name] = made.choice
        if self.dnnl:  # one pair of staging buffers for every primitive (ops run one at a time)
            src_stage, dst_stage = (onednn.aligned_bytes(max(d.staging[i] for d in self.dnnl.values()))
                                    for i in (0, 1))
            for d in self.dnnl.values():
                d.stage(src_stage, dst_stage)
        self.handoffs = self._hand_off()
        self.awake, self.awake_choice = awake_plan(forks)
        self.library_path, self.library_note = self._describe_path(library)
        self.fresh = output_roots(plan)
        self._lock = threading.Lock()  # one arena: runs of one session take turns
        self._args = [self._call_args(c, call) for c, call in enumerate(self.calls)]
        # per mode (awake or not, AwakeChoice), the thunks whose arguments never change
        self._fixed = {mode: {c: self._thunk(c, args, mode) for c, args in enumerate(self._args)
                              if args is not None and not any(isinstance(a, str) for a in args)}
                       for mode in ((True, False) if self.awake else (False,))}

    def _where(self, name: str):
        """A tensor's fixed address (arena slot or constant), or its name where the run binds it
        (an input, or an output given to the caller)."""
        name = self.plan.aliases.get(name, name)
        if name in self.memory.offsets:
            return self.arena.ctypes.data + self.memory.offsets[name]
        return self.constants[name].ctypes.data if name in self.constants else name

    def _call_args(self, c: int, call) -> list | None:
        """Each argument of call c as an address or a per-run name, worked out once: binding
        them again at every run cost 5 us a call in Python, 104 of the 185 us a run of the
        exported BERT took. None for a library op numpy runs (bound per run)."""
        if c in self.dnnl:
            return [None if t is None else self._where(t) for t in self.dnnl[c].operands] + \
                [self._where(call.outputs[0])]
        if isinstance(call, BasicOp):
            return None
        return list(call[1])

    def _thunk(self, c: int, args: list, awake: bool = False):
        if awake and c in self.awake:
            thunk = self.dnnl[c].awake_thunk(*args) if c in self.dnnl else awake_thunk(self.calls[c][0], args)
            if thunk is not None:
                return thunk
        if c in self.dnnl:
            return partial(self.dnnl[c].call, *args)
        return partial(self.calls[c][0], *args)

    def _hand_off(self) -> list[tuple[str, str, int]]:
        """(op, next op, bytes) for each tensor one oneDNN op writes and only the next oneDNN op
        reads, as its source, where both primitives use the same blocked layout for it: the
        first leaves it in that layout in a buffer of its own and the second reads it there,
        instead of a reorder to NCHW into the arena and one back (SAR-DRN: 16.8 MB each way
        per conv). The tensor's arena slot is then never written; nothing else reads it (not a
        graph output, no view of it, no other reader). Buffers are shared between hand-offs
        whose lives do not overlap."""
        g = self.plan.graph
        readers: dict[str, list] = {}
        for op in g.ops:
            for t in op.inputs:
                readers.setdefault(t, []).append(op)
        viewed = set(self.plan.aliases.values()) | set(self.plan.aliases)
        at = {id(call): c for c, call in enumerate(self.calls) if c in self.dnnl}
        edges = []
        for a, d in self.dnnl.items():
            t = self.calls[a].outputs[0]
            who = readers.get(t, [])
            if t in g.outputs or t in viewed or len(who) != 1 or id(who[0]) not in at:
                continue
            b = at[id(who[0])]
            if b <= a or who[0].inputs[0] != t or t in who[0].inputs[1:]:
                continue
            size = d.handoff_bytes(self.dnnl[b])
            if size:
                edges.append((a, b, size))
        pool: list[list] = []  # [buffer, last reader]
        used_src: dict[int, np.ndarray] = {}
        used_dst: dict[int, np.ndarray] = {}
        for a, b, size in sorted(edges):
            free = next((p for p in pool if p[1] < a and p[0].nbytes >= size), None)
            if free is None:
                free = [onednn.aligned_bytes(size), b]
                pool.append(free)
            free[1] = b
            used_dst[a], used_src[b] = free[0], free[0]
        for c in set(used_src) | set(used_dst):
            self.dnnl[c].handoff(used_src.get(c), used_dst.get(c))
        return [(self.calls[a].name, self.calls[b].name, size) for a, b, size in sorted(edges)]

    def _describe_path(self, library) -> tuple[str, str]:
        on_dnnl, total = len(self.dnnl), len(self.library_ops)
        if not total:
            return "none", "the plan has no library ops"
        version = f"onednn {onednn.version()}" if on_dnnl else ""
        if total and on_dnnl == total:
            return version, ""
        if not on_dnnl:
            why = "library='numpy'" if library == "numpy" else onednn.unavailable()
            if not why:  # oneDNN is there but took none of the ops
                why = sorted(set(self.library_ops.values()))[0]
            return "numpy", why
        return f"{version} ({on_dnnl} of {total} ops; numpy {total - on_dnnl})", ""

    def _address(self, where: str, what):
        """A fixed address, or the tensor name of a buffer bound at each run."""
        if where == "arena":
            return self.arena.ctypes.data + what
        return self.constants[what].ctypes.data if where == "const" else what

    def _flat(self, name: str, per_run: dict) -> np.ndarray:
        name = self.plan.aliases.get(name, name)
        if name in self.memory.offsets:
            t = self.plan.graph.tensors[name]
            start = self.memory.offsets[name]
            return self.arena[start:start + t.size * np_dtype(t.dtype).itemsize].view(np_dtype(t.dtype))
        return self.constants[name] if name in self.constants else per_run[name]

    def bind(self, feeds: dict[str, np.ndarray], awake: bool = False) -> tuple[dict, list]:
        """The run's own buffers (inputs, fresh outputs) and, per call, a thunk that runs it;
        `awake`: the one-thread calls of `self.awake` keep the team spinning (awake_call.py)."""
        awake = awake and bool(self.awake)
        g = self.plan.graph
        per_run = {n: np.ascontiguousarray(feeds[n]).reshape(-1) for n in g.inputs}
        for root in self.fresh:
            per_run[root] = np.empty(g.tensors[root].size, np_dtype(g.tensors[root].dtype))
        pointers = {n: a.ctypes.data for n, a in per_run.items()}
        thunks = []
        for c, call in enumerate(self.calls):
            fixed = self._fixed[awake].get(c)
            if fixed is not None:
                thunks.append(fixed)
            elif self._args[c] is not None:
                thunks.append(self._thunk(c, [pointers[a] if isinstance(a, str) else a for a in self._args[c]], awake))
            else:
                def library(call=call):
                    args = [self._flat(t, per_run).reshape(g.tensors[t].shape) for t in call.inputs]
                    self._flat(call.outputs[0], per_run)[...] = run_library_op(call, g.tensors, args).reshape(-1)
                thunks.append(library)
        return per_run, thunks

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs by name, each an array of its own that later runs leave alone."""
        g = self.plan.graph
        with self._lock:
            awake = self.awake_choice.next() if self.awake_choice else False
            per_run, thunks = self.bind(feeds, awake)
            start = time.perf_counter()
            for c, thunk in enumerate(thunks):
                thunk()
                if c in self.gathers and self.oob.value:
                    self.oob.value = 0
                    raise GatherIndexError(f"{g.model_name}: {self.gathers[c]}: an index is outside [-n, n) "
                                           f"of the axis it selects from")
            if self.awake_choice:
                self.awake_choice.record(awake, time.perf_counter() - start)
        outputs, handed = {}, set()
        for name in g.outputs:
            root = self.plan.aliases.get(name, name)
            value = self._flat(name, per_run).reshape(g.tensors[name].shape)
            outputs[name] = value if root in self.fresh and root not in handed else value.copy()
            handed.add(root)
        return outputs


def open_engine(target, model: str):
    """The registry's Engine.open: nothing to open on the host; `make(plan, memory, library=,
    layouts=)` builds the plan's library."""
    return NativeCpuEngine
