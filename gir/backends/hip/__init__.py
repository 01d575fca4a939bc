"""HIP backend: emitted HIP compiled by hiprtc (no GPU needed), launched through hip-python
where an AMD GPU is. The four names below are what every backend exposes (docs/PORTING.md)."""
from functools import lru_cache

from gir.ir.target import PRESETS

from ..launcher_base import launch_graph
from .emitter import HipEmitter as Emitter
from .emitter import compile


def describe():
    return PRESETS["mi250x"]


@lru_cache(maxsize=None)
def _launcher():
    from .launcher import HipLauncher
    return HipLauncher()  # NoDeviceError without a HIP runtime and GPU


def run(graph, feeds: dict) -> dict:
    launcher = _launcher()
    return launch_graph(launcher, compile(graph), graph, feeds)


__all__ = ["Emitter", "compile", "describe", "run"]
