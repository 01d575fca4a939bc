"""OpenCL backend, built with the porting kit (docs/PORTING.md): runs on any OpenCL device,
in CI on the CPU through PoCL. The four names below are what every backend exposes."""
from .compiler import compile, run
from .device import describe
from .emitter import OpenCLEmitter as Emitter

__all__ = ["Emitter", "compile", "describe", "run"]
