"""The same onnx backend node tests as test_onnx_backend_nodes.py (same INCLUDE and EXCLUDED),
but every memory-intensive basic operator runs as a GIR-Graph (its first template candidate)
in the reference interpreter; matmul and conv go to numpy as the library would."""
from __future__ import annotations

from gir.ir import get_target
from gir.templates.execute import run_with_templates
from onnx_backend import make_backend
from test_onnx_backend_nodes import node_tests

H100 = get_target("h100")
TemplatesBackend = make_backend(lambda graph, feeds: run_with_templates(graph, feeds, H100), "GirTemplatesBackend")

# Left out here only, for suite time: Attention's function bodies (86 cases) are ops tested on their
# own; they run through the reference (test_onnx_backend_nodes) and scripts/onnx_node_census.py.
TEMPLATES_EXCLUDED = {
    r"^test_attention_.*_expanded_cpu$": "suite time only: op-by-op Attention bodies, run by the reference path",
}

globals().update(node_tests(TemplatesBackend, __name__, TEMPLATES_EXCLUDED))
