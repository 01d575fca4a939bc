"""Issue 21's set-B ops (Resize, ConvTranspose, Einsum, RMSNormalization, Attention) on odd
shapes: gir.Session on the CPU (emitted C, run natively) against onnxruntime, and the same model
planned for cuda:sm_90 and run by the reference interpreter (test_index_ops._check)."""
import numpy as np
import pytest
from onnx import helper

from gir.frontend import load
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
    _check([node], {"x": x}, inits={"scales": scales}, opset=13)


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
