"""The CPU emitter's SIMD-across-units form (gir/backends/across_units.py): which kernels
take it, that their source is the loop nest it promises, and that their numbers agree with the
reference interpreter (template candidates) and onnxruntime (window models through the
Session): masks at every edge, row conditions hoisted out of the SIMD loop, fills other than
zero, strides, dilations, several taps sizes."""
import random
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import gir
from gir.cli import main
from gir.backends.cpu import compiler as cpu
from gir.backends.across_units import vectorises_across_units
from gir.backends.cpu.emitter import CpuEmitter
from gir.backends.kernels import emit_graph, split_kernels
from gir.ir import get_target, run
from gir.ir.across_units import MAX_ELEMENTS, channel_lanes
from gir.templates import candidates

from backend_cases import compare, seeded_feeds, template_cases

CPU = get_target("cpu")


def window_model(op: str, shape, kernel, group=1, out_channels=None, **attrs):
    """One Conv (+ SiLU) or pooling node on a (1, C, H, W) input, opset 17, ir_version 10."""
    rng = np.random.default_rng(3)
    c = shape[1]
    inits, nodes = [], []
    if op == "Conv":
        oc = out_channels or c
        inits = [numpy_helper.from_array(rng.normal(0, 0.3, (oc, c // group, *kernel)).astype(np.float32), "w"),
                 numpy_helper.from_array(rng.normal(0, 0.1, oc).astype(np.float32), "b")]
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=list(kernel), group=group, **attrs),
                 helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    else:
        nodes = [helper.make_node(op, ["x"], ["y"], kernel_shape=list(kernel), **attrs)]
    g = helper.make_graph(nodes, "w", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    model.graph.output[0].CopyFrom(onnx.shape_inference.infer_shapes(model).graph.output[0])  # y's shape
    return model


# short strided or windowed rows over 8 channels or more: lanes on channels, spans staged per
# block of 16 (a partial last block, a batch axis before the channels, fills other than zero,
# stride 1 over 14x14 and 7x7 planes)
LANE_WINDOWS = [
    ("Conv", (1, 20, 14, 14), (5, 5), dict(group=20, pads=[2, 2, 2, 2], strides=[2, 2])),
    ("Conv", (2, 16, 15, 13), (3, 3), dict(group=16, pads=[1, 0, 2, 1], strides=[2, 2])),
    ("Conv", (1, 24, 14, 14), (3, 3), dict(group=24, pads=[1, 1, 1, 1])),
    ("Conv", (1, 17, 7, 7), (3, 3), dict(group=17, pads=[1, 1, 1, 1])),
    ("MaxPool", (1, 20, 15, 15), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("AveragePool", (1, 24, 13, 13), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2], count_include_pad=0)),
    # a 1-D conv over a batch of 16: the axis before the row is the batch, its lanes
    ("Conv", (16, 4, 30), (3,), dict(group=4, pads=[1, 1], strides=[2])),
    ("AveragePool", (1, 40, 9, 9), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2], count_include_pad=1)),
    # planes too large to stage whole: bands of output rows (a long row needs whole blocks; one
    # block of 16 is enough)
    ("Conv", (1, 16, 20, 70), (3, 3), dict(group=16, pads=[1, 1, 1, 1])),
    ("Conv", (1, 32, 40, 40), (3, 3), dict(group=32, pads=[1, 1, 1, 1])),
    ("Conv", (1, 32, 60, 60), (3, 3), dict(group=32, pads=[1, 1, 1, 1], strides=[2, 2])),
    ("MaxPool", (1, 32, 48, 48), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
]

WINDOWS = [
    ("Conv", (1, 24, 19, 21), (3, 3), dict(group=24, pads=[1, 1, 1, 1])),
    ("Conv", (1, 16, 23, 17), (5, 5), dict(group=16, pads=[2, 2, 2, 2], strides=[2, 2])),
    ("Conv", (1, 8, 20, 20), (3, 3), dict(group=8, pads=[2, 2, 2, 2], dilations=[2, 2])),
    ("Conv", (1, 8, 15, 30), (3, 1), dict(group=8, pads=[1, 0, 1, 0])),
    ("Conv", (1, 8, 20, 24), (7, 7), dict(group=8, pads=[3, 3, 3, 3])),  # 49 masked loads: interior + borders
    ("Conv", (1, 12, 30, 31), (3, 3), dict(group=12, pads=[1, 1, 1, 1], strides=[2, 2])),
    ("Conv", (1, 8, 29, 40), (3, 3), dict(group=8, pads=[0, 1, 2, 1], strides=[1, 3])),
    ("Conv", (1, 8, 28, 36), (5, 5), dict(group=8, pads=[2, 2, 2, 2], strides=[2, 4])),
    # strided rows of 34 units or more: the interior in two overlapping passes (16m + 1 units,
    # then the last 17), or one pass where the interior is 16m + 1 long already
    ("Conv", (1, 4, 9, 150), (3, 3), dict(group=4, pads=[1, 1, 1, 1], strides=[2, 2])),
    ("Conv", (1, 3, 8, 70), (5, 5), dict(group=3, pads=[2, 2, 2, 2], strides=[2, 2])),
    ("Conv", (1, 4, 10, 53), (7, 7), dict(group=4, pads=[3, 3, 3, 3])),
    ("MaxPool", (1, 3, 9, 101), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    *LANE_WINDOWS,
    # the row and merged forms where there are too few channels for lanes on channels
    ("Conv", (1, 6, 7, 7), (3, 3), dict(group=6, pads=[1, 1, 1, 1])),
    ("Conv", (1, 5, 14, 14), (5, 5), dict(group=5, pads=[2, 2, 2, 2])),
    ("Conv", (1, 16, 14, 14), (3, 3), dict(group=8, out_channels=16, pads=[1, 1, 1, 1], strides=[2, 2])),
    ("MaxPool", (1, 6, 17, 33), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ("MaxPool", (1, 4, 20, 48), (3, 3), dict(pads=[1, 1, 1, 1])),
    ("AveragePool", (1, 6, 16, 24), (3, 3), dict(pads=[1, 1, 1, 1], count_include_pad=0)),
    # rows shorter than MERGE_BELOW over contiguous planes: one SIMD loop over the plane (and a
    # 14-unit row, padded instead)
    ("Conv", (1, 16, 7, 7), (3, 3), dict(group=16, pads=[1, 1, 1, 1])),
    ("Conv", (1, 8, 14, 14), (5, 5), dict(group=8, pads=[2, 2, 2, 2])),
    ("Conv", (1, 8, 9, 6), (3, 3), dict(group=8, pads=[0, 1, 2, 1])),
    ("MaxPool", (1, 6, 7, 9), (3, 3), dict(pads=[1, 1, 1, 1])),
    ("AveragePool", (1, 5, 11, 5), (3, 3), dict(pads=[1, 1, 1, 1], count_include_pad=0)),
    # few rows, long, over a megabyte: the team takes pieces of each row (row_pieces), the row
    # padded to whole SIMD blocks and masked at both ends of every piece's window
    ("Conv", (1, 2, 3, 50_003), (3, 3), dict(group=2, pads=[1, 1, 1, 1])),
    ("MaxPool", (1, 3, 2, 60_001), (1, 3), dict(pads=[0, 1, 0, 1])),
]


@pytest.mark.parametrize("case", WINDOWS, ids=lambda c: f"{c[0]}{c[2]}-{'-'.join(f'{k}{v[0]}' for k, v in sorted(c[3].items()) if isinstance(v, list))}")
def test_window_models_match_onnxruntime(case, tmp_path):
    op, shape, kernel, attrs = case
    attrs = dict(attrs)
    group = attrs.pop("group", 1)
    model = window_model(op, shape, kernel, group=group, **attrs)
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    session = gir.Session(str(path), target="cpu")
    got = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _compiled_source(model, tmp_path) -> str:
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "out"
    assert main(["compile", str(path), "--target", "cpu", "-o", str(out), "--quiet"]) == 0
    return "\n".join(p.read_text() for p in sorted((out / "kernels").glob("*.c")))


def test_a_conv_with_few_long_rows_runs_them_in_pieces(tmp_path):
    source = _compiled_source(window_model("Conv", (1, 2, 3, 50_003), (3, 3), group=2, pads=[1, 1, 1, 1]), tmp_path)
    assert re.search(r"for \(int t = 0; t < \d+; \+\+t\)", source) and "piece" in source, source[:1500]


def test_depthwise_conv_kernel_takes_the_across_units_form(tmp_path):
    """The fused depthwise conv + SiLU (contiguous rows, too few channels for lanes on
    channels): outer grid axes in the OpenMP loop,
    the last one as one masked SIMD loop, offsets hoisted as 64-bit integers, row conditions
    as bounds on the SIMD index, no branch in a mask. The row of 21 runs padded to 24, the
    lanes past its end masked off every access that moves along it, not off the weights."""
    source = _compiled_source(window_model("Conv", (1, 6, 19, 21), (3, 3), group=6, pads=[1, 1, 1, 1]), tmp_path)
    m = re.search(r"const int lo = 0, hi = 24;\s*#define GIR_EDGE\(c\) \(c\)\s*#pragma omp simd\s*"
                  r"for \(int b(\d) = lo; b\1 < hi; \+\+b\1\)", source)
    assert m, source[-4000:]
    b = f"b{m.group(1)}"
    assert re.search(rf"& \({b} < 21\)\) \? g_x\[", source) and re.search(rf"if \(GIR_EDGE\(.*\({b} < 21\)\)\) g_y\[", source)
    assert re.search(r"= g_\w*weight\w*\[o\d+\];", source), "a weight load does not move along the row: unmasked"
    assert "for (int u = 0;" not in source and "__asm__" not in source
    assert re.search(r"const long o\d+ = ", source)
    assert re.search(r"const int m\d+ = \(.*\) \? 21 : 0;", source)
    assert " && " not in source.split("#pragma omp simd", 1)[1]


def test_short_rows_of_a_contiguous_plane_run_as_one_simd_loop(tmp_path):
    """A 7x7 depthwise conv over 6 channels: the row is shorter than a vector, so the SIMD loop runs over the
    whole plane (q), each lane's row and column computed from q for the masks, and every
    address one step per q (a contiguous vector access, no gather)."""
    source = _compiled_source(window_model("Conv", (1, 6, 7, 7), (3, 3), group=6, pads=[1, 1, 1, 1]), tmp_path)
    assert re.search(r"for \(int r = 0; r < 6; \+\+r\)", source), source[-3000:]
    assert re.search(r"#pragma omp simd\s*for \(int q = lo; q < hi; \+\+q\) \{\s*"
                     r"const int b(\d) = q / 7, b(\d) = q % 7;", source)
    assert "const int lo = 0, hi = 49;" in source
    loads = re.findall(r"g_x\[([^\]]*)\]", source)
    assert loads and all(re.fullmatch(r"o\d+ \+ q( \+ \d+)?", a) for a in loads), loads
    assert re.search(r"g_y\[o\d+ \+ q\] = ", source)


def test_a_strided_short_row_is_not_merged(tmp_path):
    """Stride 2 along the row: consecutive units are not consecutive elements, so the plane
    is not one contiguous run and the row form stays."""
    source = _compiled_source(window_model("Conv", (1, 8, 14, 14), (3, 3), group=8, pads=[1, 1, 1, 1],
                                           strides=[2, 2]), tmp_path)
    assert "for (int q = " not in source and "#pragma omp simd" in source


def test_strided_rows_run_the_interior_unmasked_and_the_borders_scalar(tmp_path):
    """A stride-2 depthwise conv steps two input elements per unit: the SIMD loop covers the
    interior with GIR_EDGE compiled out, the borders are scalar loops with the masks."""
    source = _compiled_source(window_model("Conv", (1, 4, 23, 36), (5, 5), group=4, pads=[2, 2, 2, 2],
                                           strides=[2, 2]), tmp_path)
    simd = source.split("#define GIR_EDGE(c) 1", 1)[1]
    assert re.match(r"\s*#pragma omp simd\s*for \(int b(\d) = lo; b\1 < hi;", simd), simd[:300]
    border = source.split("#define GIR_EDGE(c) (c)", 1)[1].split("#undef GIR_EDGE", 1)[0]
    assert border.count("__asm__ __volatile__") == 2 and "GIR_EDGE(" in border


def test_a_long_strided_rows_interior_leaves_no_scalar_remainder(tmp_path):
    """Rows of 75 units, 74 of them interior: the first pass runs 65 (16m + 1: gcc peels one
    unit for the strided loads' gap), the second the last 17 again, so at most two units a row
    run scalar instead of the 9 gcc's remainder loop took."""
    source = _compiled_source(window_model("Conv", (1, 4, 9, 150), (3, 3), group=4, pads=[1, 1, 1, 1],
                                           strides=[2, 2]), tmp_path)
    simd = source.split("#define GIR_EDGE(c) 1", 1)[1]
    assert re.match(r"\s*for \(int pass = 0; pass < 2; \+\+pass\) \{\s*"
                    r"const int whole = hi - lo > 17 \? \(hi - lo - 1\) / 16 \* 16 \+ 1 : hi - lo;", simd), simd[:400]
    assert re.search(r"const int s = pass == 0 \? lo : hi - 17, e = pass == 0 \? lo \+ whole : hi;\s*"
                     r"#pragma omp simd\s*for \(int b(\d) = s; b\1 < e;", simd)


def test_short_strided_rows_over_many_channels_run_lanes_on_channels(tmp_path):
    """A 5x5 stride-2 depthwise conv over 20x14x14: rows of 7 units, but 20 channels. Each
    block of 16 channels copies its input planes, with the conv's padding around them, and its
    weights into local arrays, channel innermost; the SIMD loop runs over the block's channels,
    each tap a contiguous unmasked load from the stage (the halo holds the zeros), and the
    outputs are copied back from their own local array."""
    source = _compiled_source(window_model("Conv", (1, 20, 14, 14), (5, 5), group=20, pads=[2, 2, 2, 2],
                                           strides=[2, 2]), tmp_path)
    assert re.search(r"for \(int r = 0; r < 2; \+\+r\)", source), source[-3000:]
    assert "const int c_lo = cb * 16, c_hi = c_lo + 16 < 20 ? c_lo + 16 : 20;" in source
    # 17 padded rows of 17 (the 14x14 plane, 2 halo rows and columns before it, 1 after)
    assert "float st_g_x[4624];" in source and re.search(r"float st_g_y\[784\];", source)
    assert "const long row = bo_g_x - 2 + i;" in source and "const int inside = row >= 0 && row < 14;" in source
    # the band's rows of the plane copied as they lie, 16 elements a piece, each to its padded place
    assert "memcpy(st_g_x + ((e / 14 - bo_g_x) * 17 + e % 14 + 36) * 16, piece + j * 16, sizeof piece / 16);" in source
    assert "fill0" not in source and not re.search(r"const float\* p\d+ =", source)
    simd = source.split("#pragma omp simd", 1)[1]
    assert re.match(r"\s*for \(int b1 = c_lo; b1 < c_lo \+ 16; \+\+b1\)", simd)
    loads = re.findall(r"= st_g_x\[\(\d+\*b2 \+ 2\*b3 - 17\*bo_g_x( \+ \d+)?\) \* 16 \+ b1 - c_lo\];", simd)
    assert len(loads) >= 25 and not re.search(r"(?<!st_)g_x\[", simd) and "GIR_EDGE((b1 <" not in simd
    assert re.search(r"g_y\[base \+ e\] = st_g_y\[e \* 16 \+ l\];", source)


def test_a_stage_without_its_padding_chooses_fill_rows_at_borders(tmp_path, monkeypatch):
    """The form a staged read whose masks are not its plane's bounds keeps (and the A/B
    baseline of `pad_halos`): border positions choose, per tap, the stage or a row of fill
    values through a pointer, under one branch on all the conditions."""
    from gir.backends.across_units import AcrossUnits
    monkeypatch.setattr(AcrossUnits, "pad_halos", False)
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))  # nothing compiled with the padding
    model = window_model("Conv", (1, 20, 14, 14), (5, 5), group=20, pads=[2, 2, 2, 2], strides=[2, 2])
    source = _compiled_source(model, tmp_path)
    assert re.search(r"const float\* p\d+ = \(.*\) \? st_g_x \+ \(.*\) : fill\d+;", source)
    loads = re.findall(r"= (p\d+)\[b1 - c_lo\];", source.split("#pragma omp simd", 1)[1])
    assert len(loads) >= 9
    x = np.random.default_rng(4).standard_normal((1, 20, 14, 14)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = gir.Session(str(tmp_path / "m.onnx"), target="cpu").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _channel_lane_kernels():
    """(case id, planned GIR graph) of every window model whose kernel takes the channel-lane
    form (gir/ir/across_units.py channel_lanes)."""
    out = []
    for op, shape, kernel, attrs in LANE_WINDOWS:
        attrs = dict(attrs)
        model = window_model(op, shape, kernel, group=attrs.pop("group", 1), **attrs)
        for step in gir.Session(model, target="cpu").plan.steps:
            g = getattr(step, "graph", None)
            if g is not None and any(channel_lanes([o for _, o in k.ops], k.prim, k.buffers) for k in split_kernels(g)):
                out.append(pytest.param(g, id=f"{op}{shape}{kernel}"))
    return out


CHANNEL_LANE_KERNELS = _channel_lane_kernels()


@pytest.mark.parametrize("graph", CHANNEL_LANE_KERNELS)
def test_channel_lane_kernels_match_the_interpreter(graph):
    """Each channel-lane kernel on the CPU harness, whose guard bytes catch a stray write of the
    staging copies, against the reference interpreter."""
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal(b.size).astype(np.float32) for n, b in graph.buffers.items()
             if b.level == "dram" and b.role in ("input", "const")}
    compare(cpu.run(graph, feeds), run(graph, feeds).outputs, graph.name)


def test_an_involution_runs_lanes_on_channels_and_matches_onnxruntime():
    """RedNet's involution (a 7x7 window per position, one kernel per group shared by its 16
    channels) over 14x14: rows of 14 with 49 masked loads were per unit; lanes on channels
    read the group's kernel as one address for every lane and stage the planes."""
    from onnx import TensorProto

    from models._builder import GraphBuilder
    from models.rednet50 import involution

    b = GraphBuilder("inv", seed=0)
    x = b.input("x", TensorProto.FLOAT, [1, 32, 14, 14])
    b.output(involution(b, x, 1, 32, 14, 7, 1), "y", TensorProto.FLOAT, [1, 32, 14, 14])
    model = b.build()
    session = gir.Session(model, target="cpu")
    graphs = [st.graph for st in session.plan.steps if getattr(st, "graph", None) is not None
              and any(channel_lanes([o for _, o in k.ops], k.prim, k.buffers) for k in split_kernels(st.graph))]
    assert graphs, "no kernel of the involution took lanes on channels"
    rng = np.random.default_rng(2)
    for g in graphs:
        feeds = {n: rng.standard_normal(buf.size).astype(np.float32) for n, buf in g.buffers.items()
                 if buf.level == "dram" and buf.role in ("input", "const")}
        compare(cpu.run(g, feeds), run(g, feeds).outputs, g.name)
    X = rng.standard_normal((1, 32, 14, 14)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    np.testing.assert_allclose(session.run(None, {"x": X})[0], want, rtol=1e-5, atol=1e-5)
    # the 49 taps' sum runs in 8 partials, each starting as its first tap (no add of 0.0f),
    # the other taps fused multiply-adds into them, no array of products before them, and
    # the kernel built without gcc's hoisting of its uniform loads (GIR_ONE_VECTOR)
    source = session.engine.emitted[0]
    assert re.search(r"float acc7 = \S", source) and not re.search(r"acc\d = 0\.0f", source)
    assert re.search(r"acc\d = GIR_FMA\(r_\w+, r_\w+, acc\d\);", source)
    assert not re.search(r"const float t0 = r_\w+ \* r_\w+;", source)
    assert re.search(r"^void GIR_ONE_VECTOR \w+\(", source, re.M)
    # the input staged with the window's padding: every tap a plain stage load, no border copy
    assert re.search(r"= st_g_x\[\(", source) and not re.search(r"const float\* p\d+ =", source)


def test_the_channel_lane_form_is_exercised():
    assert len(CHANNEL_LANE_KERNELS) == len(LANE_WINDOWS)


def test_a_plane_whose_rows_only_split_into_thin_bands_keeps_the_row_form(tmp_path):
    """32x67x67: the whole plane does not fit STAGE_BYTES and 67 rows split only into bands of
    one row, each copying its 3-row window again: the row form stays."""
    source = _compiled_source(window_model("Conv", (1, 32, 67, 67), (3, 3), group=32, pads=[1, 1, 1, 1]), tmp_path)
    assert "c_lo" not in source and "#pragma omp simd" in source


def test_a_conv_from_one_input_channel_over_long_rows_keeps_the_row_form(tmp_path):
    """1 -> 32 channels, 3x3 over 8x40 (SAR-DRN's first layer, smaller): every output channel
    reads the same input plane, so staging blocks of channels would only transpose the output;
    the rows run as SIMD loops (32.6 -> 3.2 ms at 256x256 x 64 channels, one thread). A
    depthwise conv of the same size, whose planes move with the channel, still takes lanes on
    channels. Both match onnxruntime."""
    one = window_model("Conv", (1, 1, 8, 40), (3, 3), out_channels=32, pads=[1, 1, 1, 1])
    depthwise = window_model("Conv", (1, 32, 8, 40), (3, 3), group=32, pads=[1, 1, 1, 1])
    for model, lanes_on_channels in ((one, False), (depthwise, True)):
        folder = tmp_path / str(lanes_on_channels)
        folder.mkdir()
        source = _compiled_source(model, folder)
        assert re.search(r"^void (GIR_ONE_VECTOR )?Conv_0_mul_Conv_0_sum", source, re.M)  # a GIR kernel, not a library call
        assert ("c_lo" in source) == lanes_on_channels and "#pragma omp simd" in source
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = np.random.default_rng(8).standard_normal(shape).astype(np.float32)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = gir.Session(str(folder / "m.onnx"), target="cpu").run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_large_plane_is_staged_in_bands_of_rows(tmp_path):
    """32x40x40, 3x3: the whole plane (209 KiB staged) exceeds STAGE_BYTES, so the OpenMP loop
    runs over blocks of channels and bands of 20 output rows, each band's spans copied in and
    out, the band's start subtracted from every staged index."""
    source = _compiled_source(window_model("Conv", (1, 32, 40, 40), (3, 3), group=32, pads=[1, 1, 1, 1]), tmp_path)
    assert re.search(r"for \(int r = 0; r < 4; \+\+r\)", source), source[-3000:]
    assert "const int band = (r) % 2;" in source
    assert "const long bo_g_x = band * 20L;  /* the band's first row */" in source  # padded: in rows
    assert "const long bo_g_y = band * 800L;" in source
    assert re.search(r"for \(int b2 = band \* 20; b2 < band \* 20 \+ 20; \+\+b2\)", source)


def _across_candidates(limit_per_case: int = 2):
    """Template candidates (all cases of backend_cases) whose kernels take the across form."""
    rnd = random.Random(11)
    out = []
    for case, (op, ts) in template_cases().items():
        found = [c for c in candidates(op, ts, CPU).candidates
                 if any(vectorises_across_units(k) for k in split_kernels(c.graph))]
        for c in rnd.sample(found, min(limit_per_case, len(found))):
            out.append(pytest.param(case, c, id=f"{case}-{c.label}"))
    return out


ACROSS = _across_candidates()


def test_the_across_form_is_exercised_by_many_templates():
    kinds = {p.values[0].split("-")[0] for p in ACROSS}
    assert len(ACROSS) >= 10 and {"elementwise", "reduce", "layout"} <= kinds, kinds


@pytest.mark.parametrize("case,cand", ACROSS)
def test_across_units_candidates_match_the_interpreter(case, cand):
    op, ts = template_cases()[case]
    feeds = seeded_feeds(op, ts, case)
    compare(cpu.run(cand.graph, feeds), run(cand.graph, feeds).outputs, f"{case} {cand.label}")


def test_large_units_keep_the_per_unit_form():
    """A unit with a long row vectorises its own element loops: no across form."""
    op, ts = template_cases()["elementwise-(2, 3, 65)-(2, 3, 65)"]
    big = [c for c in candidates(op, ts, CPU).candidates
           if any(s.size > MAX_ELEMENTS for _, g in c.graph.ops() for s in (*g.reads(), *g.writes()))]
    assert big
    source, kernels = emit_graph(CpuEmitter(CPU), big[0].graph)
    assert not any(vectorises_across_units(k) for k in kernels)
    assert "for (int u = 0;" in source


def test_the_per_unit_form_can_be_asked_for():
    """Calibration times the per-unit form (the time model's dependent chain): an emitter with
    `allow_across` off keeps a kernel that would vectorise across units in that form."""
    case, cand = ACROSS[0].values
    (kernel,) = split_kernels(cand.graph)[:1]
    emitter = CpuEmitter(CPU)
    assert "#pragma omp simd\n" in emitter.kernel_source(kernel) and "for (int u = 0;" not in emitter.kernel_source(kernel)
    emitter.allow_across = False
    assert "for (int u = 0;" in emitter.kernel_source(kernel)


@pytest.mark.parametrize("shape", [(400_003,), (3, 120_011)])
def test_too_few_rows_are_cut_into_pieces_for_the_threads(shape):
    """One element per unit over a whole tensor is one row (or a few): the OpenMP loop runs
    over pieces of the rows, so every thread gets a share (it ran on one thread, 2x slower
    than the chunked form, results/perf_model_rank_gelu.md), and the pieces cover each row
    exactly once, its ragged end included."""
    from gir.backends.across_units import PIECE_ELEMENTS, row_pieces
    from gir.frontend import load
    node = helper.make_node("Erf", ["x"], ["y"])
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape))
    model = helper.make_model(helper.make_graph([node], "erf", [io("x")], [io("y")]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    g = load(model)
    (cand,) = [c for c in candidates(g.ops[0], g.tensors, CPU).candidates if c.structure == "element"][:1]
    (kernel,) = split_kernels(cand.graph)
    assert vectorises_across_units(kernel)
    *outer, length = kernel.prim.grid
    rows = int(np.prod(outer))
    pieces = row_pieces(rows, length)
    assert pieces > 1 and length // pieces >= PIECE_ELEMENTS  # pieces worth a fork
    source = CpuEmitter(CPU).kernel_source(kernel)
    assert f"for (int t = 0; t < {rows * pieces}; ++t)" in source, source[:800]
    x = np.random.default_rng(5).normal(0, 2, shape).astype(np.float32)
    compare(cpu.run(cand.graph, {"x": x}), run(cand.graph, {"x": x}).outputs, f"erf {shape}")


def _product_and_sum(between=(), expr=None, dtype="float32", operand="a"):
    """(emitter, kernel-like, ops): a = x, b = w, p = a * b (or `expr`), then `between`, then
    s = sum(p): the shape of a window's taps, for `_fused_products`."""
    from types import SimpleNamespace

    from gir.ir.expr import Input
    from gir.ir.gops import Elementwise, Move, Reduce
    from gir.ir.slices import Slice
    reg = lambda name: Slice.flat(name, 0, 4)  # noqa: E731
    levels = {"x": "dram", "w": "dram", "a": "register", "b": "register", "p": "register", "s": "register"}
    k = SimpleNamespace(buffers={n: SimpleNamespace(level=lv, dtype=dtype) for n, lv in levels.items()})
    product = Elementwise(expr=expr if expr is not None else Input(0) * Input(1), inputs=(reg(operand), reg("b")),
                          out=reg("p"))
    ops = [Move(src=Slice.flat("x", 0, 4), dst=reg("a")), Move(src=Slice.flat("w", 0, 4), dst=reg("b")), product,
           *between, Reduce(op="sum", src=reg("p"), dst=Slice.flat("s", 0, 1))]
    return CpuEmitter(CPU), k, ops


def test_a_window_sum_computes_its_products_as_fused_multiply_adds_only_where_safe():
    """The sum reads the product's operands where the product would have: only where nothing
    between them writes those operands, they are registers (a DRAM operand may carry a padded
    row's lane mask), the product is a plain float32 multiply and the sum alone reads it
    (anything else keeps the products computed first)."""
    from gir.ir.expr import Input
    from gir.ir.gops import Move
    from gir.ir.slices import Slice
    emitter, k, ops = _product_and_sum()
    assert [id(e) for e in emitter._fused_products(k, ops).values()] == [id(ops[2])]
    overwrite = Move(src=Slice.flat("x", 4, 4), dst=Slice.flat("a", 0, 4))
    for emitter, k, ops in (_product_and_sum(between=[overwrite]), _product_and_sum(expr=Input(0) + Input(1)),
                            _product_and_sum(dtype="float16"), _product_and_sum(operand="x")):
        assert emitter._fused_products(k, ops) == {}


def test_a_read_stages_with_its_padding_only_where_its_masks_are_the_planes_bounds():
    """`padding` (gir/ir/across_units.py): a 3x3 window over an 8x8 plane masked at the plane's
    edges stages as 10-element rows from column -1, a band of 4 output rows reading 6 of
    them from row -1; a mask that also drops the plane's last row, reads that fill different
    values, or a read through no mask at all keep the plain stage."""
    from gir.ir import Move, Slice
    from gir.ir.across_units import Padding, padding
    from gir.ir.affine import ParallelPrimitive, block_coord
    from gir.ir.slices import Buffer

    prim = ParallelPrimitive((32, 8, 8), 1)
    b0, b1, b2 = (block_coord(i) for i in range(3))
    x = Buffer("x", "dram", 32 * 64, "float32", "input", (1, 32, 8, 8))

    def read(last_row=8, fill=0.0, masked=True):
        bounds = dict(limits=(last_row - b1 + 1, 9 - b2), starts=(1 - b1, 1 - b2)) if masked else {}
        s = Slice("x", b0 * 64 + b1 * 8 + b2 - 9, (3, 3), (8, 1), **bounds)
        return Move(src=s, dst=Slice("%in", 0, (3, 3), (3, 1)), fill=fill), s

    assert padding(prim, [read()], x, ["b1", "b2"], 4) == Padding(8, 8, -1, -1, 10, 6, 4, 0.0)
    assert padding(prim, [read(last_row=7)], x, ["b1", "b2"], 4) is None
    assert padding(prim, [read(), read(fill=-1.0)], x, ["b1", "b2"], 4) is None
    assert padding(prim, [read(masked=False)], x, ["b1", "b2"], 4) is None


def test_a_padded_fp16_stage_holds_the_fill_in_its_storage_encoding():
    """A 3x3 stride-2 max pool over fp16 20x16x16: the halo of the padded stage holds -inf as
    fp16 storage (gir_f2h), not a float converted to a 16-bit integer."""
    model = window_model("MaxPool", (1, 20, 16, 16), (3, 3), pads=[1, 1, 1, 1], strides=[2, 2])
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.elem_type = TensorProto.FLOAT16
    session = gir.Session(model, target="cpu")
    graphs = [st.graph for st in session.plan.steps if getattr(st, "graph", None) is not None]
    kernels = [k for g in graphs for k in split_kernels(g)]
    assert [channel_lanes([o for _, o in k.ops], k.prim, k.buffers).pads != {} for k in kernels] == [True]
    assert "dst[e] = gir_f2h(-GIR_INF_F);" in session.engine.emitted[0]
    x = np.random.default_rng(5).standard_normal((1, 20, 16, 16)).astype(np.float16)
    compare(cpu.run(graphs[0], {"x": x.reshape(-1)}), run(graphs[0], {"x": x.reshape(-1)}).outputs, graphs[0].name)


def test_seeded_random_windows_match_onnxruntime_padded_or_not():
    """Depthwise convs (some dilated), max and average pools with random channels (8-40),
    planes (4-30), kernels (1-7), strides and asymmetric pads: padded stage, pointer form or row
    form, each matches onnxruntime. (Three seeds of 60 such cases ran clean by hand.)"""
    from gir.ir.across_units import form
    rnd, padded, cases = random.Random(5), 0, 0
    while cases < 12:
        op, c = rnd.choice(["Conv", "MaxPool", "AveragePool"]), rnd.choice([8, 12, 16, 20, 33, 40])
        h, w, k = rnd.randint(4, 30), rnd.randint(4, 30), rnd.choice([2, 3, 5, 7])
        kw = rnd.choice([k, max(1, k - 2)])
        pads = [rnd.randint(0, k - 1), rnd.randint(0, kw - 1), rnd.randint(0, k - 1), rnd.randint(0, kw - 1)]
        attrs = dict(pads=pads, strides=[rnd.choice([1, 2])] * 2)
        if op == "Conv":
            attrs["group"] = c
            if rnd.random() < 0.3:
                attrs["dilations"] = [2, 2]
        elif op == "AveragePool":
            attrs["count_include_pad"] = rnd.choice([0, 1])
        span = (2 if "dilations" in attrs else 1)
        if h + pads[0] + pads[2] < span * (k - 1) + 1 or w + pads[1] + pads[3] < span * (kw - 1) + 1:
            continue
        model = window_model(op, (1, c, h, w), (k, kw), group=attrs.pop("group", 1), **attrs)
        session = gir.Session(model, target="cpu")
        padded += any("padded" in form([o for _, o in kk.ops], kk.prim, kk.buffers) for st in session.plan.steps
                      if getattr(st, "graph", None) is not None for kk in split_kernels(st.graph))
        x = np.random.default_rng(cases).standard_normal((1, c, h, w)).astype(np.float32)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{op} {(c, h, w)} {(k, kw)} {attrs}")
        cases += 1
    assert padded >= 3
