"""The persistent compile cache (gir/cache.py) and what `gir compile` does with it: hits and
misses, keys that tell targets and dtypes apart, corrupt entries rebuilt, atomic writes,
`gir cache info|clear`, `--jobs`, and the report with its pictures."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from gir import cache
from gir.cli import main
from gir.frontend import load
from gir.fusion.plan import plan
from gir.ir import get_target
from gir.model_digest import model_digest

pytest.importorskip("cuda.bindings.nvrtc")
TARGET = "cuda:sm_80"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test starts from an empty cache of its own."""
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def small_model(path, dtype=np.float32, bias=0.5) -> str:
    """Softmax, Add, Transpose, Relu: two kernels, planned in about a second."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x, y = helper.make_tensor_value_info("x", t, [32, 64]), helper.make_tensor_value_info("y", t, [64, 32])
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1, name="softmax"),
             helper.make_node("Add", ["s", "b"], ["a"], name="add"),
             helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0], name="transpose"),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "small", [x], [y], [numpy_helper.from_array(np.full(64, bias, dtype), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return str(path)


def compile_cli(capsys, model, out, *extra):
    code = main(["compile", model, "--target", TARGET, "-o", str(out), *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured


def read_tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_store_hit_miss_and_namespace():
    store = cache.Store("plan", "ns-a")
    assert "key" not in store and store.misses == 1
    store["key"] = {"value": [1, 2]}
    again = cache.Store("plan", "ns-a")  # a new process would see the same
    assert again["key"] == {"value": [1, 2]} and again.hits == 1
    assert "key" not in cache.Store("plan", "ns-b")


def test_plan_keys_tell_targets_and_dtypes_apart(tmp_path):
    graph32, graph16 = load(small_model(tmp_path / "f32.onnx")), load(small_model(tmp_path / "f16.onnx", np.float16))
    a100, h100 = get_target("cuda:sm_80"), get_target("cuda:sm_90")

    def planned(graph, target):
        store = cache.Store("plan", repr(target))
        plan(graph, target, limit=1, cache=store)
        return store.hits, store.misses
    first = planned(graph32, a100)
    assert first[0] == 0 and first[1] > 0
    assert planned(graph32, a100) == (first[1], 0)
    assert planned(graph16, a100)[0] == 0
    assert planned(graph32, h100)[0] == 0


def test_corrupt_entry_is_a_miss_and_rebuilt(cache_dir):
    store = cache.Store("plan", "ns")
    store["key"] = list(range(100))
    (entry,) = (cache_dir / "plan").iterdir()
    entry.write_bytes(entry.read_bytes()[:-7])  # truncated
    reader = cache.Store("plan", "ns")
    assert reader.get("key") is None and reader.rebuilt == 1 and not entry.exists()
    reader["key"] = list(range(100))
    assert cache.Store("plan", "ns")["key"] == list(range(100))


def test_failed_write_leaves_old_entry_and_no_partial_file(cache_dir, monkeypatch):
    store = cache.Store("plan", "ns")
    store["key"] = "old"

    def fail(src, dst):
        raise OSError("disk full")
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", fail)
        cache.Store("plan", "ns")["key"] = "new"  # the cache swallows the failure
    assert cache.Store("plan", "ns")["key"] == "old"
    assert [p.name for p in (cache_dir / "plan").iterdir() if p.name.startswith(".tmp-")] == []


def test_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    from gir.backends.cuda.compiler import compile_cuda
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "a_file" / "cache"))  # no folder can be made there
    cache.Store("plan", "ns")["key"] = 1
    assert cache.Store("plan", "ns").get("key") is None
    assert compile_cuda('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', "sm_80").cubin


def test_unstable_key_is_refused():
    with pytest.raises(TypeError, match="stable repr"):
        cache.Store("plan", "ns").get(object())


def test_nvrtc_binaries_come_from_the_cache(monkeypatch):
    from gir.backends.cuda import compiler
    source = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }'
    first = compiler.compile_cuda(source, "sm_80")

    def no_compiler(*args):
        raise AssertionError("NVRTC called for a cached source")
    monkeypatch.setattr(compiler, "_nvrtc_compile", no_compiler)
    again = compiler.compile_cuda(source, "sm_80")
    assert again.cubin == first.cubin and again.resources == first.resources
    with pytest.raises(AssertionError, match="NVRTC called"):
        compiler.compile_cuda(source, "sm_90")  # another architecture is another key


def test_damaged_native_library_is_rebuilt(cache_dir):
    """In a new process each time: a process that loaded a library keeps it loaded."""
    script = ("from gir.backends.cpu.compiler import build; "
              "print(build('int twice(int x) { return 2 * x; }').twice(21))")

    def run():
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ)
        return result.stdout.strip()
    assert run() == "42"
    (lib,) = (cache_dir / "native").glob("*.so")
    lib.write_bytes(b"not a library")
    assert run() == "42" and lib.read_bytes()[:4] == b"\x7fELF"


def test_model_digest_covers_external_data(tmp_path):
    model = onnx.load(small_model(tmp_path / "inline.onnx"))
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.data", size_threshold=0)
    before = model_digest(str(tmp_path / "ext.onnx"))
    data = bytearray((tmp_path / "ext.data").read_bytes())
    data[0] ^= 1
    (tmp_path / "ext.data").write_bytes(data)
    assert model_digest(str(tmp_path / "ext.onnx")) != before
    assert model_digest(str(tmp_path / "missing.onnx")) is None


def test_second_compile_comes_from_the_cache(capsys, tmp_path):
    model = small_model(tmp_path / "m.onnx")
    first = compile_cli(capsys, model, tmp_path / "a", "--verbose")
    assert "model cache: miss" in first.err
    second = compile_cli(capsys, model, tmp_path / "b", "--verbose")
    assert "model cache: hit" in second.err and "from the compile cache" in second.err
    assert read_tree(tmp_path / "a") == read_tree(tmp_path / "b")
    assert first.out.split(": ", 1)[1] == second.out.split(": ", 1)[1] and "2 kernel launches" in first.out


def test_same_structure_other_weights_reuses_every_search(capsys, tmp_path):
    compile_cli(capsys, small_model(tmp_path / "m.onnx", bias=0.5), tmp_path / "a")
    err = compile_cli(capsys, small_model(tmp_path / "n.onnx", bias=0.25), tmp_path / "b", "--verbose").err
    assert "model cache: miss" in err and " 0 miss(es)" in err and "plan cache: 0 hit" not in err


def test_corrupt_entries_in_a_compile_are_rebuilt(capsys, tmp_path, cache_dir):
    model = small_model(tmp_path / "m.onnx")
    compile_cli(capsys, model, tmp_path / "a")
    for entry in [*(cache_dir / "model").iterdir(), *(cache_dir / "plan").iterdir()]:
        entry.write_bytes(b"GIRCACHE1\n" + bytes(40))
    err = compile_cli(capsys, model, tmp_path / "b", "--verbose").err
    assert "model cache: miss" in err and "corrupt entr(ies) rebuilt" in err and " 0 corrupt" not in err
    assert read_tree(tmp_path / "a")["plan.json"] == read_tree(tmp_path / "b")["plan.json"]
    assert "model cache: hit" in compile_cli(capsys, model, tmp_path / "c", "--verbose").err


def test_cache_info_and_clear(capsys, tmp_path, cache_dir):
    compile_cli(capsys, small_model(tmp_path / "m.onnx"), tmp_path / "a", "--quiet")
    assert main(["cache", "info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["root"] == str(cache_dir)
    assert all(data["kinds"][k]["entries"] > 0 and data["kinds"][k]["bytes"] > 0 for k in ("model", "plan", "cuda"))
    assert main(["cache", "info"]) == 0 and "plan" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0 and "cleared" in capsys.readouterr().out
    assert main(["cache", "info", "--json"]) == 0
    assert all(k["entries"] == 0 for k in json.loads(capsys.readouterr().out)["kinds"].values())


def test_jobs_give_identical_outputs(capsys, tmp_path, monkeypatch):
    model = small_model(tmp_path / "m.onnx")
    compile_cli(capsys, model, tmp_path / "one", "--jobs", "1", "--quiet")
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "other-cache"))  # a cold compile again, in 2 processes
    compile_cli(capsys, model, tmp_path / "two", "--jobs", "2", "--quiet")
    one, two = read_tree(tmp_path / "one"), read_tree(tmp_path / "two")
    explain = [json.loads(t.pop("explain.json")) for t in (one, two)]
    for e in explain:
        e.pop("search_seconds")
    assert one == two and explain[0] == explain[1]


def test_report_has_tables_and_pictures(capsys, tmp_path):
    compile_cli(capsys, small_model(tmp_path / "m.onnx"), tmp_path / "out", "--quiet")
    out = tmp_path / "out"
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    pictures = sorted((out / "report").glob("*.svg"))
    kernels = sum(len(s["kernels"]) for s in json.loads((out / "explain.json").read_text())["subgraphs"])
    assert len(pictures) == 1 + 2 * kernels  # the partition; each kernel before and after rewriting
    for svg in pictures:
        assert f"(report/{svg.name})" in md and ET.fromstring(svg.read_text()).tag.endswith("svg")
        assert svg.read_text() in html
    assert "| subgraph | ops | kernels |" in md and "DRAM bound" in md and "| rule | applications |" in md


def test_output_folder_that_is_a_file_is_a_one_line_error(capsys, tmp_path):
    (tmp_path / "out").write_text("")
    code = main(["compile", small_model(tmp_path / "m.onnx"), "--target", TARGET, "-o", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "cannot write the outputs" in err and len(err.strip().splitlines()) == 1
