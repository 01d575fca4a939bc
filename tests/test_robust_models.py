"""Issue 22 items 3, 4, 5 and 7: unusual or bad models get a correct answer or one line naming
the model, node and tensor (exit 1 from the CLI, a FrontendError from load), never exit 4."""
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gir.cli import main
from gir.frontend import FrontendError, load
from gir.frontend import limits
from gir.runtime import Session

vi = helper.make_tensor_value_info


def model(nodes, inputs, outputs, inits=(), opset=18, name="m"):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def refused(capsys, tmp_path, m, match):
    """`gir run` ends in exit 1 with one line holding `match`, and load() raises the same."""
    path = tmp_path / "bad.onnx"
    onnx.save(m, path)
    code = main(["run", str(path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and match in err and err.startswith(f"gir: error: {path}"), err
    with pytest.raises(FrontendError, match=re.escape(match)):
        load(m)


# ---- item 5: bad models are bad input -------------------------------------------------------

def test_initializer_raw_data_longer_than_its_shape(capsys, tmp_path):
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.raw_data = np.ones(6, np.float32).tobytes()
    m = model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [vi("x", TensorProto.FLOAT, [4])],
              [vi("y", TensorProto.FLOAT, [4])], [w])
    refused(capsys, tmp_path, m, "initializer 'w' has 24 bytes of raw data, its shape [4] of FLOAT needs 16")


def test_conv_kernel_larger_than_padded_input(capsys, tmp_path):
    k = numpy_helper.from_array(np.ones((1, 1, 5, 5), np.float32), "k")
    m = model([helper.make_node("Conv", ["x", "k"], ["y"], name="conv", pads=[1, 1, 0, 0])],
              [vi("x", TensorProto.FLOAT, [1, 1, 3, 3])], [vi("y", TensorProto.FLOAT, ["a", "b", "c", "d"])], [k])
    refused(capsys, tmp_path, m, "node 'conv' (Conv, ai.onnx opset 18): kernel spans 5 on spatial axis 0, larger than the padded input (4")


def test_negative_dimension(capsys, tmp_path):
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", TensorProto.FLOAT, [2, -3])],
              [vi("y", TensorProto.FLOAT, [2, -3])])
    refused(capsys, tmp_path, m, "input 'x' has a negative dimension -3 at axis 1")


def test_reflect_padding_larger_than_the_dimension(capsys, tmp_path):
    pads = numpy_helper.from_array(np.array([0, 3, 0, 3], np.int64), "p")
    m = model([helper.make_node("Pad", ["x", "p"], ["y"], name="pad", mode="reflect")],
              [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, ["a", "b"])], [pads])
    refused(capsys, tmp_path, m, "node 'pad' (Pad, ai.onnx opset 18): reflect pads [0, 3, 0, 3] must be smaller")


def test_reflect_padding_up_to_the_dimension_still_works():
    pads = numpy_helper.from_array(np.array([0, 2, 0, 2], np.int64), "p")
    m = model([helper.make_node("Pad", ["x", "p"], ["y"], name="pad", mode="reflect")],
              [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 7])], [pads])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = Session(m, engine="interpreter").run(None, {"x": x})
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (2, 2)], mode="reflect"))


# ---- item 4: sizes --------------------------------------------------------------------------

def test_input_above_the_tensor_limit_is_refused_before_planning(capsys, tmp_path):
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", TensorProto.FLOAT, [2**31])],
              [vi("y", TensorProto.FLOAT, [2**31])])
    refused(capsys, tmp_path, m, f"graph input: tensor 'x' of shape [2147483648] has 2147483648 elements, above the limit of {limits.MAX_TENSOR_ELEMENTS}")


def test_huge_constant_of_shape_is_not_folded(capsys, tmp_path, monkeypatch):
    shape = numpy_helper.from_array(np.array([40000, 40000], np.int64), "shape")
    m = model([helper.make_node("ConstantOfShape", ["shape"], ["c"], name="fill"),
               helper.make_node("Add", ["x", "c"], ["y"], name="add")],
              [vi("x", TensorProto.FLOAT, [1])], [vi("y", TensorProto.FLOAT, ["a", "b"])], [shape])
    refused(capsys, tmp_path, m, "node 'fill' (ConstantOfShape, ai.onnx opset 18): tensor 'c' of shape [40000, 40000]")
    monkeypatch.setenv("GIR_MAX_TENSOR_ELEMENTS", str(2**31))  # the planning limit raised: the fold limit holds
    refused(capsys, tmp_path, m, "for a tensor folded at compile time ($GIR_MAX_FOLD_ELEMENTS raises it)")


def test_limits_are_settable(monkeypatch):
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", TensorProto.FLOAT, [4, 8])],
              [vi("y", TensorProto.FLOAT, [4, 8])])
    assert load(m).tensors["y"].shape == (4, 8)
    monkeypatch.setenv("GIR_MAX_TENSOR_ELEMENTS", "31")
    with pytest.raises(FrontendError, match="limit of 31"):
        load(m)
    monkeypatch.setenv("GIR_MAX_TENSOR_ELEMENTS", "lots")
    with pytest.raises(FrontendError, match="must be a whole number"):
        load(m)


def test_intermediate_above_the_limit_names_its_node(monkeypatch):
    """An intermediate GIR makes while decomposing (Expand's broadcast) is checked too."""
    shape = numpy_helper.from_array(np.array([8, 8], np.int64), "shape")
    m = model([helper.make_node("Expand", ["x", "shape"], ["e"], name="grow"), helper.make_node("Relu", ["e"], ["y"], name="r")],
              [vi("x", TensorProto.FLOAT, [1, 8])], [vi("y", TensorProto.FLOAT, [8, 8])], [shape])
    monkeypatch.setenv("GIR_MAX_TENSOR_ELEMENTS", "63")
    with pytest.raises(FrontendError, match="node 'grow' .*tensor 'e' of shape \\[8, 8\\] has 64 elements"):
        load(m)


def zero_size_cases():
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    yield "relu", [helper.make_node("Relu", ["x"], ["y"])], [0, 3], [0, 3], []
    for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceProd", "ReduceL2", "ReduceLogSumExp"):
        yield op, [helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)], [3, 0], [3], [axes]
    yield "softmax", [helper.make_node("Softmax", ["x"], ["y"], axis=1)], [0, 5], [0, 5], []
    yield "transpose", [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], [0, 3], [3, 0], []
    empty = [numpy_helper.from_array(np.ones(0, np.float32), n) for n in ("scale", "bias")]
    yield "instancenorm_no_channels", [helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"])], \
        [2, 0, 4, 4], [2, 0, 4, 4], empty


@pytest.mark.parametrize("case", list(zero_size_cases()), ids=lambda c: c[0])
@pytest.mark.parametrize("engine", ["native", "interpreter"])
def test_zero_size_tensors_match_onnxruntime(case, engine):
    """ONNX allows zero-size tensors; a reduction over an empty axis gives what onnxruntime gives
    (ReduceMean: ONNX says "undefined", onnxruntime gives 0, as GIR does)."""
    ort = pytest.importorskip("onnxruntime")
    _, nodes, shape, out_shape, inits = case
    m = model(nodes, [vi("x", TensorProto.FLOAT, shape)], [vi("y", TensorProto.FLOAT, out_shape)], inits)
    feeds = {"x": np.zeros(shape, np.float32)}
    expected = ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    (y,) = Session(m, target="cpu", engine=engine).run(None, feeds)
    assert y.shape == expected.shape
    np.testing.assert_array_equal(y, expected)


# ---- item 3: names --------------------------------------------------------------------------

def _relu_neg(x="x", t="t", y="y", relu="relu", neg="neg", graph="g"):
    return model([helper.make_node("Relu", [x], [t], name=relu), helper.make_node("Neg", [t], [y], name=neg)],
                 [vi(x, TensorProto.FLOAT, [2, 3])], [vi(y, TensorProto.FLOAT, [2, 3])], name=graph, opset=17)


@pytest.mark.parametrize("placeholder,where", [(b"NNNN", "node 0 (Relu): name"), (b"TTTT", "node 0 (Relu) output 0: name"),
                                               (b"YYYY", "graph output 0: name")])
def test_names_that_are_not_utf8_are_refused(capsys, tmp_path, placeholder, where):
    data = _relu_neg(t="TTTT", y="YYYY", relu="NNNN").SerializeToString().replace(placeholder, b"\xff\xfe\xc3Z")
    m = onnx.ModelProto.FromString(data)
    refused(capsys, tmp_path, m, f"{where} b'\\xff\\xfe\\xc3Z' is not valid UTF-8")


@pytest.mark.parametrize("target", ["cpu", "cuda:sm_90", "hip:gfx90a"])
def test_hostile_names_compile_and_run(capsys, tmp_path, target):
    """NUL, newline, backslash and comment markers in names reach the emitted source only in
    comments, which are made safe: the kernel compiles (NVRTC reads a C string) and runs."""
    m = _relu_neg(x="x\0a", t="t*/\\", y="y", relu="r\0*/\n#x", neg="n\\", graph="g\0")
    path = tmp_path / "names.onnx"
    onnx.save(m, path)
    code = main(["compile", str(path), "--target", target, "-o", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    if code == 3:
        pytest.skip(err)
    assert code == 0, err
    if target == "cpu":
        x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
        (y,) = Session(m, target="cpu").run(None, {"x\0a": x})
        np.testing.assert_array_equal(y, -np.maximum(x, 0))


# ---- item 7: gather indices are checked on every engine -------------------------------------

def _embedding(computed: bool):
    """Gather rows of a [5, 4] table by int64 indices: the graph input itself (host check) or
    indices computed in the model (input + 1: the kernel's flag)."""
    table = numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(5, 4), "table")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [helper.make_node("Add", ["ids", "one"], ["shifted"], name="shift")] if computed else []
    nodes.append(helper.make_node("Gather", ["table", "shifted" if computed else "ids"], ["y"], name="lookup", axis=0))
    return model(nodes, [vi("ids", TensorProto.INT64, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3, 4])], [table, one])


@pytest.mark.parametrize("computed", [False, True], ids=["input_indices", "computed_indices"])
@pytest.mark.parametrize("engine", ["native", "interpreter"])
def test_out_of_range_gather_index_names_the_node(engine, computed):
    from gir.runtime.indices import GatherIndexError
    session = Session(_embedding(computed), target="cpu", engine=engine)
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    ok = np.array([[0, 1, 2], [-1, -5, 3]], np.int64) - int(computed)  # negative ones wrap (ONNX)
    (y,) = session.run(None, {"ids": ok})
    np.testing.assert_array_equal(y, table[ok + int(computed)])
    for bad in (5, -6, 10**6):
        ids = ok.copy()
        ids[1, 2] = bad - int(computed)
        with pytest.raises(GatherIndexError, match="m: .*node 'lookup' \\(Gather"):
            session.run(None, {"ids": ids})
    (y,) = session.run(None, {"ids": ok})  # a failed run leaves the session usable
    np.testing.assert_array_equal(y, table[ok + int(computed)])


def test_gir_run_reports_an_out_of_range_index_as_bad_input(capsys, tmp_path):
    onnx.save(_embedding(False), tmp_path / "m.onnx")
    np.savez(tmp_path / "ids.npz", ids=np.full((2, 3), 10**6, np.int64))
    code = main(["run", str(tmp_path / "m.onnx"), "--quiet", "--inputs", str(tmp_path / "ids.npz")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "node 'lookup'" in err and "index 1000000" in err, err
