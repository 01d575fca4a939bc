"""Run a BasicGraph op by op: memory-intensive ops through a chosen template candidate in the
reference interpreter, views as reshapes, library ops (matmul, conv) through numpy.

This is the oracle path for templates (issue: every candidate must match onnxruntime); the
compiled path fuses across ops instead.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from gir.frontend.basic import BasicGraph
from gir.frontend.reference import execute_op
from gir.ir import run
from gir.ir.target import Target

from . import Candidate, Candidates, candidates, shape_only

LIBRARY = ("matmul", "conv")


def first(cands: Candidates) -> Candidate:
    return cands.candidates[0]


def run_with_templates(graph: BasicGraph, feeds: dict[str, np.ndarray], target: Target,
                       choose: Callable[[Candidates], Candidate] = first) -> dict[str, np.ndarray]:
    env = {n: t.value for n, t in graph.tensors.items() if t.value is not None}
    env.update(feeds)
    for op in graph.ops:
        args = [env[t] for t in op.inputs]
        out = graph.tensors[op.outputs[0]]
        if op.kind == "view":
            env[out.name] = args[0].reshape(out.shape)
        elif op.kind in LIBRARY or shape_only(op, graph.tensors):
            env[out.name] = execute_op(op, graph.tensors, args)  # library call, or shape-only value
        else:
            cand = choose(candidates(op, graph.tensors, target))
            result = run(cand.graph, dict(zip(op.inputs, args)))
            env[out.name] = result.outputs[out.name].reshape(out.shape)
    return {name: env[name] for name in graph.outputs}
