"""The GPU result scripts' own logic, without a GPU: scripts/gpu_model_check.py matches measured
kernels to the re-planned model by name and launch shapes (a kernel the model now gives another
structure is left out, not compared), and scripts/gpu_static.py --kernels reports a kernel's
launch shape, access widths and ptxas registers. SAR-DRN: six kernels, planned in seconds."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name):
    sys.path.insert(0, str(SCRIPTS))  # the scripts import their neighbours (bench, perf_model_rank)
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def steps():
    return _script("gpu_model_check").modelled_steps("sardrn", "cuda:sm_90", 1)


def test_model_check_leaves_out_restructured_and_unknown_kernels(steps):
    check = _script("gpu_model_check")
    (first, (_, _, _, shapes)), (second, _) = list(steps.items())[:2]
    kernels = [{"kernel": first, "seconds": 1e-5, "shapes": shapes},
               {"kernel": second, "seconds": 2e-5, "shapes": [[1, 32]]},  # not the shape planned now
               {"kernel": "no such kernel", "seconds": 3e-5}]
    measured = {"options": {"target": "cuda:sm_90", "limit": 1}, "gpu": {"device": "test", "copy_bytes_per_s": 1e12},
                "models": [{"model": "sardrn", "gpu": {"kernels": kernels}}]}
    check.modelled_steps = lambda name, target, limit: steps  # planned once, by the fixture
    rows = check.compare(measured)["rows"]
    assert [r.get("unmatched", False) for r in rows] == [False, True, True]
    assert rows[1].get("restructured") and not rows[2].get("restructured")
    assert rows[0]["modelled_s"] == steps[first][0] and rows[0]["measured_s"] == 1e-5


def test_static_kernel_facts_name_launch_widths_and_registers(steps):
    static = _script("gpu_static")
    name = next(iter(steps))
    line = static.kernel_facts(f"sardrn:{name}", "cuda:sm_90", 1)
    assert line.startswith("sardrn ") and "launches (blocks, threads) [(" in line
    assert "DRAM access widths" in line and "registers [" in line and "None" not in line.split("registers")[1].split("]")[0]
    with pytest.raises(SystemExit, match="no planned kernel"):
        static.kernel_facts("sardrn:/no/such/kernel", "cuda:sm_90", 1)


def test_a_kernel_missing_the_launch_bar_is_described_by_its_tiling():
    """BERT's Add + LayerNorm over 128 rows on hip:gfx90a: one row a unit (64 lanes), eight units
    a block, 16 blocks. The report gives the 128-thread blocks that tiling could make (64: two
    units each), under the two per CU the bar asks of the MI250X's 110 CUs."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from gir.frontend import load
    from gir.fusion.plan import plan
    from gir.ir import get_target
    static = _script("gpu_static")
    f = TensorProto.FLOAT
    gamma, beta = (numpy_helper.from_array(np.full(768, v, np.float32), n) for n, v in (("g", 1.0), ("b", 0.0)))
    nodes = [helper.make_node("Add", ["x", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-12)]
    io = lambda n: helper.make_tensor_value_info(n, f, [1, 128, 768])  # noqa: E731
    model = helper.make_model(helper.make_graph(nodes, "add_ln", [io("x"), io("r")], [io("y")], [gamma, beta]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    t = get_target("hip:gfx90a")
    (k,) = plan(load(model), t, limit=2).kernels
    shape = dict(static._launch_shape(k, t))
    prim = k.graph.prim
    assert shape["blocks"] == prim.num_blocks and shape["threads"] == prim.units_per_block * 64
    assert shape["units"] == prim.num_units and shape["blocks_of_128"] == prim.num_units // 2
    assert shape["bound"] == k.estimate.bound and shape["mb"] == round(k.estimate.dram_bytes / 1e6, 2)
    assert shape["op"] and "/" not in shape["op"][:1]
    assert shape["blocks"] < 2 * t.processors and shape["blocks_of_128"] < 2 * t.processors


def test_bench_gpu_times_both_sides_of_the_time_check(monkeypatch, tmp_path):
    """scripts/bench_gpu.py on the recording stand-in of a GPU (kernels on the CPU harness, a clock
    in place of CUDA events): `--plan-only` fills the plan cache that the measured sessions then
    read, every library call is timed against its modelled call, and the conv the time check
    gave back is timed as the GIR kernel of the ridge rule's plan against its library call."""
    import time

    import numpy as np
    from test_library_by_time import _conv_relu

    from gir.backends import device_engine as device
    from gir.backends.harness.recording import RecordingLauncher, harness_toolchain
    from gir.fusion.plan import library_margin
    from gir.ir import get_target

    bench_gpu, bench, check = _script("bench_gpu"), _script("bench"), _script("time_check_gpu")
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(device, "open_launcher", lambda backend: RecordingLauncher())
    monkeypatch.setattr(device, "_toolchain", harness_toolchain)
    monkeypatch.setattr(bench_gpu, "KERNEL_RUNS", 1)
    monkeypatch.setattr(bench_gpu, "WARMUP", 0)
    monkeypatch.setattr(check, "LIBRARY_RUNS", 1)

    class Clock(bench_gpu.Gpu):
        def __init__(self):
            self.runs, self.torch_compile, self.name, self.l2_bytes, self.copy_bytes_per_s = 1, False, "harness", 1 << 20, 1e12
            self.flushes = 0

        def event_seconds(self, fn, stream=None, before=None):
            before and before()
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start

        def flush_l2(self):
            self.flushes += 1

        def launcher_stream(self, launcher):
            return None

        def torch_latencies(self, model, feeds, reference):
            return {"torch_note": "no torch here"}

    # 128 output channels: with 64, its GIR kernels in 128-thread blocks model under the call
    model = _conv_relu(channels_out=128, size=32)
    assert bench_gpu.plan_only(model, "h100", 1) == 1
    planned = sorted(p.name for p in (tmp_path / "plan").rglob("*") if p.is_file())
    assert planned and not (tmp_path / "session").exists()  # kernels cached, no whole sessions (weights)
    gpu = Clock()
    x = np.random.default_rng(0).standard_normal((1, 1, 32, 32)).astype(np.float32)
    got = gpu.measure(model, {"x": x}, "h100", 1)
    assert sorted(p.name for p in (tmp_path / "plan").rglob("*") if p.is_file()) == planned  # read back, not searched
    assert got["given_back"] == 1 and got["gir_max_rel_err"] < 1e-5 and got["gir_ridge_only_max_rel_err"] < 1e-5
    (call,) = got["library_calls"]
    assert call["ops"] == ["conv"] and call["kind"] == "conv" and call["given_back"] and gpu.flushes >= 1
    assert call["seconds"] > 0 and 0 < call["modelled_call_s"] < call["modelled_call_s"] + call["round_trip_s"]
    (row,) = got["time_checks"]
    assert row["ops"] == ["conv"] and len(row["kernels"]) == 1 and row["gir_s"] > 0
    assert row["gir_modelled_s"] > library_margin(get_target("h100")) * row["library_modelled_s"]
    assert row["library_call_s"] == call["seconds"]
    text = check.report([{"model": "conv_relu", "gpu": got}], bench.markdown_table)
    assert "| conv_relu | `conv` | 1 | conv | conv |" in text and "| conv_relu | `conv` | 1 | 1 |" in text


def test_library_calls_of_one_shape_are_timed_once():
    """BERT's twelve query projections run one cuBLASLt plan: one timing, whatever ops each
    call's epilogue absorbed (named per layer), but a different epilogue is another call."""
    from types import SimpleNamespace

    from gir.frontend.basic import BasicOp
    check = _script("time_check_gpu")
    t = {n: SimpleNamespace(shape=s, dtype="float32") for n, s in
         (("x", (128, 768)), ("w", (768, 768)), ("b", (768,)), ("y", (128, 768)), ("z", (128, 768)))}
    graph = SimpleNamespace(tensors=t)

    def matmul(name, out, epilogue, absorbed):
        return BasicOp(name, "matmul", ["x", "w", "b"], [out], {"bias": True, "epilogue": epilogue,
                                                                "absorbed": absorbed}, name)
    q0 = matmul("l0/q", "y", (), (("bias", ("l0/q/add",)),))
    q1 = matmul("l1/q", "z", (), (("bias", ("l1/q/add",)),))
    relu = matmul("l1/fc", "z", (("relu", 0.0, 0.0),), (("bias", ("l1/fc/add",)),))
    assert check._signature(q0, graph) == check._signature(q1, graph) != check._signature(relu, graph)


def test_a_model_file_planned_elsewhere_is_read_back_whole(monkeypatch, tmp_path):
    """`bench_gpu.py --plan-only --model-dir`: sessions opened from a model file leave whole
    entries in the session cache, which a session on the GPU machine, opened from another file
    of the same bytes, reads back without planning."""
    from test_library_by_time import _conv_relu

    bench_gpu = _script("bench_gpu")
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    model = _conv_relu(channels_out=128, size=32)  # given back by the time check (see above)
    path = bench_gpu.saved(model, "conv_relu", str(tmp_path / "here"))
    assert bench_gpu.plan_only(path, "h100", 1) == 1
    assert len(list((tmp_path / "cache" / "session").glob("*.pkl"))) == 2  # the time check's plan, the ridge rule's
    elsewhere = bench_gpu.saved(model, "conv_relu", str(tmp_path / "there"))  # the GPU machine's copy
    assert bench_gpu.open_session(elsewhere, "h100", 1, engine="interpreter").cached
    with bench_gpu.ridge_rule_alone():
        assert bench_gpu.open_session(elsewhere, "h100", 1, engine="interpreter").cached


def test_model_check_as_planned_takes_the_stored_modelled_times():
    """`gpu_model_check.py --as-planned`: the modelled time each measured kernel was planned with
    (bench_gpu.py stores it), no re-plan, so the model of the tree that ran is the one judged."""
    check = _script("gpu_model_check")
    kernels = [{"kernel": "a", "seconds": 2e-5, "modelled_s": 1e-5, "bytes": 10**6},
               {"kernel": "b", "seconds": 3e-5, "modelled_s": 4e-5, "bytes": 2 * 10**6}]
    measured = {"options": {"target": "cuda:sm_90", "limit": 2}, "gpu": {"device": "test", "copy_bytes_per_s": 1e12},
                "models": [{"model": "any", "gpu": {"kernels": kernels}}]}
    rows = check.compare(measured, as_planned=True)["rows"]
    assert [(r["kernel"], r["modelled_s"], r["measured_s"]) for r in rows] == [("a", 1e-5, 2e-5), ("b", 4e-5, 3e-5)]
