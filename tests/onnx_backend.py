"""gir.backend as the onnx node-test modules use it: every loaded BasicGraph is also checked
against the BasicGraph contract, then run by an executor ``fn(graph, feeds) -> dict``:
the numpy reference (ReferenceBackend, test_onnx_backend_nodes), each op through its template
(test_onnx_backend_templates), or the whole pipeline (test_onnx_backend_pipeline)."""
from __future__ import annotations

from typing import Callable

from gir.backend import GirBackend, make_backend as bind_compiler
from gir.frontend import BasicGraph, check_graph, run_reference

Executor = Callable[[BasicGraph, dict], dict]


def make_backend(executor: Executor, name: str) -> type[GirBackend]:
    def compile_graph(graph: BasicGraph):
        check_graph(graph)
        return lambda feeds: executor(graph, feeds)
    return bind_compiler(compile_graph, name)


ReferenceBackend = make_backend(run_reference, "GirReferenceBackend")
