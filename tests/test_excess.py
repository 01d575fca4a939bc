"""Where the DRAM bytes above the compulsory bound go: each tensor that crosses DRAM between
kernels is named with what kept its writer and reader apart, and the amounts add up exactly."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from gir.frontend import load
from gir.fusion.excess import COPY, DEVICE_SYNC, NO_STRUCTURE, SLOWER
from gir.fusion.plan import plan
from gir.ir import get_target


def _model(nodes, inits, shape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "m", [x], [y], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def _excess(model, target):
    p = plan(load(model), get_target(target), limit=2)
    for s in p.subgraphs:
        assert sum(e.bytes for e in s.excess) == s.gir_bytes - s.bound_bytes
    return {e.tensor: e for s in p.subgraphs for e in s.excess}


@pytest.mark.parametrize("target", ["a100", "mi250x"])
def test_a_conv_window_over_the_previous_convs_output_is_named_with_its_reader(target):
    """Two stacked depthwise 3x3 convs: the second reads the first's ReLU output through its
    window, so the output goes through DRAM (written once, read once) and that is all the
    excess. The grouping that fuses them keeps a device sync inside one kernel and moves the
    same bytes, so which of the two the time model keeps is a near tie: the excess names the
    device sync when it kept that one, the other grouping when it did not."""
    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array(rng.standard_normal((16, 1, 3, 3)).astype(np.float32), f"w{i}") for i in range(2)]
    model = _model([helper.make_node("Conv", ["x", "w0"], ["c"], kernel_shape=[3, 3], pads=[1] * 4, group=16),
                    helper.make_node("Relu", ["c"], ["r"]),
                    helper.make_node("Conv", ["r", "w1"], ["y"], kernel_shape=[3, 3], pads=[1] * 4, group=16)],
                   w, [1, 16, 20, 21])
    excess = _excess(model, target)
    assert set(excess) == {"r"}
    e = excess["r"]
    assert e.bytes == 2 * 16 * 20 * 21 * 4 and e.reason in (SLOWER, DEVICE_SYNC)
    assert "Conv" in e.detail and "through a layout" in e.detail


def test_a_global_reduction_splits_at_a_device_sync_and_its_input_crosses_dram():
    """x - mean(relu(x)) over the whole tensor: the partial sums cross the device sync inside
    the reducing kernel, and relu(x), needed again after the mean, crosses between kernels."""
    model = _model([helper.make_node("Relu", ["x"], ["r"]),
                    helper.make_node("ReduceMean", ["r"], ["m"], keepdims=1),
                    helper.make_node("Sub", ["r", "m"], ["y"])], [], [64, 1000])
    excess = _excess(model, "h100")
    assert excess["r"].bytes == 2 * 64 * 1000 * 4 and excess["r"].reason == NO_STRUCTURE
    partial = [e for e in excess.values() if e.reason == DEVICE_SYNC]
    assert partial and all("after the sync" in e.detail for e in partial)


def test_zoo_model_excess_adds_up_and_names_the_shuffle_copies():
    """ShuffleNetV2 (tiny) on H100: every subgraph's excess adds up to GIR minus bound, and the
    channel shuffle's standalone copies are among the reasons."""
    excess = _excess(models.load_bundled("shufflenet_v2"), "h100")
    assert any(e.reason == COPY for e in excess.values())
