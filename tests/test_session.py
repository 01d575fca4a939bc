"""gir.Session, onnxruntime-style: every zoo model (tiny) on the CPU target with intermediates
in a shared arena, feeds validated with clear errors."""
import numpy as np
import onnxruntime as ort
import pytest

import gir
import models
from gir.runtime import SessionError


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_session_matches_onnxruntime_with_a_shared_arena(name):
    model = models.load_bundled(name)
    feeds = models.example_inputs(model, 0)
    session = gir.Session(str(models.bundled_path(name)), target="cpu", limit=1)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = session.run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())))
    assert session.memory.arena_bytes <= session.memory.unshared_bytes
    assert [a.name for a in session.get_inputs()] == [i.name for i in model.graph.input
                                                       if i.name not in {t.name for t in model.graph.initializer}]


def test_session_reuses_memory_on_a_deep_model():
    session = gir.Session(models.load_bundled("bert"), target="cpu", limit=1)
    assert session.memory.arena_bytes < session.memory.unshared_bytes / 2


def test_feeds_are_validated_by_name_shape_and_dtype():
    session = gir.Session(models.load_bundled("shufflenet_v2"), target="cpu", limit=1)
    (arg,) = session.get_inputs()
    good = np.zeros(arg.shape, np.float32)
    with pytest.raises(SessionError, match=r"no input named 'x'; inputs are input"):
        session.run(None, {"x": good})
    with pytest.raises(SessionError, match=r"input 'input' has shape \[1\], expected"):
        session.run(None, {"input": np.zeros(1, np.float32)})
    with pytest.raises(SessionError, match=r"has dtype float64, expected float32"):
        session.run(None, {"input": good.astype(np.float64)})
    with pytest.raises(SessionError, match=r"no output named 'nope'"):
        session.run(["nope"], {"input": good})
    with pytest.raises(SessionError, match=r"missing input 'input'"):
        session.run(None, {})
