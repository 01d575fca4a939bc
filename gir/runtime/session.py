"""`gir.Session`: an onnxruntime-like inference session over a compiled plan."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import get_target
from gir.ir.dtypes import np_dtype

from .executor import execute
from .memory import plan_memory


class SessionError(ValueError):
    """Bad feeds or output names: the message names the model and the tensor."""


@dataclass(frozen=True)
class NodeArg:
    """Like onnxruntime's NodeArg: name, shape, element type."""
    name: str
    shape: list
    type: str


class Session:
    """Session(path_or_ModelProto, target="cpu").run(output_names, feeds), as onnxruntime's
    InferenceSession. Library ops run through numpy; GIR kernels run in the reference
    interpreter (the engine available on every machine)."""

    def __init__(self, model, target: str = "cpu", limit: int = 2, progress=None):
        self.graph = load(model)
        self.target = get_target(target)
        self.plan = plan(self.graph, self.target, limit=limit, progress=progress)
        self.memory = plan_memory(self.plan)

    def _args(self, names) -> list[NodeArg]:
        t = self.graph.tensors
        return [NodeArg(n, list(t[n].shape), f"tensor({t[n].dtype})") for n in names]

    def get_inputs(self) -> list[NodeArg]:
        return self._args(self.graph.inputs)

    def get_outputs(self) -> list[NodeArg]:
        return self._args(self.graph.outputs)

    def run(self, output_names, feeds: dict) -> list[np.ndarray]:
        model = self.graph.model_name
        names = list(output_names) if output_names else list(self.graph.outputs)
        for n in names:
            if n not in self.graph.outputs:
                raise SessionError(f"{model}: no output named {n!r}; outputs are {', '.join(self.graph.outputs)}")
        checked = {}
        for n in feeds:
            if n not in self.graph.inputs:
                raise SessionError(f"{model}: no input named {n!r}; inputs are {', '.join(self.graph.inputs)}")
        for n in self.graph.inputs:
            if n not in feeds:
                raise SessionError(f"{model}: missing input {n!r}")
            t, value = self.graph.tensors[n], np.asarray(feeds[n])
            if tuple(value.shape) != tuple(t.shape):
                raise SessionError(f"{model}: input {n!r} has shape {list(value.shape)}, expected {list(t.shape)}")
            if value.dtype != np_dtype(t.dtype):
                raise SessionError(f"{model}: input {n!r} has dtype {value.dtype}, expected {t.dtype}")
            checked[n] = value
        outputs = execute(self.plan, checked, memory=self.memory)
        return [outputs[n] for n in names]
