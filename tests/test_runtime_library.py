"""The native engines' host convolution (per-offset batched GEMMs) against the numpy oracle:
strides, pads, dilations, groups, depthwise, 1-D and 3-D, fp16 accumulated in fp32."""
import numpy as np
import pytest

from gir.frontend.reference import conv_reference
from gir.runtime.library import conv

CASES = {  # x shape, w shape, strides, pads (begin..., end...), dilations, group
    "grouped_strided_dilated": ((2, 6, 9, 11), (4, 3, 3, 2), [2, 1], [1, 0, 2, 1], [1, 2], 2),
    "depthwise": ((1, 8, 7, 7), (8, 1, 5, 5), [1, 1], [2, 2, 2, 2], [1, 1], 8),
    "depthwise_multiplier": ((1, 6, 8, 8), (12, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 6),
    "1d": ((1, 3, 10), (5, 3, 3), [2], [1, 1], [2], 1),
    "3d": ((1, 4, 5, 6, 7), (6, 2, 2, 3, 2), [1, 2, 1], [0, 1, 0, 1, 0, 1], [1, 1, 2], 2),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_conv_matches_the_reference(case, dtype):
    xs, ws, strides, pads, dilations, group = CASES[case]
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in (xs, ws, ws[:1]))
    want = conv_reference(*(a.astype(np.float32) for a in (x, w, b)), strides, pads, dilations, group)
    got = conv(x, w, b, strides, pads, dilations, group)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
