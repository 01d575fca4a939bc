"""`gir.Session`: an onnxruntime-like inference session over a compiled plan."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gir.backends.registry import HOST_TARGET
from gir.frontend import BasicGraph, load
from gir.fusion.plan import plan
from gir.ir import get_target
from gir.ir.dtypes import np_dtype

from .executor import execute
from .indices import check_input_indices, input_gathers
from .memory import MemoryPlan, plan_memory

ENGINES = ("native", "interpreter")
LIBRARIES = (None, "numpy")


class SessionError(ValueError):
    """Bad feeds or output names: the message names the model and the tensor."""


@dataclass(frozen=True)
class NodeArg:
    """Like onnxruntime's NodeArg: name, shape, element type."""
    name: str
    shape: list
    type: str


class _InterpreterEngine:
    """GIR kernels in the reference interpreter, library ops through numpy: runs any target's
    plan on any machine and checks that every written tensor is fully covered (debugging)."""

    def __init__(self, plan, memory: MemoryPlan):
        self.plan, self.memory = plan, memory

    def run(self, feeds: dict) -> dict:
        return {n: v.copy() for n, v in execute(self.plan, feeds, memory=self.memory).items()}


def _native_engine(target):
    """The Engine the target's backend registers (gir/backends/registry.py), or None."""
    from gir.backends.registry import BackendError, for_target
    try:
        return for_target(target).engine
    except BackendError:
        return None


def has_native_engine(target) -> bool:
    """Whether `engine="native"` can run this target's kernels: its backend registers an engine."""
    return _native_engine(target) is not None


def _engine_factory(name: str, target, model: str):
    """`fn(plan, memory, **options) -> engine`; a device engine opens its device here, before
    any planning."""
    if name == "interpreter":
        return lambda plan, memory, **options: _InterpreterEngine(plan, memory)
    engine = _native_engine(target)
    if engine is None:
        raise SessionError(f"{model}: no native engine for {target.name} ({target.backend}); engine='interpreter' runs it")
    return engine.open(target, model)


def _session_cache(model, input_shapes, target, limit, plan_cache, guess: bool = False):
    """(Store, key, ModelBytes or None) of whole plans when `plan_cache` is the persistent cache,
    else (None, None, None). A model file or ModelProto seen before with the same bound shapes,
    target, `limit` and GIR version is not loaded or planned again: its graph, plan, memory plan
    and emitted kernels are read back (GPT-2 in a fresh process: seconds of loading, planning and
    emitting against a fraction of one). A model file is keyed by the digest of its bytes, read
    once into memory (`ModelBytes`), and its entry refers to the initializers in those bytes
    instead of holding copies; a model with external data is keyed by gir.model_digest (the file
    and every range it names) and its entry holds every constant; a ModelProto is keyed by its
    serialized bytes; a BasicGraph is planned every time. `guess`: a model file's key may be the
    digest its bytes had when last seen (`_guess`), its own hashed meanwhile (`source.guess`)."""
    from gir.cache import BufferStore, Store, gir_version, stable_repr
    none = None, None, None
    if not isinstance(plan_cache, Store) or isinstance(model, BasicGraph):
        return none
    source = None
    if isinstance(model, (str, os.PathLike)):
        from .model_bytes import ModelBytes
        path = os.fspath(model)
        guess = _guess(path) if guess else None
        source = ModelBytes.read(path, later=guess is not None)
        if source is None:  # unreadable or not a model: the loader says why, uncached
            return none
        source.guess = guess if not source.external else None
        # the file's stem names the model (error messages)
        digest = source.guess or source.digest, "bytes", Path(path).stem
        if source.external:
            from gir.model_digest import model_digest
            try:
                digest, source = (model_digest(path), "file", Path(path).stem), None
            except Exception:  # noqa: BLE001 -- a refused model: the loader says why, uncached
                return none
            if digest[0] is None:
                return none
    elif hasattr(model, "SerializeToString"):
        digest = hashlib.sha256(model.SerializeToString()).hexdigest(), "proto"
    else:
        return none
    shapes = tuple(sorted((str(k), tuple(v) if isinstance(v, (list, tuple)) else v)
                          for k, v in (input_shapes or {}).items()))
    try:
        target = stable_repr(get_target(target))  # its sets in a fixed order: the same key in every process
    except Exception:  # noqa: BLE001 -- an unknown target: the session reports it, uncached
        return none
    return BufferStore("session", gir_version(), target, limit), (digest, shapes), source


_ENTRY = 5  # (graph, plan, memory plan, library layouts, emitted kernels or None)


def _hint_path(path: str, identity: tuple) -> Path:
    from gir.cache import cache_root
    text = repr(("gir-session-hint-1", os.path.realpath(path), *identity))
    return cache_root() / "session" / (hashlib.sha256(text.encode()).hexdigest()[:40] + ".hint")


def _identity(path: str) -> tuple:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _guess(path: str) -> str | None:
    """The digest the model file had when a session last read it with this device, inode, size and
    modification time: only a guess, which lets its entry be read and its engine made while the
    bytes are hashed; a session is only ever made of the entry of the digest its bytes have."""
    try:
        digest = _hint_path(path, _identity(path)).read_text()
    except (OSError, ValueError):
        return None
    return digest if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) else None


def _remember(source) -> None:
    """The hint `_guess` reads, for the file as `source` read it (a cache that cannot be written
    only costs the next session its overlap)."""
    from gir.cache import cache_dir, write_atomic
    if source is None or source.guess == source.digest or not source.identity:
        return
    try:
        cache_dir("session")
        write_atomic(_hint_path(source.path, source.identity), source.digest.encode())
    except OSError:
        pass


def _read_entry(sessions, key, source):
    """The entry of `key` with the model's own tensors resolved from `source`, or None."""
    if sessions is None:
        return None
    cached = sessions.get(key, resolve=source.resolve if source is not None else None)
    return cached if isinstance(cached, tuple) and len(cached) == _ENTRY else None  # none, or of another layout


def _write_entry(sessions, key, source, value, planned: bool) -> None:
    """Store a session; where the model is a file, its initializers as tokens into its bytes. After
    a plan made from a fresh load, the file is read again and the entry kept only if it still
    has the bytes it was keyed by (a file rewritten while it was planned is not cached)."""
    refer = None
    if source is not None:
        if planned:
            from .model_bytes import ModelBytes
            again = ModelBytes.read(source.path, keep=False)  # its digests only: not held with the plan
            if again is None or again.digest != source.digest:
                return
            source = again
        graph, plan_ = value[0], value[1]
        arrays = [t.value for g in (graph, plan_.graph) for t in g.tensors.values() if t.value is not None]
        held = {id(a): a for a in arrays}  # alive while pickling: no other object has their ids
        tokens = {i: (held[i], token) for i, token in source.refer(arrays).items()}

        def refer(obj):
            found = tokens.get(id(obj))
            return found[1] if found is not None and found[0] is obj else None
    sessions.put(key, value, refer=refer)


def cached_graph(model, input_shapes, target, limit, plan_cache) -> BasicGraph | None:
    """The loaded graph of a model the session cache holds (what `Session` would read back)."""
    cached = _read_entry(*_session_cache(model, input_shapes, target, limit, plan_cache))
    return cached[0] if cached is not None else None


class Session:
    """Session(path_or_ModelProto, target=HOST_TARGET).run(output_names, feeds), as onnxruntime's
    InferenceSession (a BasicGraph already loaded is accepted too). Kernels are compiled when
    the session is created. Engines: "native" (the engine the target's backend registers: its
    own code on its device, NoDeviceError where there is none) or "interpreter" (the
    reference interpreter, on any machine). `memory.peak_bytes`: the arena of intermediates, with reuse.
    `plan_cache`: a gir.cache.Store of searched kernels (the CLI passes the persistent one); with
    it, a model file or ModelProto planned before is read back whole (`cached` says so).
    `input_shapes`: binds symbolic dims, {input name: shape} and/or {dim_param: size}
    (gir.frontend.load explains both). `library`: where the native CPU engine runs library ops
    (matmul, conv): None for oneDNN where installed (numpy otherwise), "numpy" to force numpy;
    `library_path` says which it uses ("onednn 3.2.0", "numpy", or both with counts)."""

    def __init__(self, model, target: str = HOST_TARGET, engine: str = "native", limit: int = 2, progress=None,
                 plan_cache=None, input_shapes: dict | None = None, library: str | None = None):
        if isinstance(model, BasicGraph) and input_shapes:
            raise SessionError(f"{model.model_name}: input_shapes binds dims when a model is loaded; this graph "
                               f"is loaded already (pass input_shapes to gir.frontend.load instead)")
        if not self._open(model, target, engine, limit, progress, plan_cache, input_shapes, library, guess=True):
            self._open(model, target, engine, limit, progress, plan_cache, input_shapes, library, guess=False)

    def _open(self, model, target, engine, limit, progress, plan_cache, input_shapes, library, guess: bool) -> bool:
        """Load or read back, plan, place and build; False (nothing kept) where an entry was read by
        a guessed key (`_guess`) that the model's bytes, hashed meanwhile, do not have."""
        sessions, key, source = _session_cache(model, input_shapes, target, limit, plan_cache, guess)
        cached = _read_entry(sessions, key, source)
        if cached is None and source is not None and source.guess is not None:
            source.guess = None  # the guess names no entry: the bytes' own digest
            key = ((source.digest, *key[0][1:]), key[1])
            cached = _read_entry(sessions, key, source)
        if cached is not None:
            self.graph = cached[0]
        else:
            if source is not None:  # not held while planning: the file is read again before it is stored
                source = source.without_data()
            self.graph = model if isinstance(model, BasicGraph) else load(model, input_shapes=input_shapes)
        if engine not in ENGINES:
            raise SessionError(f"{self.graph.model_name}: unknown engine {engine!r}; engines are {', '.join(ENGINES)}")
        if not isinstance(limit, (int, np.integer)) or limit < 1:
            raise SessionError(f"{self.graph.model_name}: limit (parallel structures searched per fused group) "
                               f"must be a whole number >= 1, not {limit!r}")
        if library not in LIBRARIES:
            raise SessionError(f"{self.graph.model_name}: unknown library {library!r}; libraries are None (oneDNN "
                               f"where installed) and 'numpy'")
        self.target = get_target(target)
        make_engine = _engine_factory(engine, self.target, self.graph.model_name)
        if cached is not None:
            _, self.plan, self.memory, layouts, emitted = cached
        else:
            self.plan = plan(self.graph, self.target, limit=limit, progress=progress, cache=plan_cache)
            self.memory = plan_memory(self.plan)
            layouts, emitted = {}, None
        self.cached = cached is not None
        options = {"emitted": emitted} if emitted is not None else {}  # the CPU engine's kernels, not emitted again
        self.engine = make_engine(self.plan, self.memory, library=library, layouts=layouts, **options)
        if source is not None and source.guess is not None and source.digest != source.guess:
            return False  # the file changed since the guess: made again, by its own key
        _remember(source)
        made = getattr(self.engine, "emitted", None)
        if sessions is not None and (cached is None or getattr(self.engine, "layouts", {}) != layouts
                                     or (emitted is None and made is not None)):
            # with the layouts the CPU engine timed for its convs (not timed again)
            _write_entry(sessions, key, source, (self.graph, self.plan, self.memory,
                                                 dict(getattr(self.engine, "layouts", {})), made), cached is None)
        self._gathers = input_gathers(self.plan)
        return True

    @property
    def library_path(self) -> str:
        """How library ops run: the native CPU engine's `library_path`; elsewhere numpy on the host."""
        return getattr(self.engine, "library_path", "numpy")

    def _args(self, names) -> list[NodeArg]:
        t = self.graph.tensors
        return [NodeArg(n, list(t[n].shape), f"tensor({t[n].dtype})") for n in names]

    def get_inputs(self) -> list[NodeArg]:
        return self._args(self.graph.inputs)

    def get_outputs(self) -> list[NodeArg]:
        return self._args(self.graph.outputs)

    def run(self, output_names, feeds: dict) -> list[np.ndarray]:
        model = self.graph.model_name
        if not isinstance(feeds, Mapping):
            raise SessionError(f"{model}: feeds must be a dict {{input name: array}}, not a {type(feeds).__name__}; "
                               f"inputs are {', '.join(self.graph.inputs)}")
        if isinstance(output_names, str):
            raise SessionError(f"{model}: output_names must be a list of names or None, not the string {output_names!r}")
        names = list(output_names) if output_names else list(self.graph.outputs)
        for n in names:
            if n not in self.graph.outputs:
                raise SessionError(f"{model}: no output named {n!r}; outputs are {', '.join(self.graph.outputs)}")
        checked = {}
        for n in feeds:
            if n not in self.graph.inputs:
                raise SessionError(f"{model}: no input named {n!r}; inputs are {', '.join(self.graph.inputs)}")
        for n in self.graph.inputs:
            if n not in feeds:
                raise SessionError(f"{model}: missing input {n!r}")
            t, value = self.graph.tensors[n], np.asarray(feeds[n])
            if tuple(value.shape) != tuple(t.shape):
                raise SessionError(f"{model}: input {n!r} has shape {list(value.shape)}, expected {list(t.shape)}")
            if value.dtype != np_dtype(t.dtype):
                raise SessionError(f"{model}: input {n!r} has dtype {value.dtype}, expected {t.dtype}")
            checked[n] = value
        check_input_indices(self._gathers, checked, model)
        outputs = self.engine.run(checked)
        return [outputs[n] for n in names]
