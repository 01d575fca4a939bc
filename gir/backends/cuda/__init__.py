"""CUDA backend: emitted CUDA C++ compiled by NVRTC (no GPU needed), launched through the
driver API where a GPU is. The four names below are what every backend exposes (docs/PORTING.md)."""
from functools import lru_cache

from gir.ir.target import PRESETS

from ..launcher_base import launch_graph
from .emitter import CudaEmitter as Emitter
from .emitter import compile


def describe():
    return PRESETS["h100"]


@lru_cache(maxsize=None)
def _launcher():
    from .launcher import CudaLauncher
    return CudaLauncher()  # NoDeviceError without a driver and GPU


def run(graph, feeds: dict) -> dict:
    launcher = _launcher()
    return launch_graph(launcher, compile(graph), graph, feeds)


__all__ = ["Emitter", "compile", "describe", "run"]
