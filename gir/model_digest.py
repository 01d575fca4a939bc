"""What identifies a model file's contents for the compile cache: a digest of the ONNX file and
of every external-data file it names, computed without parsing the model (parsing a 440 MB
BERT-base takes seconds; hashing it, a fraction of one).

An ONNX file with external data names each data file in a `location` entry; the encoded key
(`0a 08 "location"`) is looked for in the bytes, and only a file that has it is parsed (without
its data) to list the files.
"""
from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

_LOCATION = b"\x0a\x08location"


def model_digest(path: str) -> str | None:
    """Hex digest of the model's bytes, or None when the file cannot be read (the loader then
    reports why)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return hashlib.sha256().hexdigest()
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                digest = hashlib.sha256(data)
                external = data.find(_LOCATION) >= 0
        for name in _external_files(path) if external else []:
            digest.update(b"\0" + name.encode() + b"\0" + (Path(path).parent / name).read_bytes())
    except (OSError, ValueError):  # missing, a folder, unreadable
        return None
    return digest.hexdigest()


def _external_files(path: str) -> list[str]:
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    try:
        graph = onnx.load(path, load_external_data=False).graph
    except Exception:  # noqa: BLE001 -- not a model: nothing external; the loader reports the rest
        return []
    tensors = [*graph.initializer, *(t for node in graph.node for a in node.attribute for t in (a.t, *a.tensors))]
    return sorted({ExternalDataInfo(t).location for t in tensors if uses_external_data(t)})
