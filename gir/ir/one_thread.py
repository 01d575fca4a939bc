"""Which CPU kernels run on one thread: the rule the C emitter and the time model share.

A kernel that moves fewer bytes than one thread streams while the OpenMP team forks and joins
gains nothing from a second thread, and a model of many small kernels (ShuffleNet, GPT-2
decode) paid more in forks than in work: ShuffleNet-v2 ran 16.6 ms with two threads against
5.8 ms with one when waits were passive. The bound (the CPU target's `serial_below_bytes`,
1 MiB) is set by a fork whose threads sleep: 38 us measured by `gir calibrate` with passive
waits, which is also what a fork costs when another process holds a core. With the engine's
1000 spins (gir/backends/cpu/compiler.py) an idle fork of awake threads measures 2.4 us, and a
bound from that (76 KB) made ShuffleNet-v2 faster idle (4.47 -> 3.70 ms) but 3.8x slower with
a busy core against 2.45x (results/bench_cpu.md, run 6): the bound stays at 1 MiB.
Such a kernel is a plain loop, called without a team.
"""
from __future__ import annotations

from .dtypes import itemsize


def runs_on_one_thread(dram_buffers, target) -> bool:
    """`dram_buffers`: the DRAM buffers a kernel reads or writes (whole: an upper bound on what
    it moves). True where the target runs such a kernel without forking a team."""
    limit = target.timing.serial_below_bytes
    return bool(limit) and sum(b.size * itemsize(b.dtype) for b in dram_buffers) < limit
