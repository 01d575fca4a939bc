"""Models as torch.onnx writes them (models/exported/, made by scripts/export_models.py), run
without PyTorch: each file matches its PyTorch reference on the CPU target and compiles for
cuda:sm_90 (every kernel through NVRTC, as `gir compile` does).
Which cases wait for the slow tests: see CNNS below.

Relative error: max |gir - torch| / max |torch| over each output (the measure the export script
records for onnxruntime too). PyTorch is made unimportable while these run, so a test that
reached for it would fail.
"""
from __future__ import annotations

import sys

import pytest

import gir
from gir.cache import Store, gir_version
from gir.fusion.plan import plan
from gir.ir import get_target
from models.exported_files import EXPORTED, load_bound, manifest, reference, rel_err

MANIFEST = manifest()
TOLERANCE = 1e-4

# Cases an op still blocks (owner's op not landed by the deadline): {key: reason}, xfail strict.
BLOCKED: dict[str, str] = {}


# What the suite runs, to keep this file near a minute on 2 cores: every dynamo export and
# the TorchScript exports of BERT, GPT-2, Llama, ViT and ShuffleNet-v2 on the CPU target, and the
# cuda:sm_90 compile of the dynamo exports of the transformers and ShuffleNet-v2 (marked slow:
# 10-30 s each to plan and build on these cores). ShuffleNet-v2's exports differ most from the
# bundled model (its channel split becomes Shape/Gather/Slice chains). Left to
# `scripts/exported_report.py --compile`, which plans, runs and builds every file: the
# TorchScript exports of ResNet-50, EfficientNet-B0 and MobileNet-v3 on the CPU (they differ
# from their dynamo exports only in how global pooling and flatten are spelled:
# GlobalAveragePool, Flatten for ReduceMean, Reshape; 40 s of CPU), every TorchScript export's
# sm_90 compile, and that of the dynamo ResNet-50, EfficientNet-B0 and MobileNet-v3 (45, 20 and
# 35 s; the conv, pooling and activation kernels they need are built here for ShuffleNet, and
# the bundled EfficientNet-B0 and RedNet-50 are planned for cuda:sm_90 in
# tests/test_device_runtime.py).
CNNS = {"resnet50", "efficientnet_b0", "shufflenet_v2", "mobilenet_v3"}
SM90_IN_SCRIPT_ONLY = {"resnet50", "efficientnet_b0", "mobilenet_v3"}


def _cpu_in_script_only(entry) -> bool:
    return entry["exporter"] == "torchscript" and entry["model"] in CNNS - {"shufflenet_v2"}


def _slow_sm90(entry) -> bool:
    return entry["model"] in CNNS


def _cases(slow=lambda entry: False, exporters=("dynamo", "torchscript"), skip=lambda entry: False):
    out = []
    for key, entry in MANIFEST.items():
        if entry["exporter"] not in exporters or skip(entry):
            continue
        marks = [pytest.mark.xfail(strict=True, reason=BLOCKED[key])] if key in BLOCKED else []
        if slow(entry):
            marks.append(pytest.mark.slow)
        out.append(pytest.param(key, marks=marks, id=key))
    return out


@pytest.fixture(autouse=True)
def no_torch(monkeypatch):
    """`import torch` raises inside these tests: the committed files are all they may use."""
    monkeypatch.setitem(sys.modules, "torch", None)


def _store(target):
    """The suite's compile cache (tests/conftest.py): the two exports of one network share kernels."""
    return Store("plan", gir_version(), repr(target), 2)


def test_manifest_lists_every_file():
    files = {p.name for p in EXPORTED.glob("*.onnx")}
    assert files == {e["file"] for e in MANIFEST.values()}
    assert {e["exporter"] for e in MANIFEST.values()} == {"dynamo", "torchscript"}
    for entry in MANIFEST.values():
        symbolic = [d for i in entry["inputs"].values() for d in i["shape"] if isinstance(d, str)]
        assert symbolic, f"{entry['file']}: exporters mark batch/sequence dims symbolic; this file has none"


@pytest.mark.parametrize("key", _cases(skip=_cpu_in_script_only))
def test_cpu_matches_pytorch(key):
    entry = MANIFEST[key]
    feeds, want = reference(entry)
    session = gir.Session(load_bound(entry), target="cpu", plan_cache=_store(get_target("cpu")))
    got = session.run(list(want), feeds)
    for (name, expected), value in zip(want.items(), got):
        assert value.shape == expected.shape, name
        err = rel_err(value, expected)
        assert err < TOLERANCE, f"{key} output {name}: rel err {err:.2e}"


@pytest.mark.parametrize("key", _cases(_slow_sm90, exporters=("dynamo",),
                                         skip=lambda entry: entry["model"] in SM90_IN_SCRIPT_ONLY))
def test_compiles_for_sm90(key):
    """`gir compile --target cuda:sm_90`: the plan, then every kernel built by NVRTC (PTX and
    cubin); where NVRTC is missing, every kernel's CUDA source emitted and checked against the
    shared-memory limit instead."""
    from gir.backends.errors import ToolchainMissingError
    from gir.build import build_steps
    target = get_target("cuda:sm_90")
    result = plan(load_bound(MANIFEST[key]), target, limit=2, cache=_store(target))
    assert result.kernels
    assert not [k.name for k in result.kernels if k.unlowerable]
    try:
        built = build_steps(result)
    except ToolchainMissingError:
        _emit_only(result, target)
        return
    assert len(built) == len(result.kernels)
    assert all(b.binaries[".cubin"] and b.launches for b in built)


def _emit_only(result, target) -> None:
    from gir.backends.cuda.emitter import STATIC_SHARED, CudaEmitter
    from gir.backends.kernels import check_shared, emit_graph
    for kernel in result.kernels:
        source, kernels = emit_graph(CudaEmitter(target), kernel.graph)
        check_shared(kernels, target, STATIC_SHARED)
        assert "__global__" in source
