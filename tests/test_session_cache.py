"""gir.Session with the persistent cache reads a model's whole plan back instead of planning it
again (fast start, issue 25); the key is the model's bytes, bound shapes, target and limit."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from onnx import TensorProto, helper, numpy_helper

import gir
from gir.cache import Store, gir_version
from gir.ir import get_target


def _model():
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
         helper.make_node("Add", ["r", "m"], ["y"])], "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture
def path(tmp_path, monkeypatch):
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    onnx.save(_model(), str(tmp_path / "small.onnx"))
    return str(tmp_path / "small.onnx")


def _store(limit=2):
    return Store("plan", gir_version(), repr(get_target("cpu")), limit)


def test_a_model_planned_before_is_read_back(path):
    first = gir.Session(path, target="cpu", plan_cache=_store())
    again = gir.Session(path, target="cpu", plan_cache=_store())
    assert not first.cached and again.cached
    assert [k.name for k in again.plan.kernels] == [k.name for k in first.plan.kernels]
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)}
    for a, b in zip(first.run(None, feeds), again.run(None, feeds)):
        np.testing.assert_array_equal(a, b)
    proto = onnx.load(path)  # a ModelProto is keyed by its bytes too
    assert not gir.Session(proto, target="cpu", plan_cache=_store()).cached
    assert gir.Session(proto, target="cpu", plan_cache=_store()).cached


def test_what_changes_the_plan_changes_the_key(path):
    gir.Session(path, target="cpu", plan_cache=_store())
    assert not gir.Session(path, target="cpu", limit=1, plan_cache=_store(1)).cached
    assert not gir.Session(path, target="cpu").cached  # no persistent cache given: planned every time
    graph = gir.frontend.load(path)
    assert not gir.Session(graph, target="cpu", plan_cache=_store()).cached  # a loaded graph: no model bytes


def test_a_fresh_process_reads_it_back(path):
    code = ("import sys, gir; from gir.cache import Store, gir_version; from gir.ir import get_target; "
            "s = gir.Session(sys.argv[1], target='cpu', plan_cache=Store('plan', gir_version(), "
            "repr(get_target('cpu')), 2)); print(s.cached)")
    env = dict(os.environ)
    out = [subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, env=env, check=True)
           .stdout.split() for _ in range(2)]
    assert out == [["False"], ["True"]]


@pytest.mark.parametrize("damage", [b"", b"GIRCACHE1\nnot a pickle"])
def test_a_damaged_entry_is_planned_again(path, tmp_path, damage):
    gir.Session(path, target="cpu", plan_cache=_store())
    for entry in (tmp_path / "cache" / "session").glob("*.pkl"):
        entry.write_bytes(damage)
    assert not gir.Session(path, target="cpu", plan_cache=_store()).cached
    assert gir.Session(path, target="cpu", plan_cache=_store()).cached


def test_gir_run_reads_a_model_back(path, capsys):
    from gir.cli import main
    for cached in (False, True):
        assert main(["run", path, "--verbose"]) == 0
        assert ("plan read back from the cache" in capsys.readouterr().err) == cached


def test_the_session_store_keeps_its_budget_least_recently_used_first(tmp_path, monkeypatch):
    """Whole sessions hold their weights: the kind's folder stays under $GIR_CACHE_SESSION_GB,
    removing the entries read or written longest ago, never the one just written."""
    from gir.cache import BufferStore, cache_root
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    entry = lambda i: {"weights": np.full(64 * 1024, i, np.float32)}  # 256 KiB each
    store = BufferStore("session", "test")
    monkeypatch.setenv("GIR_CACHE_SESSION_GB", str(600 * 1024 / (1 << 30)))  # room for two entries
    for i in range(3):
        store[i] = entry(i)
        os.utime(store._path(i), ns=(i * 10**9, i * 10**9))  # written in order, a second apart
    assert not store._path(0).exists() and store._path(2).exists()  # the oldest went when the third came
    assert BufferStore("session", "test").get(1)["weights"][0] == 1  # a read: 2 is now the least recent
    store[3] = entry(3)
    fresh = BufferStore("session", "test")
    assert fresh.get(2) is None and fresh.get(1)["weights"][0] == 1 and fresh.get(3)["weights"][0] == 3
    assert sum(p.stat().st_size for p in (cache_root() / "session").glob("*.pkl")) <= 600 * 1024


def test_a_tied_weight_read_back_is_still_one_array(tmp_path, monkeypatch):
    """GPT-2's lm_head: Gemm(x, wte, transB=1) beside Gather(wte) from a ModelProto (no file to
    refer to). The matmul's weight is a view of the embedding; read back from the session cache
    it is still that view (gir.cache's pickler stores a view as its array and where it lies),
    not a second copy of the embedding."""
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    w = np.random.default_rng(1).standard_normal((40, 16)).astype(np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1), helper.make_node("Gather", ["w", "i"], ["g"])], "tied",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]), helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40]), helper.make_tensor_value_info("g", TensorProto.FLOAT, [3, 16])],
        [numpy_helper.from_array(w, "w")]), opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 16)).astype(np.float32), "i": np.array([39, 0, 7], np.int64)}
    first = gir.Session(model, target="cpu", plan_cache=_store())
    again = gir.Session(model, target="cpu", plan_cache=_store())
    assert not first.cached and again.cached
    weights = [v for v in again.engine.constants.values() if v.size == w.size]
    assert len(weights) == 2 and np.shares_memory(*weights)
    for got, want in zip(again.run(None, feeds), first.run(None, feeds)):
        np.testing.assert_array_equal(got, want)
