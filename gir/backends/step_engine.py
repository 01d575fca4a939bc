"""The plan engine a port gets for free: every fused step run through the port's own
`run(graph, feeds)` (the conformance suite's launcher), library ops (matmul, conv) in numpy on
the host. Why: `gir run` and `gir.Session` then work on a backend as soon as its four port
names do, before anyone writes a resident engine for it (memory kept on the device, one
program per plan, as the CPU and GPU engines do). Every step is compiled when the session is
created, so a kernel the toolchain rejects is an error then, not at the first run.
"""
from __future__ import annotations

import threading

import numpy as np

from gir.frontend.basic import BasicOp
from gir.runtime.indices import GatherIndexError, gather_origins
from gir.runtime.library import run_library_op

from .errors import IndexOutOfRange
from .registry import Engine


def step_engine(run, compile=None) -> Engine:
    """The Engine of a backend whose `run(graph, feeds)` launches one GIR-Graph."""
    return Engine(open=lambda target, model: lambda plan, memory, **options: StepEngine(plan, run, compile))


class StepEngine:
    """`run(feeds)`: the plan's steps in order; a kernel writing part of a tensor starts from
    what earlier steps wrote (it is given as that output's starting value)."""

    library_path = "numpy"

    def __init__(self, plan, run, compile=None):
        self.plan, self._run = plan, run
        if compile is not None:
            for step in plan.steps:
                if not isinstance(step, BasicOp):
                    compile(step.graph, plan.target)
        self._lock = threading.Lock()

    def run(self, feeds: dict) -> dict:
        plan, g = self.plan, self.plan.graph
        env = {n: t.value for n, t in g.tensors.items() if t.value is not None} | dict(feeds)

        def value(name):
            return np.asarray(env[plan.aliases.get(name, name)]).reshape(g.tensors[name].shape)

        with self._lock:
            for step in plan.steps:
                if isinstance(step, BasicOp):
                    args = [value(t) for t in step.inputs]
                    env[step.outputs[0]] = run_library_op(step, g.tensors, args).reshape(g.tensors[step.outputs[0]].shape)
                    continue
                given = {b.name: value(b.name) for b in step.graph.buffers.values()
                         if b.role in ("input", "const") or (b.role == "output" and plan.aliases.get(b.name, b.name) in env)}
                try:
                    env.update(self._run(step.graph, given))
                except IndexOutOfRange:
                    raise GatherIndexError(f"{g.model_name}: {gather_origins(plan, step.ops)}: an index is outside "
                                           f"[-n, n) of the axis it selects from") from None
        return {name: value(name).copy() for name in g.outputs}
