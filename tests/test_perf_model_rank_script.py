"""scripts/perf_model_rank.py on the two subgraphs that are not plain chains of elementwise and
reduce ops (a depthwise conv + SiLU and a GEMV + bias, lowered by the frontend into pad/layout
ops folded into a product and a reduction), at small shapes: the candidates are GIR's own
kernels, every one computes onnxruntime's numbers, and the rank statistics are numbers. No
threshold on tau and no timing assertion (a shared machine's measured order is noise-prone)."""
import math

import pytest


@pytest.mark.parametrize("kind, shape, folded", [
    ("dwconv_silu", (1, 8, 12, 12), "pad"),  # the conv's zero padding is read through, not a kernel
    ("gemv", (1, 1, 64, 256), "layout"),      # x broadcast against the weight is read through
])
def test_non_chain_subgraph_candidates_are_correct_and_ranked(rank, kind, shape, folded):
    result = rank.run(kind, shape=shape, count=6, rounds=2, per_round=2)
    assert result["skipped"] == [], result["skipped"]  # none failed the onnxruntime check or the emitter
    assert len(result["rows"]) == 6 and result["rows"][0]["search_pick"]
    assert any(folded in op for op in result["folded_ops"])
    assert {"mul", "sum"} <= {name.rsplit("/", 1)[-1] for name in result["ops"]}  # product and reduction
    assert result["rotation_sets"] >= 2
    a = result["agreement"]
    for key in ("kendall_tau_b", "spearman", "tau_dram_bytes", "tau_measurement_halves", "kendall_tau_b_min"):
        assert isinstance(a[key], float), key
    for key in ("kendall_tau_b", "spearman"):
        assert -1.0 <= a[key] <= 1.0 or math.isnan(a[key])
    assert all(r["model"]["seconds"] > 0 and r["measured"]["median_s"] > 0 for r in result["rows"])
    assert "Kendall tau-b" in rank.note(result, "pytest")


def test_check_reports_wrong_numbers_and_constants_rotate(rank):
    from gir.backends.cpu.emitter import CpuEmitter
    from gir.frontend import load
    from gir.ir import get_target

    model, target = rank.subgraph_model("gemv", (1, 1, 32, 64)), get_target("cpu")
    space = rank.plan_space(load(model), target)
    seq = rank.search_pick(space)
    fns, failed = rank.build_kernels(space, list(seq), CpuEmitter(target))
    assert not failed
    buffers = rank.Buffers(space.graph, 3, 0)
    weights = [n for n, t in space.graph.tensors.items() if t.value is not None]
    assert weights and all(buffers.sets[0][n] is not buffers.sets[1][n] for n in weights)  # a copy per set
    reference = rank._reference(model, buffers)
    assert rank.check(buffers, seq, fns, reference) is None
    assert all(not any(map(math.isnan, buffers.sets[0][n])) for n in weights)  # poison spares constants
    wrong = {name: want + 1.0 for name, want in reference.items()}
    assert "elements wrong" in rank.check(buffers, seq, fns, wrong)
