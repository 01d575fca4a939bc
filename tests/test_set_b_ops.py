"""Issue 21's set-B ops (Resize, ConvTranspose, Einsum, RMSNormalization, Attention) on odd
shapes: gir.Session on the CPU (emitted C, run natively) against onnxruntime, and the same model
planned for cuda:sm_90 and run by the reference interpreter (test_index_ops._check)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import gir
from gir.frontend import load
from gir.build import build_steps
from gir.fusion.plan import plan
from gir.ir.target import get_target
from gir.runtime import execute
from gir.frontend.errors import UnsupportedOpError
from test_index_ops import _check, _model, _node

RNG = np.random.default_rng(2121)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---- Resize -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, ctm, extra", [
    ("nearest", "asymmetric", {"nearest_mode": "floor"}),
    ("nearest", "half_pixel", {"nearest_mode": "round_prefer_ceil"}),
    ("nearest", "align_corners", {"nearest_mode": "round_prefer_floor"}),
    ("linear", "half_pixel", {}),
    ("linear", "pytorch_half_pixel", {}),
    ("linear", "align_corners", {}),
    ("cubic", "half_pixel", {"cubic_coeff_a": -0.5, "exclude_outside": 1}),
    ("cubic", "asymmetric", {}),
])
def test_resize_scales_on_odd_shapes(mode, ctm, extra):
    x = _f32(1, 3, 5, 7)
    scales = np.array([1, 1, 1.6, 0.55], np.float32)
    node = _node("Resize", ["x", "", "scales"], mode=mode, coordinate_transformation_mode=ctm, **extra)
    _check([node], {"x": x}, inits={"scales": scales}, opset=13, compile_cuda=True)  # NVRTC builds it too


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_sizes_with_axes_opset19(mode):
    x = _f32(2, 3, 6, 5)
    node = _node("Resize", ["x", "", "", "sizes"], mode=mode, axes=[3, 2])
    _check([node], {"x": x}, inits={"sizes": np.array([9, 4], np.int64)}, opset=19)


def test_resize_trilinear_5d():
    x = _f32(1, 2, 3, 4, 5)
    node = _node("Resize", ["x", "", "scales"], mode="linear")
    _check([node], {"x": x}, inits={"scales": np.array([1, 1, 2, 1.5, 0.8], np.float32)}, opset=18)


def test_resize_nearest_int8_is_a_gather():
    x = RNG.integers(-100, 100, (1, 2, 3, 3)).astype(np.int8)
    node = _node("Resize", ["x", "", "scales"], mode="nearest")
    _check([node], {"x": x}, inits={"scales": np.array([1, 1, 2, 3], np.float32)}, opset=13)
    assert [op.kind for op in load(_model([node], {"x": x}, inits={"scales": np.array([1, 1, 2, 3], np.float32)},
                                          opset=13)).ops] == ["gather", "gather"]


def test_resize_unknown_mode_is_listed_as_unsupported():
    x = _f32(1, 1, 2, 2)
    node = _node("Resize", ["x", "", "scales"], mode="linear", coordinate_transformation_mode="no_such_mode")
    m = helper.make_model(helper.make_graph([node], "m", [helper.make_tensor_value_info("x", 1, x.shape)],
                                            [helper.make_tensor_value_info("y", 1, (1, 1, 4, 4))],
                                            [helper.make_tensor("scales", 1, [4], [1, 1, 2, 2])]),
                          opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    with pytest.raises(UnsupportedOpError, match="coordinate_transformation_mode"):
        load(m)


# ---- ConvTranspose ------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [
    {"strides": [2, 3], "pads": [1, 0, 0, 2], "output_padding": [1, 2]},
    {"strides": [2, 2], "dilations": [2, 1], "group": 3},
    {"strides": [3, 2], "auto_pad": "SAME_LOWER"},
    {"strides": [2, 1], "output_shape": [12, 7]},
    {"pads": [2, 1, 1, 1]},
])
def test_conv_transpose_2d_constant_kernel(attrs):
    group = attrs.get("group", 1)
    x, w, bias = _f32(2, 6, 5, 7), _f32(6, 2, 3, 2), _f32(2 * group)
    _check([_node("ConvTranspose", ["x", "w", "b"], **attrs)], {"x": x}, inits={"w": w, "b": bias}, opset=17,
           compile_cuda=True)


def test_conv_transpose_is_a_library_conv_when_compute_bound():
    """A 1024-term dot product per output: fp32 summation order alone moves results by ~1e-6."""
    x, w = _f32(1, 64, 16, 16), _f32(64, 32, 4, 4)
    model = _model([_node("ConvTranspose", ["x", "w"], strides=[2, 2], pads=[1, 1, 1, 1])], {"x": x},
                   inits={"w": w}, opset=17)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = gir.Session(model, target="cpu").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    p = plan(load(model), get_target("cuda:sm_90"))
    assert [s.kind for s in p.steps if getattr(s, "kind", None) == "conv"] == ["conv"]


def test_conv_transpose_1d_runtime_kernel_and_3d():
    x, w = _f32(1, 3, 9), _f32(3, 5, 4)
    _check([_node("ConvTranspose", ["x", "w"], strides=[3], pads=[2, 1])], {"x": x, "w": w}, opset=17)
    x3, w3 = _f32(1, 2, 3, 4, 3), _f32(2, 2, 2, 3, 2)
    _check([_node("ConvTranspose", ["x", "w"], strides=[2, 1, 2], group=2)], {"x": x3, "w": w3}, opset=17)


# ---- RMSNormalization ---------------------------------------------------------------------------

@pytest.mark.parametrize("axis, dtype", [(-1, np.float32), (1, np.float32), (-1, np.float16)])
def test_rms_normalization(axis, dtype):
    x = _f32(3, 5, 7).astype(dtype)
    scale = _f32(*x.shape[axis:]).astype(dtype)
    node = _node("RMSNormalization", ["x", "scale"], axis=axis, epsilon=1e-3)
    model = _model([node], {"x": x}, inits={"scale": scale}, opset=23)
    xs = x.astype(np.float64)
    axes = tuple(range(axis % 3, 3))
    want = (xs / np.sqrt((xs ** 2).mean(axis=axes, keepdims=True) + 1e-3)).astype(dtype) * scale
    got = gir.Session(model, target="cpu").run(None, {"x": x})[0]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2e-3 if dtype == np.float16 else 1e-5, atol=2e-3 if dtype == np.float16 else 1e-6)
    if dtype == np.float32:  # onnxruntime and the cuda:sm_90 plan too
        _check([node], {"x": x}, inits={"scale": scale}, opset=23)


# ---- Attention (opset 23) -----------------------------------------------------------------------

def _attention_reference(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("case", ["4d_gqa_causal", "3d_bool_mask", "4d_float_mask_scale_softcap", "past_present_gqa"])
def test_attention_forms(case):
    b, s, d = 2, 3, 5
    attrs, extra, outputs = {}, {}, ["y"]
    if case == "4d_gqa_causal":
        q, k, v = _f32(b, 6, s, d), _f32(b, 2, 7, d), _f32(b, 2, 7, 3)
        attrs["is_causal"] = 1
        ins = ["q", "k", "v"]
    elif case == "3d_bool_mask":
        q, k, v = _f32(b, s, 4 * d), _f32(b, 6, 2 * d), _f32(b, 6, 2 * 3)
        attrs.update(q_num_heads=4, kv_num_heads=2)
        extra["mask"] = RNG.random((s, 6)) > 0.3
        extra["mask"][1] = False  # one fully masked row: zeros
        ins = ["q", "k", "v", "mask"]
    elif case == "4d_float_mask_scale_softcap":
        q, k, v = _f32(b, 3, s, d), _f32(b, 3, 4, d), _f32(b, 3, 4, d)
        attrs.update(scale=0.3, softcap=2.0)
        extra["mask"] = _f32(b, 1, s, 4)
        ins = ["q", "k", "v", "mask"]
    else:
        q, k, v = _f32(1, 4, 2, d), _f32(1, 2, 2, d), _f32(1, 2, 2, d)
        extra.update(past_k=_f32(1, 2, 5, d), past_v=_f32(1, 2, 5, d))
        attrs["is_causal"] = 1
        ins, outputs = ["q", "k", "v", "", "past_k", "past_v"], ["y", "present_k", "present_v"]
    feeds = {"q": q, "k": k, "v": v, **extra}
    model = _model([_node("Attention", ins, outputs, **attrs)], feeds, outputs, opset=23)
    want = _attention_reference(model, feeds)
    got = gir.Session(model, target="cpu").run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    if case == "3d_bool_mask":
        assert not np.isnan(got[0]).any() and np.all(got[0][:, 1] == 0)
    p = plan(load(model), get_target("cuda:sm_90"))
    env = execute(p, feeds)
    for name, w in zip(outputs, want):
        np.testing.assert_allclose(env[name], w, rtol=1e-5, atol=1e-6)
    assert build_steps(p), "no kernel was built"  # NVRTC, as gir compile --target cuda:sm_90


def test_attention_undefined_qk_matmul_output_mode_is_listed_as_unsupported():
    q = _f32(1, 2, 3, 4)
    model = _model([_node("Attention", ["q", "q", "q"], ["y", "", "", "qk"], qk_matmul_output_mode=7)], {"q": q},
                   ["y", "qk"], opset=23)
    with pytest.raises(UnsupportedOpError, match="qk_matmul_output_mode=7"):
        load(model)


# ---- Einsum -------------------------------------------------------------------------------------

@pytest.mark.parametrize("equation, shapes", [
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 7, 4)]),        # attention scores
    ("bhqk,bhkd->bqhd", [(2, 3, 5, 7), (2, 3, 7, 4)]),        # attention values, heads-last output
    ("ij,jk", [(3, 5), (5, 2)]),                               # implicit output
    ("...ij,...jk->...ik", [(2, 3, 3, 4), (1, 3, 4, 5)]),      # broadcast ellipsis
    ("i,j->ij", [(3,), (4,)]),                                 # outer product
    ("bij,bij->bi", [(2, 3, 5), (2, 3, 5)]),                   # Hadamard + sum
    ("abc,cd,de->ae", [(2, 3, 4), (4, 5), (5, 3)]),            # chain, b summed out early
    ("ii->i", [(4, 4)]),                                       # diagonal
    ("bii", [(2, 3, 3)]),                                      # batched trace (implicit)
    ("nchw->nhwc", [(1, 3, 2, 5)]),                            # transpose
])
def test_einsum_forms(equation, shapes):
    feeds = {f"x{i}": _f32(*s) for i, s in enumerate(shapes)}
    node = helper.make_node("Einsum", list(feeds), ["y"], equation=equation)
    _check([node], feeds, opset=12, compile_cuda=True)
    np.testing.assert_allclose(gir.Session(_model([node], feeds, opset=12), target="cpu").run(None, feeds)[0],
                               np.einsum(equation, *feeds.values()), rtol=1e-5, atol=1e-5)


def test_einsum_matmul_goes_to_the_library_as_one_matmul():
    feeds = {"a": _f32(4, 64, 128), "b": _f32(4, 128, 96)}
    model = _model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik")], feeds, opset=12)
    assert [op.kind for op in load(model).ops if op.kind != "view"] == ["matmul"]  # views move nothing


@pytest.mark.parametrize("mode", [0, 2, 3])
def test_attention_qk_matmul_output_modes(mode):
    q, k, v = _f32(2, 4, 3, 5), _f32(2, 2, 6, 5), _f32(2, 2, 6, 5)
    feeds = {"q": q, "k": k, "v": v, "mask": RNG.random((3, 6)) > 0.4}
    outputs = ["y", "qk"]
    model = _model([_node("Attention", ["q", "k", "v", "mask"], ["y", "", "", "qk"], qk_matmul_output_mode=mode,
                          is_causal=1)], feeds, outputs, opset=23)
    want = _attention_reference(model, feeds)
    got = gir.Session(model, target="cpu").run(None, feeds)
    lowest = np.finfo(np.float32).min  # mode 2 masks: -inf here and in onnx's reference, lowest in onnxruntime
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.maximum(g, lowest), np.maximum(w, lowest), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs", [{"is_causal": 1}, {"left_window_size": 2}, {"left_window_size": 1, "right_window_size": 1}])
def test_attention_nonpad_kv_seqlen_and_windows(attrs):
    """nonpad_kv_seqlen (opset 24) is a run-time input: the position mask is computed from it per
    batch; the sliding window attributes are opset 25."""
    q, k, v = _f32(3, 2, 2, 4), _f32(3, 2, 7, 4), _f32(3, 2, 7, 4)
    feeds = {"q": q, "k": k, "v": v, "nonpad": np.array([7, 4, 2], np.int64)}
    window = "left_window_size" in attrs
    model = _model([_node("Attention", ["q", "k", "v", "", "", "", "nonpad"], ["y"], **attrs)], feeds,
                   opset=25 if window else 24)
    if window:  # onnxruntime 1.31 does not know Attention-25's window attributes: onnx's reference
        from onnx.reference import ReferenceEvaluator
        want = ReferenceEvaluator(model).run(None, feeds)[0]
    else:
        want = _attention_reference(model, feeds)[0]
    got = gir.Session(model, target="cpu").run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 1.5, 0.6]])
def test_resize_opset10(mode, scales):
    """Resize-10: scales is input 1, asymmetric coordinates; nearest floors when upsampling and
    ceils when downsampling, as onnxruntime does."""
    x = _f32(1, 2, 5, 7)
    _check([_node("Resize", ["x", "scales"], mode=mode)], {"x": x}, inits={"scales": np.array(scales, np.float32)},
           opset=10)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_opset9(mode):
    x = _f32(1, 2, 3, 5)
    _check([_node("Upsample", ["x", "scales"], mode=mode)], {"x": x},
           inits={"scales": np.array([1, 1, 2, 1.5], np.float32)}, opset=9)
