"""The CPU dialect's own float32 exp (gir_expf: branch-free so element loops vectorise) against
the exact result: within 1 ulp over the normal range, and libm's inf, 0 and NaN."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from gir.runtime import Session

SPECIALS = [np.inf, -np.inf, np.nan, 0.0, -0.0, 88.72283, 88.7229, 89.0, -87.3365, -103.9, -104.5, -200.0, 1e-8, -1e-8]


def _run(op: str, x: np.ndarray) -> np.ndarray:
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    (y,) = Session(m, target="cpu").run(None, {"x": x})
    return y


def test_exp_is_within_one_ulp_and_keeps_the_specials():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-110, 90, 200_000), rng.uniform(-1, 1, 50_000), rng.uniform(-1e-6, 1e-6, 5_000),
                        SPECIALS]).astype(np.float32)
    y = _run("Exp", x)
    exact = np.exp(x.astype(np.float64))
    normal = (exact >= np.finfo(np.float32).tiny) & (exact <= np.finfo(np.float32).max)
    ulps = np.abs(y[normal] - exact[normal]) / np.spacing(exact[normal].astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 1.0, ulps.max()
    tiny = exact < np.finfo(np.float32).tiny  # subnormal results: one rounding, a few subnormal steps at most
    assert np.abs(y[tiny] - exact[tiny]).max() <= 4 * 2.0**-149
    assert np.all(np.isinf(y[exact > np.finfo(np.float32).max]))
    np.testing.assert_array_equal(y[-len(SPECIALS):], np.exp(np.array(SPECIALS, np.float32)))


@pytest.mark.parametrize("op,ref", [("Sigmoid", lambda x: 1 / (1 + np.exp(-x))),
                                    ("Softmax", lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum())])
def test_ops_built_on_exp(op, ref):
    x = np.linspace(-30, 30, 10_001, dtype=np.float32)
    np.testing.assert_allclose(_run(op, x), ref(x.astype(np.float64)), rtol=2e-6, atol=1e-6)


def test_erf_is_within_three_ulps_and_keeps_the_specials():
    from math import erf
    rng = np.random.default_rng(1)
    specials = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0, 4.0, 3.9, 1e-30, -1e-38]
    x = np.concatenate([rng.uniform(-6, 6, 100_000), rng.uniform(-1.2, 1.2, 100_000), rng.uniform(-1e-3, 1e-3, 5_000),
                        specials]).astype(np.float32)
    y = _run("Erf", x)
    finite = np.isfinite(x)
    exact = np.array([erf(float(v)) for v in x[finite]])
    spacing = np.spacing(np.maximum(np.abs(exact), np.finfo(np.float32).tiny).astype(np.float32)).astype(np.float64)
    assert (np.abs(y[finite] - exact) / spacing).max() <= 3.0
    np.testing.assert_array_equal(y[~finite], [1.0, -1.0, np.nan])
    np.testing.assert_array_equal(np.signbit(y[-8:-6]), [False, True])  # erf(+-0) = +-0


def test_tanh_is_within_two_ulps_and_keeps_the_specials():
    """gir_tanhf (the vectorisable tanh the C dialect uses instead of libm's call per element)."""
    rng = np.random.default_rng(2)
    specials = [np.inf, -np.inf, np.nan, 0.0, -0.0, 0.625, -0.625, 0.62499994, 9.0, -44.0, 100.0, 1e-30, -1e-38]
    x = np.concatenate([rng.uniform(-12, 12, 100_000), rng.uniform(-0.7, 0.7, 100_000), rng.uniform(-1e-3, 1e-3, 5_000),
                        specials]).astype(np.float32)
    y = _run("Tanh", x)
    exact = np.tanh(x.astype(np.float64))
    nonzero = np.isfinite(x) & (exact != 0)
    spacing = np.spacing(np.abs(exact[nonzero]).astype(np.float32)).astype(np.float64)
    assert (np.abs(y[nonzero] - exact[nonzero]) / spacing).max() <= 2.0
    np.testing.assert_array_equal(y[-len(specials):-len(specials) + 5], [1.0, -1.0, np.nan, 0.0, -0.0])
    np.testing.assert_array_equal(np.signbit(y[-len(specials) + 3:-len(specials) + 5]), [False, True])


@pytest.mark.parametrize("k", [2.0, 3.0, 4.0, 2.5])
def test_pow_by_a_small_constant_integer_is_products_and_matches_onnxruntime(k):
    """Pow(x, 2.0) as exporters write LayerNorm's square (and 3.0 for GELU's cube) becomes
    x * x (no libm pow per element); other exponents keep pow. Same numbers as onnxruntime,
    NaN and infinities included."""
    import onnxruntime as ort
    from gir.frontend import load
    e = helper.make_tensor("e", TensorProto.FLOAT, [1], [k])
    g = helper.make_graph([helper.make_node("Pow", ["x", "e"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])], [e])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = np.random.default_rng(3).normal(0, 3, (4, 256)).astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (got,) = Session(m, target="cpu").run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    (op,) = load(m).ops
    assert ("pow(" in str(op.attrs["expr"])) == (k == 2.5)
