"""Run a Plan's steps in order. Library ops (matmul, conv) run through numpy, the CPU
stand-in for cuBLAS/hipBLAS; GIR kernels run in the reference interpreter ("interpreter"
engine), which executes exactly the GIR-Graphs the backends emit."""
from __future__ import annotations

import numpy as np

from gir.frontend.basic import BasicOp
from gir.frontend.reference import execute_op
from gir.fusion.plan import Kernel, Plan
from gir.ir import run
from gir.ir.interpreter import GatherRangeError

from .indices import GatherIndexError, gather_origins
from .library import run_library_op


class ExecutionError(RuntimeError):
    pass


def execute(plan: Plan, feeds: dict[str, np.ndarray], check_races: bool = False, memory=None) -> dict[str, np.ndarray]:
    """`memory`: a MemoryPlan; intermediates then live in its arena at their planned offsets,
    so a wrong plan (two live tensors overlapping) shows up as wrong numbers in tests."""
    g = plan.graph
    env: dict[str, np.ndarray] = {n: t.value for n, t in g.tensors.items() if t.value is not None}
    env.update(feeds)
    arena = np.zeros(memory.arena_bytes, np.uint8) if memory else None

    def value(name: str) -> np.ndarray:
        root = plan.aliases.get(name, name)
        if root not in env:
            raise ExecutionError(f"{g.model_name}: tensor {name!r} is needed before any step produced it")
        return env[root].reshape(g.tensors[name].shape)

    coverage: dict[str, np.ndarray] = {}
    for step in plan.steps:
        if isinstance(step, BasicOp):
            run_op = run_library_op if step.attrs.get("absorbed") else execute_op  # with its epilogue
            env[step.outputs[0]] = run_op(step, g.tensors, [value(t) for t in step.inputs])
        else:
            try:
                _run_kernel(step, value, env, coverage, check_races)
            except GatherRangeError as err:  # bad input data, not a GIR bug: say which node
                raise GatherIndexError(f"{g.model_name}: {gather_origins(plan, step.ops)}: {err}") from None
        if arena is not None:
            _into_arena(env, arena, memory.offsets, step.outputs if isinstance(step, BasicOp) else step.writes)
    for name, mask in coverage.items():
        if not mask.all():
            raise ExecutionError(f"{g.model_name}: {int((~mask).sum())} elements of {name!r} were written by no kernel")
    return {name: value(name) for name in g.outputs}


def _into_arena(env, arena, offsets, names) -> None:
    """Move freshly written intermediates into their arena slots (views from then on)."""
    for name in names:
        if name in offsets and name in env:
            view = arena[offsets[name]:offsets[name] + env[name].nbytes].view(env[name].dtype).reshape(env[name].shape)
            if view is not env[name]:
                view[...] = env[name]
                env[name] = view


def _run_kernel(kernel: Kernel, value, env, coverage, check_races: bool) -> None:
    """Kernels may write disjoint parts of one tensor: merge by the elements each wrote."""
    inputs = {b.name: value(b.name) for b in kernel.graph.buffers.values() if b.role in ("input", "const")}
    result = run(kernel.graph, inputs, check_races=check_races, complete=False)
    for name, data in result.outputs.items():
        mask = result.written[name]
        if name in env and name in coverage:
            env[name] = np.where(mask, data, env[name])
            coverage[name] |= mask
        else:
            env[name], coverage[name] = data, mask.copy()
