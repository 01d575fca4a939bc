"""An onnx.backend.base.Backend that runs models through GIR's frontend.

``run`` loads the model with gir.frontend.load and executes the BasicGraph with an executor:
``run_reference`` by default. Another executor (e.g. the GIR interpreter through templates)
is swapped in with ``set_executor(fn)`` for the whole module, or per backend class with
``make_backend(fn)``; an executor is ``fn(graph: BasicGraph, feeds: dict) -> dict``.

GIR compiles static shapes, so graph inputs that feed shape-like positions (Reshape's shape,
Slice's starts, ...) are bound as constants before loading: the backend test feeds them as
ordinary inputs, which is the only way an onnx node test can pass them.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from gir.frontend import BasicGraph, check_graph, load, run_reference, static_inputs

Executor = Callable[[BasicGraph, dict], dict]
EXECUTOR: Executor = run_reference


def set_executor(fn: Executor) -> Executor:
    """Make ``fn`` the module-wide default executor; returns the previous one."""
    global EXECUTOR
    previous, EXECUTOR = EXECUTOR, fn
    return previous


class GirBackendRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, executor: Executor | None):
        self.model = model
        self.executor = executor
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self.static = static_inputs(model)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(self.input_names, inputs))
        constants = {name: feeds.pop(name) for name in self.static if name in feeds}
        graph = load(self.model, constants=constants)
        check_graph(graph)  # every backend case also checks the BasicGraph contract
        executor = self.executor or EXECUTOR
        out = executor(graph, {name: feeds[name] for name in graph.inputs})
        return tuple(out[name] for name in self.output_names)


class GirBackend(Backend):
    executor: Executor | None = None  # None: the module-level EXECUTOR

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> GirBackendRep:
        super().prepare(model, device, **kwargs)
        return GirBackendRep(model, cls.executor)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


def make_backend(executor: Executor, name: str = "GirBackendWith") -> type[GirBackend]:
    """A GirBackend subclass bound to ``executor`` (leaves the module default alone)."""
    return type(name, (GirBackend,), {"executor": staticmethod(executor)})
