"""Which CPU kernels run on one thread: the rule the C emitter and the time model share.

A kernel that moves fewer bytes than one thread streams while the OpenMP team forks and joins
gains nothing from a second thread, and a model of many small kernels (ShuffleNet, GPT-2
decode) paid more in forks than in work: ShuffleNet-v2 ran 16.6 ms with two threads against
5.8 ms with one when waits were passive (a fork and join 38 us). The bound is the target's
`serial_below_bytes`: `gir calibrate`'s launch cost x one thread's copy bandwidth (76 KB here
with the engine's 1000 spins, gir/backends/cpu/compiler.py: a fork of awake threads, 2.4 us).
Such a kernel is a plain loop, called without a team.
"""
from __future__ import annotations

from .dtypes import itemsize


def runs_on_one_thread(dram_buffers, target) -> bool:
    """`dram_buffers`: the DRAM buffers a kernel reads or writes (whole: an upper bound on what
    it moves). True where the target runs such a kernel without forking a team."""
    limit = getattr(target.timing, "serial_below_bytes", 0)
    return bool(limit) and sum(b.size * itemsize(b.dtype) for b in dram_buffers) < limit
