"""Fast start (issue 25): a session read back from the cache refers to the model file's own
initializers instead of storing them, maps the constants its plan derived, and reuses its
emitted kernels; a changed model or a damaged entry is never used."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from onnx import TensorProto, helper, numpy_helper

import gir
from gir.cache import BufferStore, Store, gir_version, stable_repr
from gir.ir import get_target
from gir.runtime.model_bytes import ModelBytes, raw_regions

N = 64  # a 64x64 weight: 16 KiB, large enough to tell apart from the plan's own bytes


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, N)).astype(np.float32), rng.standard_normal((N, N)).astype(np.float32)


def _model(w, b):
    """y = relu(x @ w) + b: `w` feeds a library matmul, `b` an elementwise kernel as it is."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
         helper.make_node("Add", ["r", "b"], ["y"])], "fast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, N])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _expected(w, b, x):
    return np.maximum(x @ w, 0) + b


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "session"


def _store():
    return Store("plan", gir_version(), repr(get_target("cpu")), 2)


def _session(path):
    return gir.Session(str(path), target="cpu", plan_cache=_store())


X = np.random.default_rng(9).standard_normal((N, N)).astype(np.float32)


def _entries(cache):
    return sorted(cache.glob("*.pkl"))


def test_a_changed_weight_of_the_same_shape_gives_new_numbers(tmp_path, cache):
    path = tmp_path / "m.onnx"
    w, b = _weights()
    onnx.save(_model(w, b), str(path))
    assert not _session(path).cached
    again = _session(path)
    assert again.cached
    np.testing.assert_allclose(again.run(None, {"x": X})[0], _expected(w, b, X), rtol=1e-5, atol=1e-5)
    for name in ("w", "b"):  # one value of one weight, same shape, same file size, same modification time
        st = os.stat(path)
        w2, b2 = w.copy(), b.copy()
        (w2 if name == "w" else b2)[3, 5] += 1.0
        onnx.save(_model(w2, b2), str(path))
        assert os.stat(path).st_size == st.st_size
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        changed = _session(path)
        assert not changed.cached
        np.testing.assert_allclose(changed.run(None, {"x": X})[0], _expected(w2, b2, X), rtol=1e-5, atol=1e-5)
        assert _session(path).cached
        onnx.save(_model(w, b), str(path))  # back to the first weights: the first entry again
        back = _session(path)
        assert back.cached
        np.testing.assert_allclose(back.run(None, {"x": X})[0], _expected(w, b, X), rtol=1e-5, atol=1e-5)


def test_the_entry_holds_no_initializer(tmp_path, cache):
    path = tmp_path / "m.onnx"
    w, b = _weights()
    onnx.save(_model(w, b), str(path))
    first = _session(path)
    (entry,) = _entries(cache)
    data = entry.read_bytes()
    assert b[7].tobytes() not in data  # `b` is used as it is: referred to, not stored
    # `w` is stored only in the layout the plan derived from it (if any), never as the model holds it
    assert w.tobytes()[:256] not in data
    assert len(data) < w.nbytes + b.nbytes
    again = _session(path)
    assert again.cached
    held = {n: t.value for n, t in again.plan.graph.tensors.items() if t.value is not None}
    np.testing.assert_array_equal(held["b"], b)
    assert held["b"].ctypes.data % 64 == 0  # views of the model's bytes, each at a multiple of 64
    np.testing.assert_array_equal(again.run(None, {"x": X})[0], first.run(None, {"x": X})[0])


@pytest.mark.parametrize("damage", ["truncate", "flip", "table", "empty", "garbage"])
def test_a_damaged_entry_is_rebuilt_without_a_traceback(tmp_path, cache, capfd, damage):
    path = tmp_path / "m.onnx"
    w, b = _weights()
    onnx.save(_model(w, b), str(path))
    _session(path)
    (entry,) = _entries(cache)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":  # a bit of the last buffer
        data[-5] ^= 0x10
    elif damage == "table":
        data[60] ^= 0x01
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"GIRCACHE3\n" + bytes(100))
    entry.write_bytes(bytes(data))
    capfd.readouterr()
    rebuilt = _session(path)
    assert not rebuilt.cached
    np.testing.assert_allclose(rebuilt.run(None, {"x": X})[0], _expected(w, b, X), rtol=1e-5, atol=1e-5)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and not err.strip()
    assert _session(path).cached


def test_a_damaged_entry_in_a_fresh_process(tmp_path, cache):
    path = tmp_path / "m.onnx"
    onnx.save(_model(*_weights()), str(path))
    code = ("import sys, gir; from gir.cache import Store, gir_version; from gir.ir import get_target; "
            "s = gir.Session(sys.argv[1], target='cpu', plan_cache=Store('plan', gir_version(), "
            "repr(get_target('cpu')), 2)); print(s.cached)")
    run = lambda: subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert run().stdout.split() == ["False"]
    (entry,) = _entries(cache)
    entry.write_bytes(entry.read_bytes()[:-100])
    damaged = run()
    assert damaged.stdout.split() == ["False"] and "Traceback" not in damaged.stderr
    assert run().stdout.split() == ["True"]


def test_kernels_are_not_emitted_again(tmp_path, cache, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx.save(_model(*_weights()), str(path))
    first = _session(path)
    import gir.backends.cpu.engine as engine

    def refuse(*args):
        raise AssertionError("emitted again")
    monkeypatch.setattr(engine, "emit_plan", refuse)
    again = _session(path)
    assert again.cached and again.engine.emitted[0] == first.engine.emitted[0]
    np.testing.assert_array_equal(again.run(None, {"x": X})[0], first.run(None, {"x": X})[0])


def test_a_model_with_external_data_stores_its_weights(tmp_path, cache):
    path = tmp_path / "ext.onnx"
    w, b = _weights()
    onnx.save(_model(w, b), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.bin", size_threshold=0)
    source = ModelBytes.read(str(path))
    assert source is not None and source.external
    assert not _session(path).cached
    again = _session(path)
    assert again.cached
    np.testing.assert_allclose(again.run(None, {"x": X})[0], _expected(w, b, X), rtol=1e-5, atol=1e-5)
    data = np.fromfile(tmp_path / "ext.bin", np.float32)  # changed external data: a new key
    data[0] += 1.0
    data.tofile(tmp_path / "ext.bin")
    assert not _session(path).cached


def test_raw_regions_are_where_onnx_reads_the_initializers(tmp_path):
    w, b = _weights()
    path = tmp_path / "m.onnx"
    onnx.save(_model(w, b), str(path))
    source = ModelBytes.read(str(path))
    assert not source.external and len(source.regions) == 2
    for t in onnx.load(str(path)).graph.initializer:
        value = numpy_helper.to_array(t)
        found = [source.resolve(("gir-model", off, n, value.dtype.str, value.shape))
                 for off, (n, _) in source.regions.items() if n == value.nbytes]
        assert any(np.array_equal(f, value) for f in found)
    with pytest.raises(ValueError):
        source.resolve(("gir-model", 1, 4 * N * N, "<f4", (N, N)))
    light = ModelBytes.read(str(path), keep=False)  # hashed, not kept: the same key, and it still refers
    assert light.digest == source.digest and light.data.size == 0
    assert set(light.refer([w, b, w.T.copy()]).values()) == set(source.refer([w, b]).values())
    assert len(light.refer([w, b, w.T.copy()])) == 2
    regions, external = raw_regions(memoryview(path.read_bytes()))
    assert [n for _, n in regions] == [4 * N * N] * 2 and not external
    (tmp_path / "bad.onnx").write_bytes(b"\xff" * 100)
    assert ModelBytes.read(str(tmp_path / "bad.onnx")) is None  # not a model: the loader says why


def test_buffer_store_refers_and_resolves(tmp_path, monkeypatch):
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    outside = np.arange(1000, dtype=np.float32)
    value = {"outside": outside, "inside": np.ones(3000, np.float32)}
    BufferStore("session", "t").put("k", value, refer=lambda obj: "far" if obj is outside else None)
    size = sum(p.stat().st_size for p in (tmp_path / "cache" / "session").glob("*.pkl"))
    assert 12000 <= size < 12000 + outside.nbytes
    back = BufferStore("session", "t").get("k", resolve=lambda token: token)
    assert back["outside"] == "far" and back["inside"].sum() == 3000 and back["inside"].flags.writeable
    assert BufferStore("session", "t").get("k") is None  # a token and nothing to resolve it: a miss


def test_stable_repr_does_not_follow_string_hashing():
    code = ("from dataclasses import dataclass; from gir.cache import stable_repr\n"
            "@dataclass(frozen=True)\nclass T:\n    extra: dict\n"
            "print(stable_repr(T({'k': frozenset('abcdefgh'), 'j': {'x', 'y', 'z'}})))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(4)}
    assert len(outs) == 1
    assert stable_repr(frozenset({"b", "a"})) == "frozenset({'a', 'b'})" and stable_repr((1,)) == "(1,)"


def test_a_guessed_key_is_checked_against_the_bytes(tmp_path, cache, monkeypatch):
    """A warm session reads its entry by the digest the file had when last seen (same inode, size
    and modification time) while the bytes are hashed; a file changed under the same identity is
    made again by its own key, and a damaged hint is no hint."""
    from gir.runtime import session as session_module
    path = tmp_path / "m.onnx"
    w, b = _weights()
    onnx.save(_model(w, b), str(path))
    first = _session(path)
    digest = ModelBytes.read(str(path)).digest
    assert session_module._guess(str(path)) == digest
    opens = []
    real = gir.Session._open
    monkeypatch.setattr(gir.Session, "_open", lambda self, *a, **k: opens.append(k["guess"]) or real(self, *a, **k))
    assert _session(path).cached and opens == [True]
    st = os.stat(path)
    w2 = w.copy()
    w2[0, 0] = -w2[0, 0]
    onnx.save(_model(w2, b), str(path))  # in place: the same inode, size and (restored) modification time
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert session_module._guess(str(path)) == digest  # the hint still names the old bytes
    opens.clear()
    changed = _session(path)
    assert opens == [True, False] and not changed.cached
    np.testing.assert_allclose(changed.run(None, {"x": X})[0], _expected(w2, b, X), rtol=1e-5, atol=1e-5)
    assert session_module._guess(str(path)) == ModelBytes.read(str(path)).digest != digest
    for hint in cache.glob("*.hint"):
        hint.write_text("not a digest")
    opens.clear()
    assert _session(path).cached and opens == [True]
    np.testing.assert_array_equal(first.run(None, {"x": X})[0].shape, (N, N))


def test_many_small_initializers_read_in_few_tasks(tmp_path):
    """Thousands of initializers: each one's raw data lands at a multiple of 64 bytes, and the
    digest does not depend on how the bytes were read (kept, hashed later, not kept)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(16 + i % 5).astype(np.float32), f"c{i}") for i in range(3000)]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "many",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], inits)
    path = tmp_path / "many.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    kept, later, light = (ModelBytes.read(str(path), **kw) for kw in ({}, {"later": True}, {"keep": False}))
    assert kept.digest == later.digest == light.digest and len(kept.regions) == 3000
    arrays = [numpy_helper.to_array(t) for t in inits]
    tokens = light.refer(arrays)
    assert len(tokens) == 3000
    for a in arrays[::97]:
        back = later.resolve(tokens[id(a)])
        assert back.ctypes.data % 64 == 0 and np.array_equal(back, a)
