"""onnx's backend interface (onnx.backend.base) over GIR, so that onnx's backend node tests,
and any code written against that interface, run the whole pipeline: by default plan for the
CPU target and run on the native engine (emitted C + OpenMP, library ops through numpy).

GIR compiles static shapes, so graph inputs that feed shape-like positions (Reshape's shape,
Slice's starts, ...) are bound as constants when the model is loaded: the backend interface
feeds them as ordinary inputs, the only way an onnx node test can pass them. A model without
such inputs is compiled in `prepare`; one with them, at each run (its values are known then).
`prepare(model, input_shapes={...})` binds symbolic dims (as gir.Session's `input_shapes`).

How a loaded BasicGraph runs is a `Compiler`: `fn(graph) -> (feeds -> outputs by name)`;
`make_backend` binds another one (the tests' numpy reference and per-op template paths).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

from gir.backends.registry import HOST_TARGET
from gir.frontend import BasicGraph, load, static_inputs
from gir.frontend.external_data import refuse_unresolved

Runner = Callable[[dict], dict]
Compiler = Callable[[BasicGraph], Runner]


def session_compiler(target: str = HOST_TARGET, engine: str = "native", limit: int = 1) -> Compiler:
    """Plan for `target` (`limit` parallel structures tried per group) and run on `engine`."""
    def compile_graph(graph: BasicGraph) -> Runner:
        from gir.runtime import Session
        session = Session(graph, target=target, engine=engine, limit=limit)
        return lambda feeds: dict(zip(graph.outputs, session.run(None, feeds)))
    return compile_graph


class GirBackendRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, compiler: Compiler, input_shapes: dict | None = None):
        self.model, self.compiler, self.input_shapes = model, compiler, input_shapes
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self.static = static_inputs(model)
        self.graph = None if self.static else load(model, input_shapes=input_shapes)
        self.runner = None if self.static else compiler(self.graph)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            feeds = dict(zip(self.input_names, [inputs] if isinstance(inputs, np.ndarray) else inputs))
        graph, runner = self.graph, self.runner
        if self.static:
            graph = load(self.model, input_shapes=self.input_shapes,
                         constants={n: feeds.pop(n) for n in self.static if n in feeds})
            runner = self.compiler(graph)
        out = runner({name: feeds[name] for name in graph.inputs})
        return tuple(out[name] for name in self.output_names)


class GirBackend(Backend):
    compiler: Compiler = staticmethod(session_compiler())

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", input_shapes: dict | None = None,
                **kwargs: Any) -> GirBackendRep:
        # first: onnx.checker would look for unresolved external data relative to the working folder
        refuse_unresolved(model, f"model '{model.graph.name or 'model'}'")
        super().prepare(model, device, **kwargs)
        return GirBackendRep(model, cls.compiler, input_shapes)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None, **kwargs: Any):
        """One node as a model of its own: inputs typed by the arrays given, outputs by
        `outputs_info` when given, else by onnx's shape inference."""
        super().run_node(node, inputs, device, outputs_info, **kwargs)
        arrays = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
        names = [n for n in node.input if n]
        model = _node_model(node, names, arrays, outputs_info, kwargs.get("opset_version"))
        return cls.run_model(model, dict(zip(names, arrays)), device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


def _node_model(node, names, arrays, outputs_info, opset) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in zip(names, arrays)]
    kwargs = {"opset_imports": [helper.make_opsetid("", opset)]} if opset else {}

    def model(outputs):
        graph = helper.make_graph([node], f"{node.op_type}_node", inputs, outputs)
        return helper.make_model(graph, ir_version=10, **kwargs)

    if outputs_info:
        return model([helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
                      for n, (dt, shape) in zip(node.output, outputs_info)])
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model([]), strict_mode=True).graph.value_info}
    return model([inferred[n] for n in node.output if n])


def make_backend(compiler: Compiler, name: str = "GirBackendWith") -> type[GirBackend]:
    """A GirBackend subclass that runs loaded graphs with `compiler`."""
    return type(name, (GirBackend,), {"compiler": staticmethod(compiler)})


# module-level functions: onnx.backend.test.BackendTest(gir.backend) takes the module itself
prepare = GirBackend.prepare
run_model = GirBackend.run_model
run_node = GirBackend.run_node
supports_device = GirBackend.supports_device
is_compatible = GirBackend.is_compatible
