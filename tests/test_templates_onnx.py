"""Every single-op ONNX case of test_frontend_ops.py again, executed as GIR-Graphs in the
reference interpreter and compared with onnxruntime there. Every template candidate of every
basic operator runs (a seeded sample of 20, at least one per structure, where there are more)
and must reproduce the tensor the first candidate produced, which check() compares with
onnxruntime end to end."""
import numpy as np
import pytest

import test_frontend_ops
from gir.frontend.reference import execute_op
from gir.ir import get_target, run
from gir.templates import candidates
from test_frontend_ops import *  # noqa: F401,F403  (re-collects the cases under this module)

H100 = get_target("h100")
SAMPLE = 20
# cases of test_frontend_ops that test the frontend itself, not an op's numbers
for _name in ["test_single_step_op_named_after_node_and_origin", "test_input_shapes_override_symbolic_dim",
              "test_constants_argument_binds_inputs", "test_lower_matmul", "test_lower_matmul_matvec_expands_only_the_vector",
              "test_lower_conv", "test_conv_reference_matches_direct_loops", "test_check_graph_rejects_broken_graphs",
              "test_run_reference_checks_feeds", "test_layout_semantics_negative_and_zero_strides",
              "test_every_supported_op_is_tested", "test_fp16_layernorm_computes_in_fp32"]:
    globals().pop(_name, None)


def every_candidate(graph, feeds):
    env = {n: t.value for n, t in graph.tensors.items() if t.value is not None} | dict(feeds)
    for index, op in enumerate(graph.ops):
        args = [env[t] for t in op.inputs]
        out = graph.tensors[op.outputs[0]]
        found = candidates(op, graph.tensors, H100) if op.kind not in ("matmul", "conv") else None
        if not found or not found.candidates:
            env[out.name] = args[0].reshape(out.shape) if op.kind == "view" else execute_op(op, graph.tensors, args)
            continue
        results = []
        for cand in found.sample(SAMPLE, seed=index):
            value = run(cand.graph, dict(zip(op.inputs, args))).outputs[out.name].reshape(out.shape)
            if results:
                np.testing.assert_allclose(value, results[0], rtol=1e-5, atol=1e-6, equal_nan=True,
                                           err_msg=f"{op.name}: candidate {cand.label} differs from the first")
            results.append(value)
        env[out.name] = results[0]
    return {name: env[name] for name in graph.outputs}


@pytest.fixture(autouse=True)
def through_gir(monkeypatch):
    monkeypatch.setattr(test_frontend_ops, "run_reference", every_candidate)
