"""What the conformance suite does not reach in the OpenCL backend: driver errors become one
line, injected off-by-one bugs are caught, and the emitted OpenCL C keeps to the language.

The checks run in a spawned worker (as the conformance suite's do): PoCL's LLVM and hiprtc's
abort when loaded into one process, and other test files use hiprtc here."""
from __future__ import annotations

import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor

import pytest

from backend_cases import compare, seeded_feeds, template_cases


@pytest.fixture(scope="module")
def pocl():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield lambda fn, *args: pool.submit(fn, *args).result()


def chunk_graph():
    """An elementwise case on its `chunk` structure: y = (a + b) * a, rows of 33."""
    from gir.ir import get_target
    from gir.templates import candidates
    op, ts = template_cases()["elementwise-(7, 33)-(33,)"]
    graph = next(c.graph for c in candidates(op, ts, get_target("opencl")).candidates if c.structure == "chunk")
    return graph, seeded_feeds(op, ts, "injected")


def shift(source: str, pattern: str) -> str:
    m = re.search(pattern, source)
    assert m, f"{pattern!r} not in the emitted source"
    return source[:m.start(1)] + f"{m.group(1)} - 1" + source[m.end(1):]


MUTATIONS = {"load": lambda s: shift(s, r"= [^;]*?\bg_a\[([^\]]+)\]"),  # read the input one element early
             "store": lambda s: shift(s, r"\bg_y\[([^\]]+)\] =")}       # write the output one element early


def injected_bug(mutation: str) -> str | None:
    """The name of the error that caught the mutation, or None when it went unnoticed."""
    from gir.backends import opencl
    from gir.backends.kernels import OutOfBoundsError
    from gir.ir import run
    graph, feeds = chunk_graph()
    want = run(graph, feeds).outputs
    compare(opencl.run(graph, feeds), want, "unmodified")
    try:
        compare(opencl.run(graph, feeds, edit=MUTATIONS[mutation]), want, "mutated")
    except (AssertionError, OutOfBoundsError) as err:
        return type(err).__name__
    return None


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_injected_off_by_one_is_caught(pocl, mutation):
    assert pocl(injected_bug, mutation) is not None


def build_error() -> tuple[str, str]:
    from gir.backends.opencl.compiler import BuildError, build
    from gir.backends.opencl.device import device
    try:
        build("__kernel void broken(__global float* x) { x[0] = undefined_name; }", "broken")
    except BuildError as err:
        return str(err).splitlines()[0], device().name
    return "", ""


def test_build_error_is_one_line_naming_source_device_and_error(pocl):
    first, device = pocl(build_error)
    assert first.startswith("OpenCL source of 'broken': compilation for ") and device in first
    assert "undefined_name" in first


def emitted(case: str) -> str:
    from gir.backends.kernels import emit_graph
    from gir.backends.opencl import Emitter
    from gir.ir import get_target
    from gir.templates import candidates
    op, ts = template_cases()[case]
    target = get_target("opencl")
    graph = next(c.graph for c in candidates(op, ts, target).candidates if c.structure == "block")
    return emit_graph(Emitter(target), graph)[0]


def test_block_reduction_uses_local_memory_and_work_group_barriers(pocl):
    source = pocl(emitted, "reduce-sum-(7, 33)-(1,)")
    assert "__local float s_" in source and "barrier(CLK_LOCAL_MEM_FENCE);" in source
    assert "__kernel void" in source and "__global const float* restrict g_x" in source
    assert not re.search(r"\blong long\b|__syncthreads|threadIdx", source.split("#endif", 1)[1])


def gather_flag_outcomes() -> list[str]:
    """Per index: what opencl.run does with a Gather of rows [0, index, 1] from a [5, 6] table."""
    import numpy as np

    from gir.backends import opencl
    from gir.backends.errors import IndexOutOfRange
    from gir.frontend.basic import BasicOp
    from gir.ir import get_target
    from gir.templates import candidates
    from test_templates import T
    ts = {"d": T("d", (5, 6)), "i": T("i", (3,), "int64", np.array([0, 1, 2])), "y": T("y", (3, 6))}
    op = BasicOp("g", "gather", ["d", "i"], ["y"], {"axis": 0}, "g")
    graph = candidates(op, ts, get_target("opencl")).candidates[0].graph
    d = np.arange(30, dtype=np.float32).reshape(5, 6)
    out = []
    for index in (4, -5, 5, -6, 10**6):
        try:
            y = opencl.run(graph, {"d": d, "i": np.array([0, index, 1])})["y"]
            out.append("ok" if np.array_equal(y, d[[0, index, 1]]) else "wrong")
        except IndexOutOfRange:
            out.append("raised")
    return out


def test_opencl_kernels_report_an_out_of_range_gather_index(pocl):
    assert pocl(gather_flag_outcomes) == ["ok", "ok", "raised", "raised", "raised"]


# -- through the registry: gir.Session, `gir compile` and `gir run` on target "opencl" -----------
def session_errors(names: tuple[str, ...]) -> dict[str, float]:
    """Per bundled model: the largest error of gir.Session(target="opencl") against onnxruntime,
    relative to the output's largest magnitude, over two different inputs (the second run of a
    session reuses its resident buffers)."""
    import numpy as np
    import onnxruntime as ort

    import models
    from gir.runtime import Session
    errors = {}
    for name in names:
        proto = models.load_bundled(name)
        session = Session(proto, target="opencl", limit=1)
        assert type(session.engine).__name__ == "OpenCLEngine"
        ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        worst = 0.0
        for seed in (0, 1):
            feeds = models.example_inputs(proto, seed)
            for got, want in zip(session.run(None, feeds), ref.run(None, feeds)):
                worst = max(worst, float(np.max(np.abs(got - want))) / max(1.0, float(np.abs(want).max())))
        errors[name] = worst
    return errors


def test_session_on_opencl_matches_onnxruntime(pocl):
    errors = pocl(session_errors, ("sardrn", "gpt2"))
    assert all(e < 1e-5 for e in errors.values()), errors


def computed_gather_outcomes() -> list[str]:
    """A Gather whose indices a kernel computes (ids + 1) on the OpenCL engine: per ids[1, 2]."""
    import numpy as np

    from gir.runtime import Session
    from gir.runtime.indices import GatherIndexError
    from test_session import _computed_gather
    session = Session(_computed_gather(), target="opencl", limit=1)
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    ok = np.array([[0, 1, 2], [-2, -6, 3]], np.int64)
    out = []
    for index in (3, 4, -7, 10**6):
        ids = ok.copy()
        ids[1, 2] = index
        try:
            (y,) = session.run(None, {"ids": ids})
            out.append("ok" if np.array_equal(y, table[ids + 1]) else "wrong")
        except GatherIndexError as err:
            out.append("raised" if "node 'lookup' (Gather" in str(err) else str(err))
        (y,) = session.run(None, {"ids": ok})  # the flag was cleared
        assert np.array_equal(y, table[ok + 1])
    return out


def test_opencl_engine_reports_a_computed_out_of_range_index(pocl):
    assert pocl(computed_gather_outcomes) == ["ok", "raised", "raised", "raised"]


def test_cli_compiles_and_runs_a_bundled_model_on_opencl(tmp_path):
    """In processes of their own: `gir compile` writes OpenCL C and plan.json, `gir run` matches
    onnxruntime."""
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np
    import onnxruntime as ort

    import models
    repo = Path(__file__).resolve().parent.parent
    model, proto = models.bundled_path("bert"), models.load_bundled("bert")

    def gir(*args):
        done = subprocess.run([sys.executable, "-m", "gir.cli", *args, "--target", "opencl", "--limit", "1", "--quiet"],
                              cwd=repo, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout
    out = gir("compile", str(model), "-o", str(tmp_path / "out"))
    assert "kernel launches (OpenCL" in out and (tmp_path / "out" / "plan.json").is_file()
    assert "__kernel void" in next((tmp_path / "out" / "kernels").glob("k*.cl")).read_text()
    feeds = models.example_inputs(proto, 0)
    np.savez(tmp_path / "x.npz", **feeds)
    gir("run", str(model), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"))
    got = np.load(tmp_path / "y.npz")
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for output, w in zip(proto.graph.output, want):
        np.testing.assert_allclose(got[output.name], w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())))
