"""The `taps` tiling (gir/templates/common.py Box.outer_units): a whole small window per unit,
the units of a block along the outputs, so that a window product and its one-output-per-unit
reduction fuse into blocks of several warps instead of one. Checked on GPU targets: the plan's
window kernels launch 128 threads or more, and the emitted CUDA and HIP kernels, run on the CPU
harness through the device engine's recording stand-in, match onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest

import gir
from gir.backends.harness.recording import RecordingLauncher, harness_toolchain
from gir.frontend.loader import load
from gir.fusion.plan import plan
from gir.ir import get_target
from gir.backends import device_engine as device

from test_cpu_across_units import window_model

CASES = [
    ("Conv", (1, 8, 12, 16), (3, 3), dict(group=8, pads=[1, 1, 1, 1])),
    ("Conv", (1, 4, 15, 16), (5, 5), dict(group=4, pads=[2, 2, 2, 2], strides=[1, 2])),
    ("MaxPool", (1, 4, 12, 16), (3, 3), dict(pads=[1, 1, 1, 1])),
    ("Conv", (1, 3, 16, 18), (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2], out_channels=8)),  # a dense RGB stem
]


def _gir_only(target: str):
    """The target without its library-call model: these full-size convs would otherwise go back
    to cuDNN / hipBLAS by the partition's time check (tests/test_library_by_time.py), and what is
    checked here is the GIR kernel they lower to."""
    from dataclasses import replace
    t = get_target(target)
    return replace(t, extra={k: v for k, v in t.extra.items() if k != "library_calls"})


def _model(case):
    op, shape, kernel, attrs = case
    attrs = dict(attrs)
    return window_model(op, shape, kernel, group=attrs.pop("group", 1), **attrs)


@pytest.mark.parametrize("target", ["cuda:sm_90", "hip:gfx90a"])
def test_depthwise_conv_fuses_into_blocks_of_several_warps(target):
    """The EfficientNet-B0 shape: its fused conv + SiLU kernel had 32-thread blocks."""
    p = plan(load(window_model("Conv", (1, 144, 56, 56), (3, 3), group=144, pads=[1, 1, 1, 1])), _gir_only(target))
    (kernel,) = p.kernels
    t = get_target(target)
    assert kernel.graph.prim.units_per_block * t.lanes_per_unit >= 128
    assert kernel.estimate.dram_bytes == 2 * 144 * 56 * 56 * 4 + 144 * 10 * 4  # x read, y written, weights and bias


@pytest.mark.parametrize("target", ["cuda:sm_90", "hip:gfx90a"])
def test_a_dense_stem_conv_fuses_into_blocks_of_several_warps(target):
    """EfficientNet-B0's RGB stem (27 taps over 3 channels a unit): it had one-warp blocks."""
    model = window_model("Conv", (1, 3, 224, 224), (3, 3), out_channels=32, pads=[1, 1, 1, 1], strides=[2, 2])
    (kernel,) = plan(load(model), _gir_only(target)).kernels
    assert kernel.graph.prim.units_per_block * get_target(target).lanes_per_unit >= 128
    assert kernel.estimate.dram_bytes == (3 * 224 * 224 + 32 * 112 * 112 + 32 * 28) * 4  # x, y, weights and bias


@pytest.mark.parametrize("backend,target", [("cuda", "cuda:sm_90"), ("hip", "hip:gfx90a")])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}{c[2][0]}x{c[2][1]}")
def test_window_kernels_match_onnxruntime_on_the_harness(monkeypatch, tmp_path, backend, target, case):
    launcher = RecordingLauncher(dialect=backend)
    monkeypatch.setattr(device, "open_launcher", lambda b: launcher)
    monkeypatch.setattr(device, "_toolchain", harness_toolchain)
    model = _model(case)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    x = np.random.default_rng(9).standard_normal(case[1]).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    session = gir.Session(str(path), target=target)
    got = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
