"""A model file read once for the session cache (fast start, issue 25): its bytes in one private,
aligned block, the digest that keys the cache, and where each initializer's raw data lies in it.

Why: a session read back from the cache needs the model's weights, and the model's own
initializers are already in the file. The cache entry stores only the constants the plan
derived (transposed, folded, ...) and, for the rest, a token (offset, length, dtype, shape) into
the model file's bytes; the key is the digest of exactly those bytes, so a token can only ever
be resolved against the bytes it was made from. The bytes are read into private memory and
hashed there (not mapped): what the session computes with is what was hashed, even if the file
is rewritten while the session lives (a mapped file that is truncated kills the process).

The digest is a sha256 over the sha256 of each 8 MiB piece, hashed on a few threads; the file is
not parsed (onnx parses a 500 MB GPT-2 in seconds), only walked: the protobuf wire format of
ModelProto.graph.initializer[*].raw_data (a few thousand tags in Python). A model with external
data (an initializer with data_location EXTERNAL, or the `location` key anywhere outside the
raw data) is keyed by gir.model_digest instead, and refers to nothing.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gir.cache import DIGEST_CHUNK

_LOCATION = b"\x0a\x08location"
ALIGN = 64


def _varint(mv, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = mv[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(mv, start: int, end: int):
    """(field number, wire type, value or start, end) of each field in mv[start:end]."""
    i = start
    while i < end:
        tag, i = _varint(mv, i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _varint(mv, i)
            yield field, wire, value, i
        elif wire == 2:
            n, i = _varint(mv, i)
            if i + n > end:
                raise ValueError("field past its message")
            yield field, wire, i, i + n
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
            yield field, wire, None, i
        else:
            raise ValueError(f"wire type {wire}")
    if i != end:
        raise ValueError("message past its end")


def raw_regions(mv) -> tuple[list[tuple[int, int]], bool]:
    """([(offset, length)] of each graph initializer's raw_data, in file order; whether the model
    names external data). `mv`: the file's bytes (a memoryview or mmap). Raises ValueError where
    the bytes are not a model's wire format."""
    regions, external = [], False
    for field, wire, a, b in _fields(mv, 0, len(mv)):
        if field != 7 or wire != 2:  # ModelProto.graph
            continue
        for gfield, gwire, ga, gb in _fields(mv, a, b):
            if gfield != 5 or gwire != 2:  # GraphProto.initializer
                continue
            for tfield, twire, ta, tb in _fields(mv, ga, gb):
                if tfield == 9 and twire == 2:  # TensorProto.raw_data
                    regions.append((ta, tb - ta))
                elif tfield == 14 and twire == 0 and ta == 1:  # data_location EXTERNAL
                    external = True
    regions.sort()
    at = 0  # the location key outside the raw data: a node's tensor, a function's, ... names a file
    for offset, length in [*regions, (len(mv), 0)]:
        if offset > at and _find(mv, at, offset):
            external = True
        at = max(at, offset + length)
    return regions, external


def _find(mv, start: int, end: int) -> bool:
    if hasattr(mv, "find"):  # an mmap searches in place
        return mv.find(_LOCATION, start, end) >= 0
    return bytes(mv[start:end]).find(_LOCATION) >= 0


def _batches(pieces: list) -> list[list]:
    """Consecutive pieces grouped into tasks of about DIGEST_CHUNK bytes."""
    tasks, size = [], DIGEST_CHUNK
    for piece in pieces:
        if size + piece[1] > DIGEST_CHUNK:
            tasks.append([])
            size = 0
        tasks[-1].append(piece)
        size += piece[1]
    return tasks


def _spans(tasks: list) -> list[tuple[int, int]]:
    """(start, end) of each task's pieces in the flat list."""
    spans, at = [], 0
    for task in tasks:
        spans.append((at, at + len(task)))
        at += len(task)
    return spans


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    if hasattr(os, "preadv"):  # straight into the block
        return os.preadv(fd, [view], offset)
    got = os.pread(fd, len(view), offset)  # where there is no preadv: a copy
    view[:len(got)] = got
    return len(got)


def _aligned_empty(n: int) -> np.ndarray:
    raw = np.empty(n + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip:skip + n]


def _layout(regions: list, size: int) -> tuple[list[tuple[int, int, int]], dict[int, tuple[int, int]], int]:
    """Where the file's bytes go in the private block: (file offset, length, position) segments in
    file order, each initializer's raw data starting at a multiple of 64 bytes (a kernel may
    load a weight with aligned vector instructions; onnx's raw data lies anywhere); {offset:
    (length, position)} of those; the block's size."""
    segments, placed, at, pos = [], {}, 0, 0
    for offset, length in regions:
        if length < ALIGN or offset < at:
            continue
        if offset > at:
            segments.append((at, offset - at, pos))
            pos += offset - at
        pos = -(-pos // ALIGN) * ALIGN
        segments.append((offset, length, pos))
        placed[offset] = length, pos
        pos, at = pos + length, offset + length
    if at < size:
        segments.append((at, size - at, pos))
        pos += size - at
    return segments, placed, pos


class ModelBytes:
    """`read(path)`: the file's bytes in one private block (`data`; each initializer's raw data at a
    multiple of 64 bytes), `digest` (hex, the session cache's key), `regions` (initializer raw
    data: file offset -> (length, position in `data`)), `pieces` (file offset -> the sha256 of
    each 8 MiB piece of that raw data, as the digest hashed it), `external` and `identity`
    (device, inode, size, modification time at the read). `read(path, keep=False)` hashes the
    file without keeping its bytes (`data` is empty); `read(path, later=True)` returns once the
    bytes are read and hashes them on other threads: `digest` and `pieces` wait for that."""

    def __init__(self, path: str, data: np.ndarray, regions: dict, external: bool, identity: tuple = (),
                 pieces: list = (), owned: dict | None = None, digest: str | None = None):
        self.path, self.data, self.regions, self.external, self.identity = path, data, regions, external, identity
        self._pieces, self._owned, self._digest = list(pieces), owned or {}, digest
        self._by_offset = {} if digest is not None else None
        self.guess = None  # the digest a session cache hint gave before this one was hashed

    def _settle(self) -> None:
        if self._digest is None:
            digests = [d[0].result()[d[1]] if isinstance(d, tuple) else d for _, d in self._pieces]
            # the pieces follow from the bytes (where the raw data lies), so equal digests mean equal files
            head = b"gir-model-bytes-1\0%d\0" % self.identity[2] + b"".join(b"%d,%d;" % p for p, _ in self._pieces)
            self._digest = hashlib.sha256(head + b"".join(digests)).hexdigest()
            self._by_offset = {o: tuple(digests[i] for i in ix) for o, ix in self._owned.items()}

    @property
    def digest(self) -> str:
        self._settle()
        return self._digest

    @property
    def pieces(self) -> dict:
        self._settle()
        return self._by_offset

    @classmethod
    def read(cls, path: str, keep: bool = True, later: bool = False) -> ModelBytes | None:
        """None where the file cannot be read whole (missing, not a regular file, changing size) or
        is not a model's wire format: the loader then says why, and the session is not cached."""
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO blocks, a device never ends: never opened
                return None
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (OSError, ValueError):
            return None
        pool = ThreadPoolExecutor(min(4, os.cpu_count() or 1))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            if st.st_size:
                with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:  # walked, not read: the tags only
                    regions, external = raw_regions(mapped)
            else:
                regions, external = [], False
            segments, placed, size = _layout(regions, st.st_size)
            data = _aligned_empty(size if keep else 0)
            pieces, owned = [], {}
            for offset, length, pos in segments:
                for at in range(0, length, DIGEST_CHUNK):
                    if placed.get(offset, (None, None))[1] == pos:
                        owned.setdefault(offset, []).append(len(pieces))
                    pieces.append((offset + at, min(DIGEST_CHUNK, length - at), pos + at))
            scratch = threading.local()
            sha = lambda view: hashlib.sha256(view).digest()

            def read(piece):  # os.preadv and hashlib both let go of the GIL
                offset, n, pos = piece
                if keep:
                    view = memoryview(data[pos:pos + n])
                else:  # a buffer of the thread's own, reused
                    if not hasattr(scratch, "buffer"):
                        scratch.buffer = np.empty(DIGEST_CHUNK, np.uint8)
                    view = memoryview(scratch.buffer[:n])
                done = 0
                while done < n:
                    got = _pread_into(fd, view[done:], offset + done)
                    if got <= 0:
                        raise OSError("the file got shorter while it was read")
                    done += got
                return view if later and keep else sha(view)

            tasks = _batches(pieces)  # thousands of small initializers: a few tasks, not one each
            views = [v for done in pool.map(lambda task: [read(p) for p in task], tasks) for v in done]
            after = os.fstat(fd)
            if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
                return None  # rewritten while it was read
            if later and keep:
                hashed = [pool.submit(lambda task: [sha(v) for v in task], views[a:b]) for a, b in _spans(tasks)]
                digests = [(future, i) for future, (a, b) in zip(hashed, _spans(tasks)) for i in range(b - a)]
            else:
                digests = views
        except (OSError, ValueError, IndexError):
            return None
        finally:
            os.close(fd)
            pool.shutdown(wait=False)  # what was submitted still runs
        return cls(path, data, placed, external, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns),
                   [((o, n), d) for (o, n, _), d in zip(pieces, digests)], owned)

    def without_data(self) -> ModelBytes:
        """The path and digest only (what a miss keeps while it plans)."""
        return ModelBytes(self.path, np.empty(0, np.uint8), {}, self.external, self.identity, digest=self.digest)

    def refer(self, arrays) -> dict[int, tuple]:
        """{id(array): token} for each array of `arrays` whose bytes are exactly one initializer's
        raw data (C order, little-endian as ONNX stores it), by the digests of its pieces (the
        bytes need not be kept); the rest are not the model's own."""
        by_size: dict[int, list[int]] = {}
        for offset, (length, _) in self.regions.items():
            by_size.setdefault(length, []).append(offset)
        tokens = {}
        for a in arrays:
            if (id(a) in tokens or not isinstance(a, np.ndarray) or a.nbytes not in by_size
                    or not a.flags.c_contiguous or a.dtype.byteorder == ">" or a.dtype.hasobject):
                continue
            mine = memoryview(a.reshape(-1).view(np.uint8))
            digests = tuple(hashlib.sha256(mine[at:at + DIGEST_CHUNK]).digest()
                            for at in range(0, a.nbytes, DIGEST_CHUNK))
            for offset in by_size[a.nbytes]:
                if self.pieces.get(offset) == digests:
                    tokens[id(a)] = ("gir-model", offset, a.nbytes, a.dtype.str, tuple(a.shape))
                    break
        return tokens

    def resolve(self, token) -> np.ndarray:
        """The array a token of `refer` stands for: a view of these bytes (it starts at a multiple
        of 64 bytes). The token must name exactly one initializer's raw data here."""
        tag, offset, nbytes, dtype, shape = token
        length, pos = self.regions.get(offset, (None, None))
        if tag != "gir-model" or length != nbytes:
            raise ValueError(f"{self.path}: no initializer of {nbytes} bytes at {offset}")
        return self.data[pos:pos + nbytes].view(np.dtype(dtype)).reshape(shape)
