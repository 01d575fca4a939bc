"""Each step of a native CPU session timed alone (`gir run --profile`): its time, its DRAM bytes,
GB/s, and that against this machine's own copy bandwidth, measured here the same way.

Why alone and in order: a kernel's inputs are what the steps before it wrote, so the steps run
in plan order and each is repeated where it stands (its inputs are live there; nothing it
reads is overwritten by itself). A step's DRAM bytes are the plan's distinct footprint
(`Estimate.dram_bytes`, modelled: re-reads served by caches are not counted), or a library
op's operands and result. Data that fits in the caches is re-read from them by the repeats, so
a small step can show more GB/s than DRAM gives: the table marks steps under 1 MB. Next to each
GIR kernel's measured time stands the time model's (gir/fusion/perf.py, calibrated by
`gir calibrate` where it has run), so the two can be compared kernel by kernel."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from gir.frontend.basic import BasicOp
from gir.ir.across_units import form
from gir.ir.dtypes import np_dtype

from ..kernels import split_kernels

COPY_BYTES = 256 << 20  # per buffer: larger than any LLC of these machines


@dataclass
class StepTime:
    step: int
    name: str
    kind: str          # "kernel" (GIR) or the library op's kind
    launches: int
    seconds: float     # median of the repeats
    dram_bytes: int
    modelled_s: float | None = None  # the time model's figure (GIR kernels; gir/fusion/perf.py)
    form: str = ""     # how the emitter runs its kernels (gir/ir/across_units.py form)

    @property
    def gbps(self) -> float:
        return self.dram_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def copy_bandwidth(repeat: int = 5) -> float:
    """Bytes per second (read + write) of a C copy loop over the engine's OpenMP threads, built
    with the engine's own compiler and flags (`gir calibrate`'s probe): the ceiling a streaming
    kernel can reach here."""
    from .calibration import copy_bandwidth as measured
    return measured(COPY_BYTES, repeat)


def profile(session, feeds: dict, repeat: int = 20) -> list[StepTime]:
    """Per plan step, in order: the median time of `repeat` runs of that step alone."""
    engine = session.engine
    if not hasattr(engine, "bind"):
        raise ValueError(f"{session.graph.model_name}: profiling times the native CPU engine's kernels; "
                         f"this session runs {type(engine).__name__}")
    session.run(None, feeds)  # checks the feeds and warms the library and the arena
    plan, g = session.plan, session.graph
    _, thunks = engine.bind({n: np.asarray(feeds[n]) for n in g.inputs})  # `_` holds the run's buffers
    launches, woken = engine.emitted[1:]
    # steps whose small kernels fork only to keep the team awake (gir/backends/cpu/awake.py)
    awake = {launch[0] for launch in launches if not isinstance(launch, BasicOp) and launch[1].name in woken}
    by_step: dict[int, list] = {}
    for step, thunk in zip(engine.call_steps, thunks):
        by_step.setdefault(step, []).append(thunk)
    out = []
    for step, calls in by_step.items():
        def run_step(calls=calls):
            for call in calls:
                call()
        run_step()
        seconds = float(np.median([_timed(run_step) for _ in range(repeat)]))
        s = plan.steps[step]
        if isinstance(s, BasicOp):
            ts = plan.graph.tensors  # a library op may read a constant the planner made (an epilogue's bias)
            nbytes = sum(ts[t].size * np_dtype(ts[t].dtype).itemsize for t in (*s.inputs, *s.outputs))
            out.append(StepTime(step, s.name, s.kind, 1, seconds, nbytes))
        else:
            forms = dict.fromkeys(form([op for _, op in k.ops], k.prim, k.buffers) for k in split_kernels(s.graph))
            out.append(StepTime(step, s.name, "kernel", len(calls), seconds, s.estimate.dram_bytes, s.estimate.seconds,
                                " + ".join(forms) + (" (forks: team awake)" if step in awake else "")))
    return out


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def table(rows: list[StepTime], copy_bps: float) -> str:
    """One line per step and a summary of the GIR kernels of 1 MB or more."""
    lines = [f"{'step':>4}  {'kind':<8} {'launches':>8} {'time us':>10} {'model us':>9} {'MB':>9} {'GB/s':>8} {'% copy':>7}  "
             f"{'form':<22} name"]
    for r in rows:
        small = " (<1 MB: caches)" if r.dram_bytes < 1 << 20 else ""
        modelled = f"{r.modelled_s * 1e6:>9.1f}" if r.modelled_s is not None else f"{'-':>9}"
        lines.append(f"{r.step:>4}  {r.kind:<8} {r.launches:>8} {r.seconds * 1e6:>10.1f} {modelled} {r.dram_bytes / 1e6:>9.3f} "
                     f"{r.gbps:>8.2f} {100 * r.gbps * 1e9 / copy_bps:>6.1f}%  {r.form or '-':<22} {r.name[:60]}{small}")
    big = [100 * r.gbps * 1e9 / copy_bps for r in rows if r.kind == "kernel" and r.dram_bytes >= 1 << 20]
    lines.append(f"copy bandwidth here (C loop, OpenMP, {2 * COPY_BYTES >> 20} MB moved): {copy_bps / 1e9:.1f} GB/s")
    if big:
        lines.append(f"GIR kernels of 1 MB or more: {len(big)}, median {np.median(big):.1f}% of copy bandwidth, "
                     f"lowest {min(big):.1f}%")
    total = sum(r.seconds for r in rows)
    lines.append(f"steps timed alone: {total * 1e3:.3f} ms in all, "
                 f"{sum(r.seconds for r in rows if r.kind == 'kernel') * 1e3:.3f} ms in GIR kernels")
    return "\n".join(lines)


def report(session, feeds: dict, repeat: int = 20) -> str:
    """What `gir run --profile` prints (the CPU engine registers it as Engine.profile)."""
    return table(profile(session, feeds, repeat), copy_bandwidth())
