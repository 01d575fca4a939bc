"""Transposing copies on the CPU run as 16x16 tiles (gir/ir/transpose_tiles.py, the CPU
emitter's transpose_tiles): every layout candidate that takes the form is checked element for
element against the reference interpreter, with ragged tile edges and in dtypes with and
without the prelude's gir_tile16."""
import numpy as np
import pytest

from gir.backends.cpu import compiler as cpu
from gir.backends.cpu.emitter import CpuEmitter
from gir.backends.kernels import split_kernels
from gir.frontend.basic import BasicOp
from gir.fusion.perf import _program
from gir.ir import get_target, run
from gir.ir.transpose_tiles import transpose_copy
from gir.templates import candidates

from backend_cases import seeded_feeds
from test_templates import T

CPU = get_target("cpu")


def _k_transpose(seq: int, dtype: str):
    """BERT's K^T: a [seq, 768] activation viewed as [12 heads, 64, seq]."""
    ts = {"x": T("x", (seq, 768), dtype), "y": T("y", (12, 64, seq), dtype)}
    op = BasicOp("kt", "layout", ["x"], ["y"], {"offset": 0, "shape": (12, 64, seq), "strides": (64, 1, 768)}, "kt")
    return op, ts


def _tiled(op, ts):
    out = []
    for cand in candidates(op, ts, CPU).candidates:
        kernels = split_kernels(cand.graph)
        if any(transpose_copy([o for _, o in k.ops], k.buffers, k.prim) for k in kernels):
            out.append((cand, kernels))
    return out


@pytest.mark.parametrize("seq,dtype", [(197, "float32"), (128, "float32"), (40, "int64"), (197, "float64")])
def test_transposing_copies_match_the_interpreter(seq, dtype):
    op, ts = _k_transpose(seq, dtype)
    tiled = _tiled(op, ts)
    assert tiled, "no layout candidate takes the tiled form"
    feeds = seeded_feeds(op, ts, f"kt-{seq}-{dtype}")
    want = run(tiled[0][0].graph, feeds).outputs["y"]
    np.testing.assert_array_equal(want, feeds["x"].reshape(seq, 12, 64).transpose(1, 2, 0))
    for cand, kernels in tiled:
        source = "\n".join(CpuEmitter(CPU).kernel_source(k) for k in kernels)
        assert "for (int c0 = 0;" in source and " % " not in source and " / " not in source  # no per-element index math
        assert ("gir_tile16(" in source) == (dtype == "float32")
        np.testing.assert_array_equal(cpu.run(cand.graph, feeds)["y"].reshape(want.shape), want, err_msg=cand.label)


def test_the_time_model_counts_the_tiles_as_vector_loads(monkeypatch):
    """The per-unit form gathers an element an instruction; the tiled one loads vectors."""
    import gir.fusion.perf as perf
    cand, _ = _tiled(*_k_transpose(197, "float32"))[0]
    tiled = _program(cand.graph).instructions
    monkeypatch.setattr(perf, "transpose_copy", lambda *a: None)
    gathered = _program(cand.graph).instructions
    assert tiled * 4 < gathered, (tiled, gathered)


def test_a_copy_along_the_rows_is_not_a_transpose():
    ts = {"x": T("x", (64, 96)), "y": T("y", (64, 96))}
    op = BasicOp("c", "layout", ["x"], ["y"], {"offset": 0, "shape": (64, 96), "strides": (96, 1)}, "c")
    assert not _tiled(op, ts)
