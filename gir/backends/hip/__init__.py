"""HIP backend: emitted HIP compiled by hiprtc (no GPU needed), launched through hip-python
where an AMD GPU is. The four names below are what every backend exposes (docs/PORTING.md);
the registration is what the CLI and gir.Session find it by (gir/backends/registry.py)."""
from functools import lru_cache

from ..device_engine import device_engine
from ..launcher_base import launch_graph
from ..registry import Backend, Compiler, TargetEntry, register
from .compiler import toolchain_version
from .emitter import HipEmitter as Emitter
from .emitter import compile
from .target import MI100, MI250X


def describe():
    return MI250X


@lru_cache(maxsize=None)
def _launcher():
    from .launcher import HipLauncher
    return HipLauncher()  # NoDeviceError without a HIP runtime and GPU


def run(graph, feeds: dict) -> dict:
    launcher = _launcher()
    return launch_graph(launcher, compile(graph), graph, feeds)


def _toolchain():
    from .compiler import compile_hip
    return Emitter, compile_hip, None


def _new_launcher():
    from .launcher import HipLauncher
    return HipLauncher()


register(Backend(
    name="hip", emitter=Emitter, module=__name__,
    targets=(TargetEntry("hip:gfx908", lambda: MI100, ("mi100",)),
             TargetEntry("hip:gfx90a", lambda: MI250X, ("mi250x",))),
    compiler=Compiler(compile, ".hip", toolchain_version,
                      binaries=lambda c, target: {f".{target.arch}.co": c.binary.code}),
    engine=device_engine(("gir[rocm]", ("hip",)), _new_launcher, _toolchain),
    cache_kinds={"hip": "hiprtc code objects, by source and architecture"},
))

__all__ = ["Emitter", "compile", "describe", "run"]
