"""The backend registry: each backend registers itself, in its package's `__init__`, with what
it provides (the targets it describes, its emitter dialect, its compiler and its engine), and
the CLI, Session, compile driver, cache and planner look backends up by target name here.
Nothing outside gir/backends/ names a backend.

Why a registry and not a table per caller: a port then gets `gir compile`, `gir run`,
`gir.Session` and the conformance suite by writing its own folder, with no edit elsewhere.

Discovery, in this order (after Triton's backend discovery, which imports every package under
triton/backends/ and the entry points of group "triton.backends"):
  1. every package under gir/backends/ (what `gir port new NAME` writes);
  2. every folder on $GIR_BACKEND_PATH (os.pathsep-separated): a backend folder (one with an
     `__init__.py`), or a folder of backend folders (what `gir port new NAME --dir DIR` writes);
  3. the entry points of group "gir.backends" of installed distributions: each names a module
     whose import registers a backend.
A package that does not register anything (gir/backends/harness) is simply not a backend. One
that fails to import is remembered with a one-line reason, said when its targets are asked for.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HOST_TARGET = "cpu"          # the target that runs on this machine with no device: Session's and `gir run`'s default
PLAN_TARGET = "cuda:sm_90"   # what `gir explain` and `gir compile` plan for unless told: the paper's GPU
ENTRY_POINTS = "gir.backends"
PATH_VARIABLE = "GIR_BACKEND_PATH"


class BackendError(ValueError):
    """A backend or target cannot be found or lacks part of what it must provide; one line."""


@dataclass(frozen=True)
class TargetEntry:
    """One name `--target` takes. `describe()` builds its Target when it is asked for (a
    described device is opened then, not when targets are listed)."""
    name: str                       # "cuda:sm_90"
    describe: Callable
    aliases: tuple[str, ...] = ()   # also accepted ("h100"); the first is the preset name
    on_device: bool = False         # described by the device found when used (listed without figures)


@dataclass(frozen=True)
class Compiler:
    """How `gir compile` builds one fused step: `compile(graph, target)` -> CompiledGraph (the
    port's own compile), the suffix of the source file it writes, the binaries it keeps next
    to it (suffix -> bytes) and the toolchain version (part of the model cache's key)."""
    compile: Callable
    suffix: str
    toolchain_version: Callable[[], str]
    binaries: Callable = lambda compiled, target: {}
    flag_parameter: bool = True     # a gathering kernel takes its index flag as a last parameter (not a global)


@dataclass(frozen=True)
class Engine:
    """How a plan runs on a backend: `open(target, model)` opens the device (a missing one is a
    one-line NoDeviceError, before any planning) and returns `make(plan, memory, **options)`,
    whose result has `run(feeds) -> {output: array}`. `profile(session, feeds, repeat)`, where
    the engine can time each step alone, returns what `gir run --profile` prints."""
    open: Callable
    profile: Callable | None = None


@dataclass(frozen=True)
class Backend:
    """What one backend provides: its emitter dialect (a CStyle subclass), the target names it
    describes, its Compiler (`gir compile`), its Engine (`gir run`, Session; None: the
    interpreter only), the compile-cache kinds its toolchain stores (kind -> what it holds) and,
    for the host's backend, the calibration `gir calibrate` runs."""
    name: str
    emitter: type
    targets: tuple[TargetEntry, ...]
    compiler: Compiler | None = None
    engine: Engine | None = None
    cache_kinds: dict = field(default_factory=dict)
    calibration: Callable | None = None  # () -> module with measure/save/stored (`gir calibrate`, the host's)
    module: str = ""


_REGISTERED: dict[str, Backend] = {}
_BROKEN: dict[str, str] = {}   # package -> why it could not be imported
_discovered = False


def register(backend: Backend) -> Backend:
    """Called by a backend package's __init__. Registering a name another module holds is refused."""
    held = _REGISTERED.get(backend.name)
    if held is not None and held.module != backend.module:
        raise BackendError(f"backend {backend.name!r} of {backend.module} is registered already by {held.module}")
    taken = {n: b.name for b in _REGISTERED.values() if b.name != backend.name for e in b.targets
             for n in (e.name, *e.aliases)}
    for entry in backend.targets:
        for n in (entry.name, *entry.aliases):
            if n in taken:
                raise BackendError(f"backend {backend.name!r}: target name {n!r} is taken by backend {taken[n]!r}")
    _REGISTERED[backend.name] = backend
    return backend


def discover() -> None:
    """Import every backend once (see the module docstring for where they are looked for)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    here = Path(__file__).resolve().parent
    for info in pkgutil.iter_modules([str(here)]):
        if info.ispkg:
            _try(f"gir.backends.{info.name}", lambda n=info.name: importlib.import_module(f"gir.backends.{n}"))
    for folder in path_folders():
        _try(str(folder), lambda f=folder: _import_folder(f))
    try:
        from importlib.metadata import entry_points
        found = entry_points(group=ENTRY_POINTS)
    except Exception:  # noqa: BLE001 -- broken distribution metadata must not stop the built-in backends
        found = ()
    for ep in found:
        _try(f"{ep.name} ({ep.value})", ep.load)


def path_folders() -> list[Path]:
    """The backend folders $GIR_BACKEND_PATH names, directly or as a folder of them."""
    folders = []
    for item in filter(None, os.environ.get(PATH_VARIABLE, "").split(os.pathsep)):
        path = Path(item).expanduser().resolve()
        if (path / "__init__.py").is_file():
            folders.append(path)
        elif path.is_dir():
            folders += sorted(p for p in path.iterdir() if (p / "__init__.py").is_file())
    return folders


def _import_folder(folder: Path):
    from .port import _import_folder as import_folder
    return import_folder(folder)


def _try(where: str, load: Callable) -> None:
    try:
        load()
    except Exception as err:  # noqa: BLE001 -- kept as one line, said when the backend is asked for
        _BROKEN[where] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def backends() -> dict[str, Backend]:
    discover()
    return dict(_REGISTERED)


def backend(name: str) -> Backend:
    """The backend registered as `name` (a Target's `backend` field)."""
    found = backends().get(name)
    if found is None:
        raise BackendError(f"no backend {name!r} is registered (registered: {', '.join(sorted(_REGISTERED))})"
                           + _broken_note())
    return found


def for_target(target) -> Backend:
    return backend(target.backend)


def _broken_note() -> str:
    return "".join(f"; {where} failed to load ({why})" for where, why in _BROKEN.items())


def entries() -> list[tuple[Backend, TargetEntry]]:
    """Every target name with its backend, in registration order."""
    return [(b, e) for b in backends().values() for e in b.targets]


def find_entry(name: str) -> tuple[Backend, TargetEntry]:
    key = name.lower()
    for b, e in entries():
        if key == e.name or key in e.aliases:
            return b, e
    known = sorted({n for _, e in entries() for n in (e.name, *e.aliases)})
    raise KeyError(f"unknown target {name!r}; known targets: {', '.join(known)}" + _broken_note())


def get_target(name: str):
    """The Target of a name `--target` takes ("cuda:sm_90", "h100", "cpu", a described device)."""
    _, entry = find_entry(name)
    return entry.describe()


def presets() -> dict:
    """Preset name -> Target for every target with fixed figures (not described by a device)."""
    return {e.aliases[0]: e.describe() for _, e in entries() if e.aliases and not e.on_device}


def cache_kinds() -> dict[str, str]:
    return {kind: what for b in backends().values() for kind, what in b.cache_kinds.items()}


def compiler(target) -> Compiler:
    """The backend's compiler; a one-line BackendError where it registered none."""
    found = for_target(target).compiler
    if found is None:
        raise BackendError(f"backend {target.backend!r} registers no compiler: `gir compile` cannot build "
                           f"{target.name} kernels")
    return found


def lowering_check(target) -> Callable:
    """`check(graph)`: None when the target's emitter lowers every kernel of the graph, else why
    not. The planner asks this before it keeps a fused structure; a target whose backend is
    not registered (a port in progress, a hand-made Target) is not asked."""
    from .kernels import EmitError, split_kernels
    try:
        emitter = for_target(target).emitter(target)
    except BackendError:
        return lambda graph: None

    def check(graph) -> str | None:
        try:
            for k in split_kernels(graph):
                emitter.kernel_source(k)
        except EmitError as err:
            return str(err)
        return None
    return check
