"""The CPU build's vector width follows the host's flags (gir/backends/cpu/compiler.py)."""
import platform

from gir.backends.cpu import compiler


def test_512_bit_vectors_only_where_the_cpu_has_avx512(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    spr = "Intel(R) Xeon(R) Processor | fpu sse2 avx2 fma avx512f avx512bw avx512vl amx_tile"
    yes, no = (lambda flags: True), (lambda flags: False)
    assert compiler.wide_vector_flags(spr, yes) == compiler.WIDE_VECTOR_FLAGS
    assert compiler.wide_vector_flags(spr, no) == ()  # a compiler without -mmove-max: all or none
    assert compiler.wide_vector_flags("AMD EPYC | fpu sse2 avx2 fma", yes) == ()
    assert compiler.wide_vector_flags("x | avx512fp16_only_lookalike", yes) == ()  # whole words only
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert compiler.wide_vector_flags(spr, yes) == ()  # gcc on Arm rejects the x86 options


def test_the_compiler_probe_refuses_an_unknown_option():
    assert compiler.compiler_accepts(("-O2",))
    assert not compiler.compiler_accepts(("-mno-such-option-gir",))


def test_flags_are_the_base_flags_plus_the_width():
    extra = [f for f in compiler.FLAGS if f not in compiler.BASE_FLAGS]
    assert extra == list(compiler.wide_vector_flags(compiler.host_cpu()))
    assert compiler.FLAGS[:2] == ("-O3", "-march=native")
