"""The persistent compile cache: one folder ($GIR_CACHE_DIR, default ~/.cache/gir) with one
subfolder per kind of entry, so that a second compile of a model redoes nothing.

Why these keys: every key holds the GIR release, the kind, and the entry's own inputs. An entry
computed by GIR's own Python code (a searched and rewritten kernel, a whole compile's outputs)
is stale as soon as that code changes, so its key also holds `gir_version()`: the release plus
a digest of the package's source files. An entry that is a compiler's output (PTX, cubin, code
object, shared library) is a function of the compiler, its flags and the source alone, so its
key holds the compiler's version, the flags and the full source; what GIR reads out of it (the
resource report) is parsed again at every load, so a parser fix applies at once. Entries are written under a temporary
name and renamed, so a reader (another process, another `--jobs` worker) sees a whole entry or
none; an entry that does not read back (truncated, bit rot, an older format) is a miss and is
rewritten. A cache that cannot be written (read-only home, full disk) slows GIR down, never
stops it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import mmap
import os
import pickle
import shutil
import sys
import tempfile
import zlib
from contextlib import suppress
from functools import lru_cache
from importlib import metadata
from pathlib import Path

CORE_KINDS = {
    "model": "whole `gir compile` outputs, by model file, target and options",
    "plan": "searched and rewritten fused kernels, by group structure and target",
    "session": "whole plans of gir.Session (graph, kernels, memory plan), by model bytes and target",
}


def kinds() -> dict[str, str]:
    """Every kind of entry: GIR's own, then those each registered backend's toolchain stores."""
    from gir.backends.registry import cache_kinds
    return {**CORE_KINDS, **cache_kinds()}
_MAGIC = b"GIRCACHE1\n"


def cache_root() -> Path:
    """$GIR_CACHE_DIR, else $XDG_CACHE_HOME/gir, else ~/.cache/gir."""
    if root := os.environ.get("GIR_CACHE_DIR"):
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gir"


def cache_dir(kind: str) -> Path:
    """The folder of one kind of entry, created if missing."""
    if kind not in CORE_KINDS and kind not in (known := kinds()):
        raise KeyError(f"unknown cache kind {kind!r} (known: {', '.join(known)})")
    folder = cache_root() / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def usable_dir(kind: str) -> Path:
    """`cache_dir(kind)`, or where it cannot be made (the root is a file, no permission, a full
    disk) a temporary folder of this process, after one warning line: the build still works,
    it is only not kept for the next run."""
    try:
        return cache_dir(kind)
    except OSError as err:
        warn_unusable(err)
        return Path(tempfile.mkdtemp(prefix=f"gir-{kind}-"))


_warned = []


def warn_unusable(err: OSError) -> None:
    """One line on stderr, the first time this process finds the cache unusable."""
    if not _warned:
        _warned.append(err)
        print(f"gir: warning: compile cache {cache_root()} is not usable ({err.strerror or err}); "
              f"nothing is cached in this run (set GIR_CACHE_DIR to a writable folder)", file=sys.stderr)


@lru_cache(maxsize=None)
def gir_release() -> str:
    try:
        return metadata.version("gir")
    except metadata.PackageNotFoundError:  # running from a checkout that was never pip-installed
        return "0+checkout"


@lru_cache(maxsize=None)
def gir_version() -> str:
    """The release and a digest of every source file GIR runs (Python and C headers)."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".h")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{gir_release()}+{digest.hexdigest()[:16]}"


def stable_repr(obj) -> str:
    """repr() with every set and dict in sorted order, through dataclasses, lists and tuples: a
    set's repr follows string hashing, which each process seeds anew, so a key holding one
    would miss in every fresh process."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = (f"{f.name}={stable_repr(getattr(obj, f.name))}" for f in dataclasses.fields(obj) if f.repr)
        return f"{type(obj).__qualname__}({', '.join(fields)})"
    if isinstance(obj, (set, frozenset)):
        return f"{type(obj).__name__}({{{', '.join(sorted(stable_repr(x) for x in obj))}}})"
    if isinstance(obj, dict):
        items = sorted((stable_repr(k), stable_repr(v)) for k, v in obj.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(obj, (list, tuple)):
        inner = ", ".join(stable_repr(x) for x in obj)
        return f"[{inner}]" if isinstance(obj, list) else f"({inner}{',' if len(obj) == 1 else ''})"
    return repr(obj)


def write_atomic(path: Path, data: bytes) -> None:
    """Write under a temporary name in the same folder, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class Store:
    """A persistent mapping for one kind of entry: keys are hashed (with `namespace`: the GIR
    version, the target, the compiler version, ...) into a file name, values are pickled
    behind a checksum. Supports what `gir.fusion.plan.plan(cache=...)` uses: `in`, `[]`,
    `[]=`. `hits`, `misses` and `rebuilt` (corrupt entries found) count this object's lookups."""

    def __init__(self, kind: str, *namespace):
        self.kind, self.namespace = kind, (gir_release(), kind, *namespace)
        self.hits = self.misses = self.rebuilt = 0
        self._read: dict = {}

    def _path(self, key) -> Path:
        text = repr((self.namespace, key))
        if " object at 0x" in text:  # a default repr differs between runs: the entry would never hit
            raise TypeError(f"cache key has no stable repr: {text[:200]}")
        return cache_root() / self.kind / (hashlib.sha256(text.encode()).hexdigest()[:40] + ".pkl")

    def _load(self, key):
        """(True, value) for a good entry; (False, None) for none or a corrupt one (removed)."""
        path = self._path(key)
        try:
            blob = path.read_bytes()
        except OSError:
            return False, None
        # a view, not a copy: a whole session entry holds the model's weights (BERT-base: 440 MB)
        head, digest, payload = blob[:len(_MAGIC)], blob[len(_MAGIC):len(_MAGIC) + 32], memoryview(blob)[len(_MAGIC) + 32:]
        try:
            if head != _MAGIC or hashlib.sha256(payload).digest() != digest:
                raise ValueError("checksum")
            return True, pickle.loads(payload)
        except Exception:  # noqa: BLE001 -- any unreadable entry is a miss, and is rebuilt
            self.rebuilt += 1
            with suppress(OSError):
                path.unlink()
            return False, None

    def get(self, key, default=None, **load):
        """`load`: what a subclass's `_load` takes besides the key (BufferStore: `resolve`)."""
        if key not in self._read:
            found, value = self._load(key, **load)
            if not found:
                self.misses += 1
                return default
            self._read[key] = value
            self.hits += 1
        return self._read[key]

    def __contains__(self, key) -> bool:
        return self.get(key, _ABSENT) is not _ABSENT

    def __getitem__(self, key):
        value = self.get(key, _ABSENT)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value) -> None:
        self._read[key] = value
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            cache_dir(self.kind)
            write_atomic(self._path(key), _MAGIC + hashlib.sha256(payload).digest() + payload)
        except OSError as err:  # an unwritable cache only costs the next compile its time
            warn_unusable(err)


_ABSENT = object()
_BUFFERS_MAGIC = b"GIRCACHE3\n"
_BUFFER_ALIGN = 64
DIGEST_CHUNK = 8 << 20  # bytes per checksum of a BufferStore part, per digest of a model: spread over threads


def _aligned(n: int) -> int:
    return -(-n // _BUFFER_ALIGN) * _BUFFER_ALIGN


def _crc(piece) -> bytes:
    return zlib.crc32(piece).to_bytes(4, "little")


def piece_checks(views, chunk: int = DIGEST_CHUNK) -> list[bytes]:
    """The CRC-32 of every `chunk`-byte piece of each buffer in `views`, in order, on up to four
    threads (zlib lets go of the GIL while it sums: 3-4 GB/s a core here, sha256 1.6)."""
    pieces = []
    for view in views:
        view = memoryview(view).cast("B")
        pieces.extend(view[at:at + chunk] for at in range(0, view.nbytes, chunk))
    if len(pieces) < 2:
        return [_crc(p) for p in pieces]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        return list(pool.map(_crc, pieces))


# A BufferStore kind holds whole sessions with their weights, one entry per model, target and GIR
# version: without a bound it grew to 22 GB on a development machine in a day of edits.
BUFFER_STORE_BYTES = 8 << 30
BUFFER_STORE_ENV = "GIR_CACHE_SESSION_GB"


def buffer_store_budget() -> int:
    """Bytes a BufferStore kind may hold: $GIR_CACHE_SESSION_GB (a number of GiB), else 8 GiB."""
    try:
        return int(float(os.environ[BUFFER_STORE_ENV]) * (1 << 30))
    except (KeyError, ValueError):
        return BUFFER_STORE_BYTES


def trim(folder: Path, budget: int, keep: Path | None = None) -> int:
    """Remove the least recently used entries of `folder` (by modification time: a read
    touches its entry) until it holds at most `budget` bytes, never `keep` (the entry just
    written). Returns the bytes freed."""
    entries = []
    for path in folder.glob("*"):
        with suppress(OSError):
            if path.is_file() and not path.name.startswith(".tmp-"):
                st = path.stat()
                entries.append((st.st_mtime_ns, st.st_size, path))
    total, freed = sum(size for _, size, _ in entries), 0
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total - freed <= budget:
            break
        if keep is not None and path == keep:
            continue
        with suppress(OSError):
            path.unlink()
            freed += size
    return freed


def _view_of(root, offset: int, shape: tuple, strides: tuple, dtype, writeable: bool):
    """An array over `root`'s memory (what `_Pickler` stores for a view)."""
    import numpy as np
    view = np.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)
    view.flags.writeable = writeable and root.flags.writeable
    return view


def _root_array(a):
    """The array whose memory numpy view `a` lies in (through as_strided's stand-in too), or `a`."""
    import numpy as np
    base = a.base
    while base is not None:
        if isinstance(base, np.ndarray):
            a, base = base, base.base
        elif isinstance(getattr(base, "base", None), np.ndarray):
            base = base.base
        else:
            break
    return a


class _Pickler(pickle.Pickler):
    """Stores a numpy view of an array as that array (pickled once, by pickle's memo) and where in
    it the view lies, so that arrays sharing memory share it when read back: GPT-2's lm_head
    reads its 154 MB embedding through a view, which a plain pickle wrote, and a read mapped,
    as a second copy. Only where the view covers at least half of its root (a small slice of a
    large array keeps its own copy)."""

    def reducer_override(self, obj):
        import numpy as np
        if type(obj) is not np.ndarray or obj.base is None or obj.dtype.hasobject or obj.size == 0:
            return NotImplemented
        root = _root_array(obj)
        if root is obj or not root.flags.c_contiguous or 2 * obj.nbytes < root.nbytes:
            return NotImplemented
        offset = obj.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return _view_of, (root, offset, obj.shape, obj.strides, obj.dtype, bool(obj.flags.writeable))


class _Unpickler(pickle.Unpickler):
    def __init__(self, data, buffers, resolve):
        super().__init__(io.BytesIO(data), buffers=buffers)
        self._resolve = resolve

    def persistent_load(self, pid):
        if self._resolve is None:
            raise pickle.UnpicklingError("the entry refers to data outside it, and nothing resolves it")
        return self._resolve(pid)


class BufferStore(Store):
    """A Store for values that hold large arrays (a session's plan with the constants it derived):
    numpy's buffers are pickled out of band (protocol 5) and written after the pickle, each at a
    multiple of 64 bytes from the file's start. A read maps the file (copy on write: nothing
    written to an array reaches the file) and the arrays view the mapping: nothing is copied,
    and the pages are the page cache's. Layout: magic, sha256 of the table, the table's length
    (8 bytes), the table (the number of parts and each part's length, 8 bytes each, the piece
    size, then the CRC-32 of every piece of every part), then the parts (the pickle, the
    buffers). A read checks the table's digest, the file's length and every piece's CRC (on a
    few threads; a CRC, not a sha256, because it guards against damage, not forgery, at twice
    the speed); an entry that does not check is a miss and is removed. Entries are only ever
    replaced by a rename and removed by an unlink, never rewritten in place, so a mapping never
    sees its file change.

    `put(key, value, refer=)` and `get(key, resolve=)` keep objects that live elsewhere out of the
    entry: `refer(obj)` returns a token (any picklable value) for an object not to be stored,
    None for the rest (pickle's `persistent_id`); `resolve(token)` gives the object back when the
    entry is read (`persistent_load`): a session's entry refers to the model file's own tensors
    this way instead of holding copies. An entry with tokens read without `resolve` is a miss.
    The kind's folder is kept under `buffer_store_budget()` bytes, least recently used first."""

    def _load(self, key, resolve=None):
        path = self._path(key)
        try:
            f = open(path, "rb")
        except OSError:
            return False, None
        try:
            with f:
                size = os.fstat(f.fileno()).st_size
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
            view, n = memoryview(mapped), len(_BUFFERS_MAGIC)
            if bytes(view[:n]) != _BUFFERS_MAGIC or size < n + 40:
                raise ValueError("magic")
            length = int.from_bytes(view[n + 32:n + 40], "little")
            table = view[n + 40:n + 40 + length]
            if length < 16 or len(table) != length or hashlib.sha256(table).digest() != bytes(view[n:n + 32]):
                raise ValueError("table")
            count = int.from_bytes(table[:8], "little")
            sizes = [int.from_bytes(table[8 * (i + 1):8 * (i + 2)], "little") for i in range(count)]
            chunk = int.from_bytes(table[8 * (count + 1):8 * (count + 2)], "little")
            digests = table[8 * (count + 2):]
            at, parts = n + 40 + length, []
            for part in sizes:
                at = _aligned(at)
                parts.append(view[at:at + part])
                at += part
            if at != size or not count or chunk < 1:
                raise ValueError("length")
            expected = [bytes(digests[4 * i:4 * (i + 1)]) for i in range(len(digests) // 4)]
            if len(digests) % 4 or piece_checks(parts, chunk) != expected:
                raise ValueError("checksum")
            value = _Unpickler(parts[0], parts[1:], resolve).load()
            with suppress(OSError):
                os.utime(path)  # recently used: `trim` removes it last
            return True, value
        except Exception:  # noqa: BLE001 -- any unreadable entry is a miss, and is rebuilt
            self.rebuilt += 1
            with suppress(OSError):
                path.unlink()
            return False, None

    def __setitem__(self, key, value) -> None:
        self.put(key, value)

    def put(self, key, value, refer=None) -> None:
        self._read[key] = value
        buffers, head = [], io.BytesIO()
        pickler = _Pickler(head, protocol=5, buffer_callback=buffers.append)
        if refer is not None:
            pickler.persistent_id = refer
        pickler.dump(value)
        parts = [head.getbuffer()] + [b.raw() for b in buffers]
        table = b"".join(n.to_bytes(8, "little") for n in (len(parts), *(p.nbytes for p in parts), DIGEST_CHUNK))
        table += b"".join(piece_checks(parts))
        chunks, at = [], len(_BUFFERS_MAGIC) + 40 + len(table)
        for part in parts:
            chunks.append(bytes(_aligned(at) - at))
            chunks.append(part)
            at = _aligned(at) + part.nbytes
        try:
            folder = cache_dir(self.kind)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_BUFFERS_MAGIC + hashlib.sha256(table).digest() + len(table).to_bytes(8, "little"))
                    f.write(table)
                    for chunk in chunks:
                        f.write(chunk)
                os.replace(tmp, self._path(key))
            except BaseException:
                os.unlink(tmp)
                raise
            trim(folder, buffer_store_budget(), keep=self._path(key))
        except OSError as err:
            warn_unusable(err)


def info() -> dict[str, dict]:
    """Per kind: entries, bytes and folder (what `gir cache info` prints)."""
    root = cache_root()
    out = {}
    for kind in kinds():
        files = [p for p in (root / kind).glob("*") if p.is_file() and not p.name.startswith(".tmp-")]
        entries = [p for p in files if p.suffix != ".hint"]  # a session's hint (its model's last digest) is no entry
        out[kind] = {"entries": len(entries), "bytes": sum(p.stat().st_size for p in files), "folder": str(root / kind)}
    return out


def clear() -> int:
    """Remove every entry of every kind; returns the bytes freed. Other files in the root stay."""
    freed = 0
    for kind, data in info().items():
        freed += data["bytes"]
        shutil.rmtree(cache_root() / kind, ignore_errors=True)
    return freed
