"""Compile C/C++ source once into a shared library kept in the compile cache, and load it.

Shared by the CPU backend and the CPU harness for GPU source: the key hashes toolchain,
flags and source; the file is written under a temporary name and renamed, so a concurrent
process never loads a partial library; a library that does not load (a damaged file) is
built again; a process loads each library once."""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import threading
from pathlib import Path
from typing import Callable

from gir.cache import usable_dir

from .errors import CompileError

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}


def cached_library(toolchain_id: str, compiler: str, flags: list[str], source: str, suffix: str,
                   what: str, where: str, on_load: Callable[[ctypes.CDLL], None] | None = None,
                   libraries: tuple[str, ...] = ()) -> ctypes.CDLL:
    """`what`/`where` name the source and the compiler in a CompileError; `libraries` go after
    the source on the command line, where the linker looks for them."""
    key = hashlib.sha256(f"{toolchain_id}\0{' '.join(flags)}\0{source}".encode()).hexdigest()[:32]
    # found before the lock: the first lookup imports the backends, and the CPU backend's import
    # builds a library of its own (cpu/spin.py), which under the lock deadlocked the harness
    # when it was the first user in a process (tests/test_harness.py run alone)
    directory = usable_dir("native")
    with _lock:
        if key in _libs:
            return _libs[key]
        out = directory / f"{key}.so"
        try:
            lib = ctypes.CDLL(str(out))
        except OSError:  # not built yet, or damaged
            _compile(out, compiler, flags, source, suffix, what, where, libraries)
            lib = ctypes.CDLL(str(out))
        if on_load:
            on_load(lib)
        _libs[key] = lib
        return lib


def _compile(out: Path, compiler: str, flags: list[str], source: str, suffix: str, what: str, where: str,
             libraries: tuple[str, ...]) -> None:
    src = out.with_suffix(f".{os.getpid()}{suffix}")
    src.write_text(source)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run([compiler, *flags, str(src), "-o", str(tmp), *libraries], capture_output=True, text=True)
    src.unlink()
    if proc.returncode:
        raise CompileError(what, where, proc.stderr)
    os.replace(tmp, out)
