"""What identifies a model file's contents for the compile cache: a digest of the ONNX file and
of every external-data range it names, computed without parsing the model (parsing a 440 MB
BERT-base takes seconds; hashing it, a fraction of one).

An ONNX file with external data names each data file in a `location` entry; the encoded key
(`0a 08 "location"`) is looked for in the bytes, and only a file that has it is parsed (without
its data) to list the ranges. Those are validated first, by the same rules the loader applies
(gir/frontend/external_data.py): nothing outside the model's folder, no FIFO or device, and no
range outside its file is ever opened or read to compute a digest.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import stat

from gir.frontend.external_data import external_digest

_LOCATION = b"\x0a\x08location"


def model_digest(path: str) -> str | None:
    """Hex digest of the model's bytes and its external data, or None when the model file cannot
    be read or is not a regular file (the loader then reports why). A refused external-data
    location raises the loader's FrontendError (bad input)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO blocks, a device never ends: never opened
            return None
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            if os.fstat(f.fileno()).st_size == 0:
                return hashlib.sha256().hexdigest()
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                digest = hashlib.sha256(data)
                external = data.find(_LOCATION) >= 0
    except (OSError, ValueError):  # missing, a folder, unreadable
        return None
    if external:
        external_digest(path, digest)
    return digest.hexdigest()
