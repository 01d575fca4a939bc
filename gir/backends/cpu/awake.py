"""Which small CPU kernels fork the team anyway, so that its threads are awake for the next
big one.

A kernel under the serial bound runs on one thread (gir/ir/one_thread.py). While it runs, the
team's threads spin for `Timing.spin_s` (20 us) and then sleep; the next kernel that forks
wakes them, which costs `wake_s` and more. GPT-2 decode runs three small attention kernels (QK,
softmax, P @ V: about 90 us on one thread) between two GEMVs that fork, and its attention
projection paid the wake-up in every layer: 12 x 0.15 ms at two threads against 12 x 0.08 ms
with the team spinning throughout (a 2-core Intel VM, session 25). So, between two calls that
fork, where the one-thread work would outlast the spin, the kernels that would carry it past
the spin fork too: each then costs an awake fork (`launch_latency_s`), the gaps between forks stay
under the spin, and the next big kernel finds the team awake.

The rule runs on the plan's launch order, after planning (the time model ranks each kernel on
its own, which the sequence does not change), and only between two GIR kernels that fork: a
library op's threads are chosen when the engine makes it, timed as it finds the pool (small
oneDNN ops often run on one thread), so a stretch that a library op bounds is left as it is.
"""
from __future__ import annotations

from gir.frontend.basic import BasicOp
from gir.ir.one_thread import runs_on_one_thread


def woken_kernels(plan, launches) -> frozenset[str]:
    """Names of the kernels of `launches` (as `kernels.plan_launches` lists them) that run on
    one thread by their bytes but fork to keep the team awake (see the module doc)."""
    t = plan.target
    spin = t.timing.spin_s
    if not spin or t.processors < 2:
        return frozenset()
    forks, seconds = [], []
    for launch in launches:
        if isinstance(launch, BasicOp):
            forks.append(None)  # decided when the engine makes it
            seconds.append(0.0)
            continue
        i, k = launch
        forks.append(not runs_on_one_thread(k.params, t))
        est = plan.steps[i].estimate
        seconds.append(est.seconds / max(est.kernels, 1))
    woken = set()
    before = None  # the last kernel that forks, with only one-thread kernels after it
    for c, fork in enumerate(forks):
        if fork is None:
            before = None
            continue
        if not fork:
            continue
        if before is not None and sum(seconds[before + 1:c]) > spin:
            gap = 0.0
            for j in range(before + 1, c):
                k = launches[j][1]
                if gap + seconds[j] > spin and k.prim.num_units > 1:
                    woken.add(k.name)
                    gap = 0.0
                else:
                    gap += seconds[j]
        before = c
    return frozenset(woken)
