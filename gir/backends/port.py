"""What a backend is, for the porting kit: a package (a folder under gir/backends/, or any
folder) whose __init__ exposes the four names of INTERFACE and registers the backend
(registry.py). The conformance suite (tests/conformance, `pytest --backend NAME`) and
`gir port new` both hold backends to it.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from .registry import BackendError

INTERFACE = {
    "Emitter": "the emitter dialect: a subclass of gir.backends.cstyle.CStyle",
    "describe": "describe() -> Target: the hardware description",
    "compile": "compile(graph, target=None) -> CompiledGraph: emit and build every kernel",
    "run": "run(graph, feeds) -> {output: array}: launch on this machine (NoDeviceError if it cannot)",
}


def __getattr__(name: str):
    """`BUILTIN`: the backends registered from folders under gir/backends/."""
    if name == "BUILTIN":
        return builtin()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def builtin() -> tuple[str, ...]:
    from .registry import backends
    return tuple(b.name for b in backends().values() if b.module.startswith("gir.backends."))


def load_backend(spec: str) -> ModuleType:
    """A backend by its registered name (a folder under gir/backends, one on $GIR_BACKEND_PATH,
    an entry point) or by path to its folder."""
    from .registry import backends
    path = Path(spec)
    if path.is_dir():
        module = _import_folder(path.resolve())
    elif spec.isidentifier():
        registered = backends().get(spec)
        try:
            module = importlib.import_module(registered.module if registered else f"gir.backends.{spec}")
        except ModuleNotFoundError as err:
            if err.name != f"gir.backends.{spec}":
                raise
            raise BackendError(f"no backend {spec!r}: not registered ({', '.join(sorted(backends()))}), not a folder "
                               f"under gir/backends/ nor a path to one") from None
    else:
        raise BackendError(f"no backend {spec!r}: not a folder")
    missing = [name for name in INTERFACE if not hasattr(module, name)]
    if missing:
        raise BackendError(f"backend {spec!r} ({module.__file__}) lacks {', '.join(missing)}: "
                           + "; ".join(INTERFACE[m] for m in missing))
    return module


def _import_folder(path: Path) -> ModuleType:
    """Import a backend folder outside gir/ as a package of its own (relative imports work)."""
    init = path / "__init__.py"
    if not init.exists():
        raise BackendError(f"{path} is not a backend folder: no __init__.py")
    name = f"gir_port_{path.name}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
