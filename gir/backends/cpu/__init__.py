"""CPU port: the GIR target `cpu` emitted as C11 + OpenMP and run through ctypes. The four
names below are what every backend exposes (docs/PORTING.md)."""
from gir.ir.target import local_cpu as describe

from .compiler import compile, run
from .emitter import CpuEmitter as Emitter

__all__ = ["Emitter", "compile", "describe", "run"]
