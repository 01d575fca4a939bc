"""The backend registry: every backend is found by target name, nothing outside gir/backends/
names one, and a backend scaffolded by `gir port new` into a folder of its own compiles and
runs a bundled model through `gir compile` and `gir run` once its TODO(port) places are filled,
with no other file changing."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import models
from gir.backends import registry

REPO = Path(__file__).resolve().parent.parent
NAMES = re.compile(r"\b(cuda|hip|opencl)\b|\"cpu\"|'cpu'")


def test_built_in_backends_register_their_targets():
    found = {b.name: [e.name for e in b.targets] for b in registry.backends().values()}
    assert found["cpu"] == ["cpu"] and found["opencl"] == ["opencl"]
    assert found["cuda"] == ["cuda:sm_80", "cuda:sm_90"] and found["hip"] == ["hip:gfx908", "hip:gfx90a"]
    assert registry.get_target("h100").backend == "cuda" and registry.get_target("MI250X").arch == "gfx90a"
    assert registry.compiler(registry.get_target("cpu")).suffix == ".c"
    with pytest.raises(KeyError, match=r"unknown target 'nosuch'; known targets: a100, cpu, cuda:sm_80"):
        registry.get_target("nosuch")


def test_no_backend_is_named_outside_the_backends_folder():
    """The CLI, Session, compile driver, cache and planner look backends up by target name."""
    hits = []
    for path in sorted((REPO / "gir").rglob("*.py")):
        if (REPO / "gir" / "backends") in path.parents:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if NAMES.search(line):
                hits.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_a_taken_target_name_is_refused_in_one_line():
    cpu = registry.backend("cpu")
    clash = registry.Backend("clash", cpu.emitter, (registry.TargetEntry("cpu", cpu.targets[0].describe),),
                             module="elsewhere")
    with pytest.raises(registry.BackendError, match=r"^backend 'clash': target name 'cpu' is taken by backend 'cpu'$"):
        registry.register(clash)
    with pytest.raises(registry.BackendError, match=r"^backend 'cpu' of elsewhere is registered already by gir"):
        registry.register(registry.Backend("cpu", cpu.emitter, (), module="elsewhere"))


def test_a_backend_without_an_engine_runs_in_the_interpreter(monkeypatch, capsys, tmp_path):
    """`gir run` says so on stderr and runs the plan's kernels in the reference interpreter."""
    from dataclasses import replace

    from gir.cli import main
    cpu = registry.backend("cpu")
    target = replace(cpu.targets[0].describe(), name="NOENG", backend="noengine")
    monkeypatch.setitem(registry._REGISTERED, "noengine", registry.Backend(
        "noengine", cpu.emitter, (registry.TargetEntry("noengine", lambda: target),), module="test"))
    model = str(models.bundled_path("sardrn"))
    assert main(["run", model, "--target", "noengine", "--limit", "1", "-o", str(tmp_path / "y.npz")]) == 0
    assert "NOENG (noengine) has no native engine yet: running its kernels in the interpreter engine" in \
        capsys.readouterr().err
    assert main(["compile", model, "--target", "noengine", "-o", str(tmp_path / "out")]) == 1
    assert "backend 'noengine' registers no compiler: `gir compile` cannot build NOENG kernels" in capsys.readouterr().err


# A scaffolded backend's TODO(port) places, written with the CPU dialect: what a person porting
# GIR writes into the files `gir port new` made (docs/PORTING.md walks through each one).
FILLED = {
    "device.py": '''"""tdev: this machine's CPU under another backend name."""
from dataclasses import replace

from gir.backends.cpu.target import local_cpu


def describe():
    return replace(local_cpu(), name="TDEV", backend="tdev", arch="host")
''',
    "emitter.py": '''"""The CPU dialect: C11 + OpenMP, a unit's lanes as loop iterations."""
from gir.backends.cpu.emitter import CpuEmitter


class Emitter(CpuEmitter):
    pass
''',
    "compiler.py": '''"""cc builds the kernels; ctypes launches them between guard bytes."""
import ctypes

import numpy as np

from gir.backends.cpu.compiler import build as cc_build
from gir.backends.cpu.compiler import toolchain_version
from gir.backends.kernels import GUARD, CompiledGraph, allocate_dram, check_guards, collect_outputs, emit_graph, with_guards

from .emitter import Emitter

SOURCE_SUFFIX = ".c"


def compile(graph, target=None) -> CompiledGraph:
    source, kernels = emit_graph(Emitter(target or graph.target), graph)
    return CompiledGraph(source, kernels, cc_build(source, graph.name))


def run(graph, feeds: dict) -> dict:
    compiled = compile(graph)
    arrays = allocate_dram(graph, feeds)
    raws = {name: with_guards(a) for name, a in arrays.items()}
    for k in compiled.kernels:
        fn = getattr(compiled.binary, k.name)
        fn.argtypes, fn.restype = [ctypes.c_void_p] * len(k.params), None
        fn(*[raws[b.name].ctypes.data + GUARD for b in k.params])
        for b in k.params:
            check_guards(raws[b.name], arrays[b.name].nbytes, k.name, b.name)
    for name, a in arrays.items():
        a.view(np.uint8)[:] = raws[name][GUARD:GUARD + a.nbytes]
    return collect_outputs(graph, arrays)
''',
}


def gir(*args, env):
    return subprocess.run([sys.executable, "-m", "gir.cli", *args], cwd=REPO, env=env, capture_output=True, text=True)


def test_a_scaffolded_backend_compiles_and_runs_a_bundled_model(tmp_path):
    backends_folder = sorted(p.name for p in (REPO / "gir" / "backends").iterdir())
    env = {**os.environ, registry.PATH_VARIABLE: str(tmp_path / "ports"), "GIR_CACHE_DIR": str(tmp_path / "cache")}
    (tmp_path / "ports").mkdir()
    made = gir("port", "new", "tdev", "--dir", str(tmp_path / "ports"), env=env)
    assert made.returncode == 0 and f"GIR_BACKEND_PATH={tmp_path / 'ports'}" in made.stdout, made.stderr
    folder = tmp_path / "ports" / "tdev"
    for name, text in FILLED.items():
        assert "TODO(port)" in (folder / name).read_text()
        (folder / name).write_text(text)
    init = (folder / "__init__.py").read_text()
    assert "TODO(port)" not in init

    model = models.bundled_path("sardrn")
    built = gir("compile", str(model), "--target", "tdev", "--limit", "1", "--quiet", "-o", str(tmp_path / "out"), env=env)
    assert built.returncode == 0, built.stderr
    assert "(TDEV host)" in built.stdout and (tmp_path / "out" / "plan.json").is_file()
    assert list((tmp_path / "out" / "kernels").glob("k*.c"))

    proto = models.load_bundled("sardrn")
    feeds = models.example_inputs(proto, 0)
    np.savez(tmp_path / "x.npz", **feeds)
    ran = gir("run", str(model), "--target", "tdev", "--limit", "1", "--quiet", "--inputs", str(tmp_path / "x.npz"),
              "-o", str(tmp_path / "y.npz"), env=env)
    assert ran.returncode == 0, ran.stderr
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = np.load(tmp_path / "y.npz")
    for name, w in zip([o.name for o in proto.graph.output], want):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())))
    assert sorted(p.name for p in (REPO / "gir" / "backends").iterdir()) == backends_folder


def test_a_backend_that_fails_to_import_is_named_when_its_target_is_asked_for(tmp_path):
    env = {**os.environ, registry.PATH_VARIABLE: str(tmp_path), "GIR_CACHE_DIR": str(tmp_path / "cache")}
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "__init__.py").write_text("import no_such_module_here\n")
    out = gir("explain", str(models.bundled_path("sardrn")), "--target", "broken", env=env)
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert "unknown target 'broken'" in out.stderr and "ModuleNotFoundError: No module named 'no_such_module_here'" in out.stderr
