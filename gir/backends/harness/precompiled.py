"""The harness header precompiled once per toolchain and warp size (a g++ precompiled header).

Why: g++ spent 1.2 of the 1.6 s it took to build a one-line kernel parsing gpu_on_cpu.h and the
C++ library headers it includes, and the test suite builds thousands of kernels. g++ reads
`X.h.gch` in place of `-include X.h` when the PCH was made with the same options, and reads X.h
itself when not, so a stale or refused PCH costs time, never correctness. The PCH and its header
copy sit in the compile cache (`native/pch-<key>/`), written under temporary names and renamed,
as the libraries are; a PCH that fails to build leaves the plain header in use.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from gir.cache import usable_dir

_lock = threading.Lock()
_made: dict[str, Path] = {}


def include_flags(compiler: str, flags: list[str], header: Path, toolchain_id: str) -> list[str]:
    """`-include` of `header` (made part of every translation unit built with `flags`), through
    its precompiled form where g++ could build one. `flags` are the build's own, macros and
    include folders included: the PCH is built with them, minus linking."""
    key = hashlib.sha256(f"{toolchain_id}\0{compiler}\0{' '.join(flags)}".encode()).hexdigest()[:24]
    with _lock:
        if key not in _made:
            _made[key] = _build(key, compiler, [f for f in flags if f != "-shared"], header)
    return ["-include", str(_made[key])]


def _build(key: str, compiler: str, flags: list[str], header: Path) -> Path:
    """The header copy that has its PCH beside it, or `header` itself where none can be made."""
    directory = usable_dir("native") / f"pch-{key}"
    copy, pch = directory / header.name, directory / f"{header.name}.gch"
    if copy.is_file() and pch.is_file():
        return copy
    try:
        directory.mkdir(exist_ok=True)
        tmp_copy = directory / f"{header.name}.{os.getpid()}.tmp"
        shutil.copyfile(header, tmp_copy)
        os.replace(tmp_copy, copy)
        tmp_pch = directory / f"{header.name}.{os.getpid()}.gch.tmp"
        done = subprocess.run([compiler, *flags, "-x", "c++-header", str(copy), "-o", str(tmp_pch)],
                              capture_output=True, text=True)
        if done.returncode:
            tmp_pch.unlink(missing_ok=True)
            return header
        os.replace(tmp_pch, pch)
        return copy
    except OSError:
        return header
