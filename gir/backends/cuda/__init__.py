"""CUDA backend: emitted CUDA C++ compiled by NVRTC (no GPU needed), launched through the
driver API where a GPU is. The four names below are what every backend exposes (docs/PORTING.md);
the registration is what the CLI and gir.Session find it by (gir/backends/registry.py)."""
from functools import lru_cache

from ..device_engine import device_engine
from ..launcher_base import launch_graph
from ..registry import Backend, Compiler, TargetEntry, register
from .compiler import toolchain_version
from .emitter import CudaEmitter as Emitter
from .emitter import compile
from .target import A100, H100


def describe():
    return H100


@lru_cache(maxsize=None)
def _launcher():
    from .launcher import CudaLauncher
    return CudaLauncher()  # NoDeviceError without a driver and GPU


def run(graph, feeds: dict) -> dict:
    launcher = _launcher()
    return launch_graph(launcher, compile(graph), graph, feeds)


def _toolchain():
    from .compiler import compile_cuda
    from .emitter import STATIC_SHARED
    return Emitter, compile_cuda, STATIC_SHARED


def _new_launcher():
    from .launcher import CudaLauncher
    return CudaLauncher()


register(Backend(
    name="cuda", emitter=Emitter, module=__name__,
    targets=(TargetEntry("cuda:sm_80", lambda: A100, ("a100",)), TargetEntry("cuda:sm_90", lambda: H100, ("h100",))),
    compiler=Compiler(compile, ".cu", toolchain_version,
                      binaries=lambda c, target: {".ptx": c.binary.ptx.encode(), ".cubin": c.binary.cubin}),
    engine=device_engine(("gir[cuda]", ("nvmath", "cuda.bindings")), _new_launcher, _toolchain),
    cache_kinds={"cuda": "NVRTC PTX and cubin, by source and architecture"},
))

__all__ = ["Emitter", "compile", "describe", "run"]
