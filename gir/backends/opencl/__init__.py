"""OpenCL backend, built with the porting kit (docs/PORTING.md): runs on any OpenCL device,
in CI on the CPU through PoCL. The four names below are what every backend exposes; the
registration is what the CLI and gir.Session find it by (gir/backends/registry.py)."""
from ..registry import Backend, Compiler, Engine, TargetEntry, register
from .compiler import compile, run, toolchain_version
from .device import describe
from .emitter import OpenCLEmitter as Emitter


def _open_engine(target, model):
    from .engine import open_engine
    return open_engine(target, model)


register(Backend(
    name="opencl", emitter=Emitter, module=__name__,
    targets=(TargetEntry("opencl", describe, on_device=True),),
    compiler=Compiler(compile, ".cl", toolchain_version),
    engine=Engine(lambda target, model: _open_engine(target, model)),
))

__all__ = ["Emitter", "compile", "describe", "run"]
