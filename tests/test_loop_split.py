"""Element loops split into rows (gir/backends/loop_split.py): every rewritten index names the
same element as before for every k, a loop is split only on a row of at least MIN_ROW that
divides its count, and a body it cannot read (a loop inside) is left alone. The kernels it
rewrites are run against the interpreter in tests/test_cpu_loop_forms.py (the `rows-` cases)."""
import re

import pytest

from gir.backends.loop_split import MIN_ROW, row_length, split_row_loops

PRAGMA = "#pragma omp simd"


def _loop(count: int, body: list[str]) -> list[str]:
    return ["  " + PRAGMA, f"  for (int k = 0; k < {count}; ++k) {{", *["    " + ln for ln in body], "  }"]


def _indices(line: str) -> list[str]:
    """The index texts of the line's array accesses, as Python (C integer division of
    non-negative ints is floor division)."""
    out = []
    for m in re.finditer(r"\w\[", line):
        depth, start = 0, m.end()
        for j in range(start, len(line)):
            depth += {"[": 1, "]": -1}.get(line[j], 0)
            if depth < 0:
                out.append(line[start:j].replace(" / ", " // "))
                break
    return out


@pytest.mark.parametrize("count,body", [
    (4096, ["r_out__k = g_x[4096*b0 + k] - r_max[(k_o_unused*0 + (k / 128))];"]),
    (3072, ["y[k] = a[(k / 256)] + b[(k % 512)] + c[(k % 48)] + d[(k / 24)] + e[(k % 3072)];"]),
    (6144, ["y[k] = a[((k / 768) % 4)] + gamma[(k % 768)] + s[(k / 1536)];"]),
    (2048, ["y[k] = w[(k % 64)] * v[(k / 64)];"]),
])
def test_every_rewritten_index_names_the_same_element(count, body):
    out = split_row_loops(_loop(count, body), PRAGMA)
    row = row_length(count, body)
    assert row is not None and count % row == 0 and row >= MIN_ROW
    assert out[0].strip() == f"for (int k_o = 0; k_o < {count // row}; ++k_o) {{", out
    assert out[1].strip() == PRAGMA and out[3].strip() == f"const int k = k_o*{row} + k_i;"
    before, after = _indices(body[0]), _indices(out[4])
    assert len(before) == len(after) and before != after
    for k in range(count):
        env = {"k": k, "k_o": k // row, "k_i": k % row, "k_o_unused": 0, "b0": 0}
        assert [eval(b, env) for b in before] == [eval(a, env) for a in after], k


def test_a_loop_is_split_on_the_least_row_that_divides_it():
    assert row_length(4096, ["y[k] = a[(k / 128)] + b[(k / 32)];"]) == 32
    assert row_length(4096, ["y[k] = a[(k / 8)] + b[(k / 256)];"]) == 256  # 8 is under MIN_ROW
    assert row_length(1000, ["y[k] = a[(k / 128)];"]) is None  # 128 does not divide 1000
    assert row_length(128, ["y[k] = a[(k % 128)];"]) is None  # the whole loop is one row
    assert row_length(4096, ["y[k] = a[k];"]) is None


def test_loops_it_cannot_read_stay_as_they_are():
    nested = _loop(4096, ["for (int j = 0; j < 4; ++j) y[k] += a[(k / 128)];"])
    assert split_row_loops(nested, PRAGMA) == nested
    plain = ["  " + ln for ln in _loop(4096, ["y[k] = a[(k / 128)];"])[1:]]  # no SIMD pragma
    assert split_row_loops(plain, PRAGMA) == plain
    # `2*k / 128` is (2*k) / 128: not the parenthesised form the rewrite matches
    scaled = _loop(4096, ["y[k] = a[2*k / 128];"])
    assert split_row_loops(scaled, PRAGMA) == scaled
