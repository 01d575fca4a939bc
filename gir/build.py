"""Emit and compile every fused kernel of a plan with its target's registered compiler
(gir/backends/registry.py), one step after another or in `jobs` worker processes.

Why processes and not threads: NVRTC and hiprtc release the GIL, but emitting the source is
Python and holds it (a quarter of a BERT-base build), so only processes scale both. The
workers are forked: they inherit the plan, so a step's index goes out and only its files and
launch list come back. Compiled binaries land in the compile cache (gir/cache.py), which
every worker reads and writes safely.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from gir.backends.kernels import GATHER_FLAG
from gir.backends.registry import compiler

@dataclass
class BuiltStep:
    index: int                  # position in plan.steps
    source: str
    binaries: dict[str, bytes]  # file suffix (".ptx", ".cubin", ".gfx90a.co") -> contents
    launches: list[dict]        # per kernel, in launch order: name, grid, block, shared memory, parameters


def toolchain_version(target) -> str:
    """The version of the compiler that builds the target's kernels (a cache key part)."""
    return compiler(target).toolchain_version()


def source_suffix(target) -> str:
    """The file suffix of the target's kernel sources in `gir compile` outputs (".cu", ".c")."""
    return compiler(target).suffix


def build_steps(plan, jobs: int = 1, on_built=None) -> list[BuiltStep]:
    """One BuiltStep per kernel step of `plan`, in plan order. `on_built(done, total, step)` is
    called as each finishes. Backend errors (CompileError, ResourceError, ToolchainMissingError)
    propagate unchanged."""
    global _PLAN
    indices = [i for i, step in enumerate(plan.steps) if hasattr(step, "graph")]
    built = []
    if jobs <= 1 or len(indices) <= 1:
        for i in indices:
            built.append(_build_step(plan, i))
            if on_built:
                on_built(len(built), len(indices), built[-1])
        return built
    _PLAN = plan
    try:
        with ProcessPoolExecutor(min(jobs, len(indices)), mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_build_forked, i) for i in indices]
            try:
                for future in as_completed(futures):
                    built.append(future.result())
                    if on_built:
                        on_built(len(built), len(indices), built[-1])
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
    finally:
        _PLAN = None
    return sorted(built, key=lambda b: b.index)


_PLAN = None  # the plan a forked worker builds from


def _build_forked(index: int) -> BuiltStep:
    return _build_step(_PLAN, index)


def _registers(compiled, name: str) -> dict:
    """The compiler's register count of one kernel, where it reports one (the GPU compilers)."""
    res = getattr(getattr(compiled, "binary", None), "resources", {}).get(name)
    if res is None:
        return {}
    return {"registers": res.registers, **({"spilled_stack_bytes": res.stack_bytes} if res.spilled else {})}


def _compiled_estimate(graph, compiled) -> dict:
    """The time model's figures for the step with the compiled kernels' registers (the most any
    of its kernels uses): occupancy as the hardware will see it, not as the IR estimated it."""
    from gir.fusion.perf import estimate
    regs = [r.registers for r in getattr(getattr(compiled, "binary", None), "resources", {}).values()]
    if not regs:
        return {}
    e = estimate(graph, registers_per_lane=max(regs))
    return {"modelled_us": round(e.seconds * 1e6, 3), "modelled_occupancy": round(e.occupancy, 3),
            "modelled_peak_share": round(e.bandwidth_share(graph.target), 4)}


def _build_step(plan, index: int) -> BuiltStep:
    graph, target = plan.steps[index].graph, plan.target
    built_by = compiler(target)
    compiled = built_by.compile(graph, target)
    binaries = built_by.binaries(compiled, target)
    flag = [{"flag": GATHER_FLAG, "dtype": "int32", "elements": 1, "written": True}] if built_by.flag_parameter else []
    compiled_model = _compiled_estimate(graph, compiled)
    launches = [{"kernel": k.name, "grid": [k.num_blocks], "block": [k.block_threads], "shared_bytes": k.shared_bytes,
                 **compiled_model, **_registers(compiled, k.name),
                 "params": [{"buffer": b.name, "dtype": b.dtype, "elements": b.size, "written": b.name in k.written}
                            for b in k.params] + (flag if k.gathers else [])}
                for k in compiled.kernels]
    return BuiltStep(index, compiled.source, binaries, launches)
