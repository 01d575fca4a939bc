"""The looped-lanes emitter's loop forms (gir/backends/cstyle.py LoopedLanes, loop_fusion.py):
a gOperator masked by unit-dependent bounds runs unmasked in the interior units and masked at
the ragged ones; consecutive element loops fuse, with arrays only the fused loop uses turned
into scalars, and never where that would reorder a read and a write of one element. Every
form is checked numerically against the reference interpreter on template candidates."""
import re

import numpy as np
import pytest

from gir.backends.cpu import compiler as cpu
from gir.backends.across_units import vectorises_across_units
from gir.backends.cpu.emitter import CpuEmitter
from gir.backends.kernels import split_kernels
from gir.backends.loop_fusion import fuse_element_loops
from gir.ir import get_target, run
from gir.templates import candidates

from backend_cases import compare, seeded_feeds, template_cases

CPU = get_target("cpu")
PRAGMA = "#pragma omp simd"


def _per_unit_sources():
    """(case, candidate, its kernels' per-unit C) for every template candidate on the CPU."""
    out = []
    for case, (op, ts) in template_cases().items():
        for cand in candidates(op, ts, CPU).candidates:
            kernels = split_kernels(cand.graph)
            if any(vectorises_across_units(k) for k in kernels):
                continue
            emitter = CpuEmitter(CPU)
            out.append((case, cand, "\n".join(emitter.kernel_source(k) for k in kernels)))
    return out


SOURCES = _per_unit_sources()
INTERIOR = [pytest.param(c, cand, id=f"interior-{c}-{cand.label}") for c, cand, src in SOURCES if "} else {" in src][:16]
FUSED = [pytest.param(c, cand, id=f"fused-{c}-{cand.label}") for c, cand, src in SOURCES if "__k = 0;" in src][:16]
ROWS = [pytest.param(c, cand, id=f"rows-{c}-{cand.label}") for c, cand, src in SOURCES if "const int k = k_o*" in src][:16]


def test_both_forms_are_exercised_by_many_templates():
    assert len(INTERIOR) >= 8 and len(FUSED) >= 8 and len(ROWS) >= 8, (len(INTERIOR), len(FUSED), len(ROWS))


@pytest.mark.parametrize("case,cand", INTERIOR + FUSED + ROWS)
def test_interior_split_and_fused_loops_match_the_interpreter(case, cand):
    op, ts = template_cases()[case]
    feeds = seeded_feeds(op, ts, case)
    compare(cpu.run(cand.graph, feeds), run(cand.graph, feeds).outputs, f"{case} {cand.label}")


def test_a_masked_move_runs_unmasked_when_the_unit_is_inside():
    case, cand, source = next((c, cand, s) for c, cand, s in SOURCES if "} else {" in s)
    interior, masked = source.split("} else {", 1)
    head = interior.rsplit("if (", 1)[1]
    assert ">= " in head.split(")")[0] or "<= 0" in head.split(")")[0], head
    assert "?" in masked.split("}")[0] + masked.split("}")[1] or "if (" in masked.split("}")[0]


def _loop(body: list[str], n: int = 8, pragma: bool = True) -> list[str]:
    return ([PRAGMA] if pragma else []) + [f"for (int k = 0; k < {n}; ++k) {{", *["  " + b for b in body], "}"]


def test_a_load_compute_store_chain_becomes_one_loop_of_scalars():
    lines = ["float r_a[8];", "float r_b[8];", "// #0 Move", *_loop(["r_a[k] = g_x[4*u + k];"]),
             "// #1 Elementwise", *_loop(["const float t0 = r_a[k] * 2.0f;", "r_b[k] = t0;"]),
             "// #2 Move", *_loop(["g_y[4*u + k] = r_b[k];"])]
    out = fuse_element_loops(lines, PRAGMA)
    assert sum(ln.startswith("for (int k") for ln in out) == 1
    assert "float r_a__k = 0;" in "\n".join(out) and "r_b__k = t0;" in "\n".join(out)
    assert "r_a[k]" not in "\n".join(out) and "// #1 Elementwise" in out


@pytest.mark.parametrize("second,why", [
    (["g_y[4*u + k] = r_a[k + 1];"], "another element of an array the first loop writes"),
    (["g_x[4*u + k + 1] = r_a[k];"], "a DRAM element the first loop reads, at another index"),
])
def test_loops_that_would_reorder_an_element_stay_apart(second, why):
    lines = ["float r_a[8];", *_loop(["r_a[k] = g_x[4*u + k];"]), *_loop(second)]
    assert fuse_element_loops(lines, PRAGMA) == lines, why


@pytest.mark.parametrize("escaping", [False, True])
def test_a_loop_whose_array_a_reduction_reads_stays_apart(escaping):
    """The product of DRAM operands kept in an array for a reduction: fused, it was slower
    (GPT-2's GEMV)."""
    lines = ["float r_a[8];", "float r_p[8];", *_loop(["r_a[k] = g_x[k];"]),
             *_loop(["const float t0 = r_a[k] * g_w[8*u + k];", "r_p[k] = t0;"]),
             "for (int k = 0; k < 1; ++k) {", "  for (int g = 0; g < 8; ++g) acc = acc + r_p[(k*8 + g)];", "}"]
    assert fuse_element_loops(lines, PRAGMA, escaping=escaping) == lines


def test_a_scaled_row_a_reduction_reads_fuses_with_its_load():
    """A softmax row: its load and scaling in one loop, the load a scalar; the scaled row, which
    the max reads after the loop, still an array. Apart, each went through a stack array (ViT's
    softmax kernels ran in 0.17 ms fused against 0.20)."""
    lines = ["float r_a[8];", "float r_s[8];", *_loop(["r_a[k] = g_x[8*u + k];"]),
             *_loop(["const float t0 = r_a[k] * 0.125f;", "r_s[k] = t0;"]),
             "for (int k = 0; k < 1; ++k) {", "  for (int g = 0; g < 8; ++g) acc = GIR_MAX(acc, r_s[(k*8 + g)]);", "}"]
    assert fuse_element_loops(lines, PRAGMA) == lines  # the old rule: every written array a scalar
    out = "\n".join(fuse_element_loops(lines, PRAGMA, escaping=True))
    assert out.count("for (int k = 0; k < 8;") == 1
    assert "r_a__k = g_x[8*u + k];" in out and "r_s[k] = t0;" in out and "r_s[(k*8 + g)]" in out


def test_loops_without_the_simd_mark_or_of_other_lengths_stay_apart():
    unmarked = ["float r_a[8];", *_loop(["r_a[k] = g_x[k];"], pragma=False), *_loop(["g_y[k] = r_a[k];"])]
    assert fuse_element_loops(unmarked, PRAGMA) == unmarked
    lengths = ["float r_a[8];", *_loop(["r_a[k] = g_x[k];"]), *_loop(["g_y[k] = r_a[k];"], n=4)]
    assert fuse_element_loops(lengths, PRAGMA) == lengths


def _session_vs_onnxruntime(model, feeds):
    import gir
    import onnxruntime as ort
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = gir.Session(model, target="cpu").run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _model(nodes, inputs, output, shape, inits=()):
    from onnx import TensorProto, helper
    vi = lambda name, s: helper.make_tensor_value_info(name, TensorProto.FLOAT, list(s))  # noqa: E731
    g = helper.make_graph(nodes, "m", [vi(n, s) for n, s in inputs], [vi(output, shape)], list(inits))
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def test_a_gemv_multiplies_inside_its_reduction_and_matches_onnxruntime():
    """GPT-2 decode's GEMV: the weights are read once, multiplied and summed in one loop."""
    from onnx import helper, numpy_helper
    from gir.frontend import load
    from gir.fusion.plan import plan
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.normal(0, 0.05, (96, 200)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, 200).astype(np.float32), "b")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
                   [("x", (1, 1, 96))], "y", (1, 1, 200), [w, b])
    kernels = [k for k in plan(load(model), CPU).kernels if "sum" in k.name]
    source = "\n".join(CpuEmitter(CPU).kernel_source(kk) for k in kernels for kk in split_kernels(k.graph))
    # one output a unit, or several side by side (gir/fusion/spread.py): either way one loop
    assert re.search(r"part(\[k\])?\[j\] = part(\[k\])?\[j\] \+ \(t0\)", source) and "const float t0 = g_x" in source, source
    _session_vs_onnxruntime(model, {"x": rng.standard_normal((1, 1, 96)).astype(np.float32)})


@pytest.mark.parametrize("node", ["LayerNormalization", "Softmax", "ReduceSumSquare"])
def test_reductions_over_computed_values_match_onnxruntime(node):
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(6)
    shape = (3, 37, 131)  # ragged against every SIMD width and tiling
    inits, extra, out_shape = [], {}, shape
    if node == "LayerNormalization":
        inits = [numpy_helper.from_array(rng.normal(1, 0.1, 131).astype(np.float32), "g"),
                 numpy_helper.from_array(rng.normal(0, 0.1, 131).astype(np.float32), "bb")]
        n = helper.make_node(node, ["x", "g", "bb"], ["y"], axis=-1)
    elif node == "Softmax":
        n = helper.make_node(node, ["x"], ["y"], axis=-1)
    else:
        n, out_shape = helper.make_node(node, ["x"], ["y"], axes=[2], keepdims=0), (3, 37)  # opset 17: an attribute
    model = _model([n], [("x", shape)], "y", out_shape, inits)
    _session_vs_onnxruntime(model, {"x": rng.standard_normal(shape).astype(np.float32)})


@pytest.mark.parametrize("parallel", [False, True])
def test_a_small_kernel_runs_without_forking_a_team(parallel):
    """Under the target's serial_below_bytes (what one thread streams while a team forks and
    joins) a second thread saves less than the fork costs: the kernel is a plain loop, and the
    time model charges it no launch and one thread."""
    from onnx import helper
    from gir.frontend import load
    from gir.fusion.plan import plan
    from gir.ir.one_thread import runs_on_one_thread
    limit = CPU.timing.serial_below_bytes
    row_bytes = 2 * 128 * 4  # x and y
    rows = max(2 * limit // row_bytes, 4096) if parallel else max(limit // (2 * row_bytes), 1)
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", (rows, 128))], "y", (rows, 128))
    (kernel,) = plan(load(model), CPU).kernels
    (k,) = split_kernels(kernel.graph)
    source = CpuEmitter(CPU).kernel_source(k)
    assert ("#pragma omp parallel for" in source) == parallel
    assert runs_on_one_thread(k.params, CPU) != parallel
    assert (kernel.estimate.parts["launch"] > 0) == parallel
    x = np.random.default_rng(1).standard_normal((rows, 128)).astype(np.float32)
    _session_vs_onnxruntime(model, {"x": x})




def test_a_reduction_over_a_plane_apart_runs_its_outputs_as_lanes(monkeypatch):
    """A lowered 1x1 conv over up to 128 input channels: a unit holds a few positions x the
    input channels, the channels a plane apart. The product is computed inside the reduction
    with the positions as the SIMD loop and each channel's term one contiguous load
    (`_columns`), not gathered per element (EfficientNet-B0 exported at 64x64, 4 -> 24 channels
    over 32x32 + SiLU: 120 -> 15 us on one thread; a group of 32 or more in COLUMN_PARTIALS
    partials). The tiny EfficientNet-B0's plan has such kernels: each term's DRAM addresses
    step one element per output k (or none), with no division, and every kernel matches the
    interpreter on the CPU harness."""
    import onnx

    import gir
    from gir.backends.cstyle import LoopedLanes

    terms, groups = [], set()
    inlined_term = LoopedLanes._inlined_term

    def recorded(self, r, column=None, rows=False):
        pre, x = inlined_term(self, r, column, rows)
        if column is not None:
            terms.append("\n".join([*pre, x]))
            groups.add(r.group)
        return pre, x
    monkeypatch.setattr(LoopedLanes, "_inlined_term", recorded)
    session = gir.Session(onnx.load("models/bundled/efficientnet_b0_tiny.onnx"), target="cpu")
    assert terms, "no kernel of the tiny EfficientNet-B0 ran a reduction's outputs as lanes"
    # both orders: a short group added in order, a long one (72 channels) in interleaved partials
    assert min(groups) < 2 * LoopedLanes.ACCUMULATORS <= max(groups), groups
    for text in terms:
        refs = re.findall(r"g_\w+\[([^\]]*)\]", text)
        assert refs and all("/" not in a and "%" not in a for a in refs), text
        assert any(a.endswith("+ k") or a == "k" for a in refs), text
    rng = np.random.default_rng(4)
    for step in session.plan.steps:
        g = getattr(step, "graph", None)
        if g is not None:
            feeds = {n: rng.standard_normal(buf.size).astype(np.float32) for n, buf in g.buffers.items()
                     if buf.level == "dram" and buf.role in ("input", "const")}
            compare(cpu.run(g, feeds), run(g, feeds).outputs, g.name)
