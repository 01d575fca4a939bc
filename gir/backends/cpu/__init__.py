"""CPU port: the GIR target `cpu` emitted as C11 + OpenMP and run through ctypes. The four
names below are what every backend exposes (docs/PORTING.md); the registration is what the
CLI and gir.Session find it by (gir/backends/registry.py)."""
import importlib

from ..registry import Backend, Compiler, Engine, TargetEntry, register
from . import spin
from .compiler import compile, run, toolchain_version
from .emitter import CpuEmitter as Emitter
from .target import local_cpu as describe


def _open_engine(target, model):
    from .engine import open_engine
    return open_engine(target, model)


def _profile(session, feeds, repeat):
    from .profile import report
    return report(session, feeds, repeat)


register(Backend(
    name="cpu", emitter=Emitter, module=__name__,
    targets=(TargetEntry("cpu", describe),),
    compiler=Compiler(compile, ".c", toolchain_version, flag_parameter=False),  # the flag is the library's global
    engine=Engine(_open_engine, profile=_profile),
    cache_kinds={"native": "shared libraries of the CPU backend and of the CPU harness, by source",
                 "calibration": "measured constants of this CPU (`gir calibrate`), by CPU model and flags"},
    calibration=lambda: importlib.import_module(f"{__name__}.calibration"),
))
spin.set_spin_window()  # libgomp's wait, in time for this CPU: before anything loads it

__all__ = ["Emitter", "compile", "describe", "run"]
