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
