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
