"""Reading an ONNX file and its external data safely: every external-data location is validated
before any byte of it is read, by every way in (explain, run, compile, Session, gir.backend).

Why not onnx.load: it opens the locations a model names as they come, so a hostile model can
make GIR read `../../etc/passwd`, an absolute path, `/proc/self/mem`, a symlink that leads out
of the model's folder, block forever on a FIFO, or read `/dev/zero` until memory runs out.

The rules, checked with stat calls only (nothing is opened until all of a model's locations
pass): a location is a relative path, without NUL bytes, naming a regular file inside the
model's folder once symlinks are resolved; its offset and length lie inside that file and the
length is what the tensor's shape and type need. Reading then opens each file with
O_NOFOLLOW | O_NONBLOCK and checks, with fstat on the open descriptor, that it is the very file
validated (a file swapped in between is refused, never read). The model file itself must be a
regular file (a FIFO or a device given as the model is refused without being opened for reading
data that never ends).

A model handed over as an onnx.ModelProto has no folder: one whose tensors still point at
external data is refused (load it with onnx.load, or pass its path).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Iterator

import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from .errors import FrontendError, one_line

_KEYS = ("location", "offset", "length", "checksum", "basepath")


@dataclass(frozen=True)
class ExternalRange:
    """One validated piece of external data: `tensor` (what to name in errors) reads `length`
    bytes at `offset` of the regular file `path` (resolved, inside the model's folder), whose
    identity (device, inode) was recorded when it was validated."""
    tensor: str
    location: str
    path: str
    offset: int
    length: int
    identity: tuple[int, int]


def read_model_file(path: str) -> tuple[onnx.ModelProto, list[tuple[onnx.TensorProto, ExternalRange]]]:
    """The model at `path` parsed without its external data, and each tensor that stores its data
    externally with its validated range. Raises FrontendError (one line) for anything wrong."""
    label = path
    data = read_regular_file(path, label)
    try:
        proto = onnx.load_model_from_string(data)
    except DecodeError as e:
        raise FrontendError(f"{label}: not a valid ONNX file: the protobuf does not parse "
                            f"(truncated, or not an ONNX model): {one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - protobuf's other parse failures
        raise FrontendError(f"{label}: cannot read ONNX file: {type(e).__name__}: {one_line(e)}") from None
    folder = os.path.dirname(os.path.abspath(path))
    return proto, validate(proto, folder, label)


def load_model(path: str) -> onnx.ModelProto:
    """The model at `path` with its external data read in, after every location was validated."""
    proto, ranges = read_model_file(path)
    for tensor, where in ranges:
        tensor.raw_data = read_range(where, path)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return proto


def refuse_unresolved(proto: onnx.ModelProto, label: str) -> None:
    """A ModelProto whose tensors still name external data: there is no folder to read it from."""
    for what, tensor in external_tensors(proto):
        location = _entries(tensor, label, what).get("location", "")
        raise FrontendError(f"{label}: {what} keeps its data in external file {location!r}, and a model passed "
                            f"as an onnx.ModelProto has no folder to read it from: pass the model's path")


def external_digest(path: str, digest) -> None:
    """Add every external range of the model at `path` to `digest` (a hashlib object), validated
    first; raises FrontendError when a location is refused."""
    _, ranges = read_model_file(path)
    for _, where in ranges:
        digest.update(b"\0" + where.location.encode() + b"\0%d\0%d\0" % (where.offset, where.length))
        digest.update(read_range(where, path))


def read_regular_file(path: str, label: str) -> bytes:
    """The bytes of `path`, which must be a regular file: a FIFO, a device or a folder is refused
    before it is opened (opening a FIFO blocks; a device may never end)."""
    st = _stat(path, label, "the model file")
    if stat.S_ISDIR(st.st_mode):
        raise FrontendError(f"{label}: is a directory, not an ONNX file")
    if not stat.S_ISREG(st.st_mode):
        raise FrontendError(f"{label}: is not a regular file ({_kind(st.st_mode)}); GIR reads ONNX models from "
                            f"regular files only")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise FrontendError(f"{label}: cannot read ONNX file: {e.strerror or e}") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise FrontendError(f"{label}: the file changed while it was being opened; refused")
        return _read_exactly(fd, 0, opened.st_size, label)
    finally:
        os.close(fd)


def read_range(where: ExternalRange, label: str) -> bytes:
    """The bytes of a validated range, read through a descriptor checked to be the validated file."""
    what = f"{label}: {where.tensor}: external data {where.location!r}"
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(where.path, flags)
    except OSError as e:
        raise FrontendError(f"{what}: cannot open it: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != where.identity:
            raise FrontendError(f"{what}: the file changed after it was validated; refused")
        if where.offset + where.length > st.st_size:
            raise FrontendError(f"{what}: the file shrank to {st.st_size} bytes after it was validated")
        return _read_exactly(fd, where.offset, where.length, what)
    finally:
        os.close(fd)


# ---- validation ---------------------------------------------------------------------------

def validate(proto: onnx.ModelProto, folder: str, label: str) -> list[tuple[onnx.TensorProto, ExternalRange]]:
    """Every tensor of `proto` that keeps its data externally, with its range, checked against
    the rules in the module docstring (stat calls only: nothing is opened)."""
    out = []
    root = None
    for what, tensor in external_tensors(proto):
        if root is None:
            root = os.path.realpath(folder)
        out.append((tensor, _validate_one(tensor, what, root, folder, label)))
    return out


def external_tensors(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """(how to name it, tensor) for every tensor of the model that stores its data externally:
    initializers, sparse initializers, node attributes, in subgraphs and functions too."""
    for what, tensor in _tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            yield what, tensor


def _tensors(proto: onnx.ModelProto):
    yield from _graph_tensors(proto.graph, "")
    for f in proto.functions:
        yield from _node_tensors(f.node, f"function '{f.name}' ")


def _graph_tensors(graph: onnx.GraphProto, prefix: str):
    for t in graph.initializer:
        yield f"{prefix}initializer '{t.name}'", t
    for s in graph.sparse_initializer:
        yield f"{prefix}sparse initializer '{s.values.name}' values", s.values
        yield f"{prefix}sparse initializer '{s.values.name}' indices", s.indices
    yield from _node_tensors(graph.node, prefix)


def _node_tensors(nodes, prefix: str):
    for i, node in enumerate(nodes):
        where = f"{prefix}node '{node.name or f'{node.op_type}_{i}'}'"
        for a in node.attribute:
            at = f"{where} attribute '{a.name}'"
            if a.HasField("t"):
                yield at, a.t
            for j, t in enumerate(a.tensors):
                yield f"{at}[{j}]", t
            for s in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
                yield f"{at} values", s.values
                yield f"{at} indices", s.indices
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _graph_tensors(g, f"{at} subgraph: ")


def _entries(tensor: onnx.TensorProto, label: str, what: str) -> dict[str, str]:
    entries = {}
    for e in tensor.external_data:
        key, value = e.key, e.value
        if isinstance(key, bytes) or isinstance(value, bytes):
            raise FrontendError(f"{label}: {what}: external data entry {key!r} = {value!r} is not valid UTF-8")
        if key not in _KEYS:
            raise FrontendError(f"{label}: {what}: unknown external data key {key!r} (ONNX defines "
                                f"{', '.join(_KEYS)})")
        entries[key] = value
    return entries


def _validate_one(tensor, what: str, root: str, folder: str, label: str) -> ExternalRange:
    entries = _entries(tensor, label, what)
    location = entries.get("location", "")
    head = f"{label}: {what}: external data location {location!r}"
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        raise FrontendError(f"{head}: the tensor has external data entries but its data_location is not EXTERNAL")
    if not location:
        raise FrontendError(f"{label}: {what}: stored as external data without a location")
    if "\0" in location:
        raise FrontendError(f"{head}: contains a NUL byte")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise FrontendError(f"{head}: is an absolute path; external data must be a file inside the model's "
                            f"folder, named relative to it")
    if entries.get("basepath"):
        raise FrontendError(f"{head}: has a basepath {entries['basepath']!r}; GIR reads external data relative "
                            f"to the model's folder only")
    joined = os.path.join(folder, location)
    try:
        real = os.path.realpath(joined)
    except (OSError, ValueError) as e:
        raise FrontendError(f"{head}: cannot resolve it: {one_line(e)}") from None
    if real == root or os.path.commonpath([real, root]) != root:
        raise FrontendError(f"{head}: leads outside the model's folder {folder} (to {real}); refused")
    st = _stat(real, head, "it")
    if not stat.S_ISREG(st.st_mode):
        raise FrontendError(f"{head}: is not a regular file ({_kind(st.st_mode)}); refused")
    offset = _whole(entries.get("offset", "0"), head, "offset")
    if offset > st.st_size:
        raise FrontendError(f"{head}: offset {offset} is beyond the end of the file ({st.st_size} bytes)")
    length = _whole(entries["length"], head, "length") if "length" in entries else st.st_size - offset
    if offset + length > st.st_size:
        raise FrontendError(f"{head}: offset {offset} + length {length} is beyond the end of the file "
                            f"({st.st_size} bytes)")
    _check_length(tensor, length, head)
    return ExternalRange(what, location, real, offset, length, (st.st_dev, st.st_ino))


def _check_length(tensor: onnx.TensorProto, length: int, head: str) -> None:
    """The bytes a tensor's shape and type need, so a wrong length is refused before reading it."""
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        raise FrontendError(f"{head}: a {'string' if tensor.data_type else 'untyped'} tensor cannot be "
                            f"stored as external data")
    if any(d < 0 for d in tensor.dims):
        raise FrontendError(f"{head}: the tensor has a negative dimension (dims {list(tensor.dims)})")
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except Exception:  # noqa: BLE001 - an unknown type number; the loader names it
        return
    count = 1
    for d in tensor.dims:
        count *= int(d)
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) or \
            "FLOAT4" in onnx.TensorProto.DataType.Name(tensor.data_type):
        need = (count + 1) // 2
    else:
        need = count * itemsize
    if length != need:
        raise FrontendError(f"{head}: holds {length} bytes, the tensor's shape {list(tensor.dims)} of "
                            f"{onnx.TensorProto.DataType.Name(tensor.data_type).lower()} needs {need}")


def _whole(text: str, head: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise FrontendError(f"{head}: {what} {text!r} is not a whole number") from None
    if value < 0:
        raise FrontendError(f"{head}: {what} {value} is negative")
    return value


def _stat(path: str, head: str, what: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise FrontendError(f"{head}: no such file" if what == "the model file" else
                            f"{head}: no such file in the model's folder") from None
    except (OSError, ValueError) as e:
        raise FrontendError(f"{head}: cannot stat {what}: {getattr(e, 'strerror', None) or one_line(e)}") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _read_exactly(fd: int, offset: int, length: int, what: str) -> bytes:
    chunks, done = [], 0
    while done < length:
        chunk = os.pread(fd, min(length - done, 1 << 26), offset + done)
        if not chunk:
            raise FrontendError(f"{what}: the file ended after {done} of {length} bytes")
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)

