"""Issue 22 item 6: external data is validated once, first, for every way in (explain, run,
compile, Session, gir.backend): a relative path to a regular file inside the model's folder,
offset and length inside it; nothing outside the folder, no FIFO, no device is ever opened.

Every abuse case is refused with exit 1 and one line naming the model, tensor and location.
A FIFO that were opened would block the test: an alarm turns that into a failure instead."""
import os
import signal

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gir.cli import main
from gir.frontend import FrontendError
from gir.frontend.external_data import load_model, read_model_file
from gir.model_digest import model_digest
from gir.runtime import Session

W = np.arange(6, dtype=np.float32).reshape(2, 3)


def external_model(folder, location, offset=None, length=None, name="m.onnx") -> str:
    """y = x + w, where w (float32 [2, 3]) keeps its data at `location`."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            w.external_data.add(key=key, value=str(value))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add")], "ext", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (tmp_path / "outside.bin").write_bytes(W.tobytes())
    return d


@pytest.fixture(autouse=True)
def no_hang():
    """A regression that opens a FIFO blocks forever: fail after 60 s instead."""
    def stop(*_):
        raise TimeoutError("blocked: something opened a FIFO or read a device")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _fifo(folder):
    os.mkfifo(folder / "fifo.bin")
    return "fifo.bin"


def _symlink(folder, target):
    os.symlink(target, folder / "link.bin")
    return "link.bin"


# (case id, how to make the location in `folder`, words the one-line error holds)
ABUSE = [
    ("traversal", lambda d: "../outside.bin", "outside the model's folder"),
    ("deep_traversal", lambda d: "../../../../../../../../etc/passwd", "outside the model's folder"),
    ("absolute", lambda d: "/etc/passwd", "absolute path"),
    ("symlink_out", lambda d: _symlink(d, d.parent / "outside.bin"), "outside the model's folder"),
    ("symlink_etc", lambda d: _symlink(d, "/etc/passwd"), "outside the model's folder"),
    ("fifo", _fifo, "FIFO"),
    ("dev_zero", lambda d: "/dev/zero", "absolute path"),
    ("symlink_dev_zero", lambda d: _symlink(d, "/dev/zero"), "outside the model's folder"),
    ("proc_self_mem", lambda d: "/proc/self/mem", "absolute path"),
    ("symlink_proc_self_mem", lambda d: _symlink(d, "/proc/self/mem"), "outside the model's folder"),
    ("missing", lambda d: "nothing.bin", "no such file"),
    ("folder_itself", lambda d: ".", "outside the model's folder"),
    ("subfolder", lambda d: (d / "sub").mkdir() or "sub", "not a regular file"),
    ("nul_byte", lambda d: "w.bin\0../../etc/passwd", "NUL byte"),
    ("symlink_loop", lambda d: os.symlink("loop.bin", d / "loop.bin") or "loop.bin", "cannot stat"),
]


def abuse_model(folder, case) -> tuple[str, str]:
    _, make, words = next(c for c in ABUSE if c[0] == case)
    return external_model(folder, make(folder)), words


def _cli(capsys, *argv):
    code = main(list(argv))
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    return code, lines


@pytest.mark.parametrize("case", [c[0] for c in ABUSE])
@pytest.mark.parametrize("command", ["explain", "run", "compile"])
def test_cli_refuses_abuse(capsys, folder, tmp_path, case, command):
    path, words = abuse_model(folder, case)
    extra = {"explain": ["--target", "cpu"], "run": ["--target", "cpu"],
             "compile": ["--target", "cpu", "-o", str(tmp_path / "out")]}[command]
    code, lines = _cli(capsys, command, path, *extra)
    assert code == 1, lines
    assert len(lines) == 1 and words in lines[0], lines
    assert path in lines[0] and "initializer 'w'" in lines[0] and "Traceback" not in lines[0], lines


@pytest.mark.parametrize("case", [c[0] for c in ABUSE])
def test_session_refuses_abuse(folder, case):
    path, words = abuse_model(folder, case)
    with pytest.raises(FrontendError, match=words):
        Session(path, target="cpu", engine="interpreter")


@pytest.mark.parametrize("offset,length,words", [
    (0, 25, "beyond the end of the file"),
    (25, None, "beyond the end of the file"),
    (4, 24, "beyond the end of the file"),
    (0, 20, "needs 24"),
    (-1, 24, "negative"),
    ("x", 24, "not a whole number"),
    (0, 10**30, "beyond the end of the file"),
])
def test_offset_and_length_inside_the_file(capsys, folder, offset, length, words):
    (folder / "w.bin").write_bytes(W.tobytes())
    path = external_model(folder, "w.bin", offset, length)
    code, lines = _cli(capsys, "explain", path, "--target", "cpu")
    assert code == 1 and len(lines) == 1 and words in lines[0] and "w.bin" in lines[0], lines


def test_model_file_that_is_a_fifo_or_device_is_refused(capsys, folder):
    os.mkfifo(folder / "model.onnx")
    for path in (str(folder / "model.onnx"), "/dev/zero"):
        for command in ("explain", "compile"):
            code, lines = _cli(capsys, command, path, "--target", "cpu", *(["-o", str(folder / "o")]
                                                                            if command == "compile" else []))
            assert code == 1 and len(lines) == 1 and "not a regular file" in lines[0], lines


def test_valid_external_data_runs_everywhere(capsys, folder, tmp_path):
    """Inside the folder, in a subfolder, through a symlink that stays inside, at an offset."""
    (folder / "sub").mkdir()
    (folder / "sub" / "w.bin").write_bytes(b"\x01" * 8 + W.tobytes() + b"\x02" * 4)
    os.symlink("sub/w.bin", folder / "link.bin")
    x = np.ones((2, 3), np.float32)
    for i, location in enumerate(["sub/w.bin", "link.bin", "sub/../sub/w.bin"]):
        path = external_model(folder, location, offset=8, length=24, name=f"m{i}.onnx")
        (y,) = Session(path, target="cpu", engine="interpreter").run(None, {"x": x})
        np.testing.assert_array_equal(y, x + W)
        assert _cli(capsys, "explain", path, "--target", "cpu")[0] == 0
    assert _cli(capsys, "compile", path, "--target", "cpu", "-o", str(tmp_path / "out"))[0] == 0


def test_digest_validates_before_reading(folder):
    path, _ = abuse_model(folder, "fifo")
    with pytest.raises(FrontendError, match="FIFO"):
        model_digest(path)
    (folder / "w.bin").write_bytes(W.tobytes())
    good = external_model(folder, "w.bin", name="good.onnx")
    assert model_digest(good) is not None


def test_model_proto_with_unresolved_external_data_is_refused(folder):
    """A ModelProto has no folder: reading its locations relative to the working directory
    would be reading whatever happens to be there."""
    (folder / "w.bin").write_bytes(W.tobytes())
    proto, ranges = read_model_file(external_model(folder, "w.bin"))
    assert [r.location for _, r in ranges] == ["w.bin"]
    with pytest.raises(FrontendError, match="has no folder"):
        Session(proto, target="cpu", engine="interpreter")
    import gir.backend
    with pytest.raises(FrontendError, match="has no folder"):
        gir.backend.prepare(proto)
    full = load_model(external_model(folder, "w.bin"))
    rep = gir.backend.prepare(full)
    (y,) = rep.run([np.zeros((2, 3), np.float32)])
    np.testing.assert_array_equal(y, W)


def test_external_data_in_a_constant_attribute_is_validated(capsys, folder):
    """Tensors in node attributes are external data too (Constant's value)."""
    value = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[2, 3])
    value.data_location = TensorProto.EXTERNAL
    value.external_data.add(key="location", value="/etc/passwd")
    node = helper.make_node("Constant", [], ["y"], name="const", value=value)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(helper.make_graph([node], "c", [], [y]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = folder / "c.onnx"
    path.write_bytes(model.SerializeToString())
    code, lines = _cli(capsys, "explain", str(path), "--target", "cpu")
    assert code == 1 and len(lines) == 1 and "node 'const' attribute 'value'" in lines[0], lines
