"""The conformance suite every backend runs: `python3 -m pytest tests/conformance --backend NAME`
(NAME: a folder under gir/backends, or a path to a backend folder such as one `gir port new`
wrote). In order:

1. import and description: the backend exposes gir.backends.port.INTERFACE, its hardware
   description is sane, and its emitter matches it;
2. every basic-operator template case of backend_cases.py, a seeded candidate each, chosen
   so the sample spans every structure the templates offer the target (block reductions,
   shared-memory tiles, two-phase reductions through DRAM);
3. fused Softmax / LayerNormalization / GELU chains after merging and rewriting;
4. bundled zoo models planned for the target, every step run in order.

Where the backend executes here (its `run` does not raise NoDeviceError) results are compared
with the reference interpreter (2, 3) or onnxruntime (4); elsewhere every kernel is compiled.
Without --backend, the plain test run checks the built-in backends: OpenCL in full but for one
zoo model, the others on one case per operator kind and one chain.

Each backend's checks run in a spawned worker process of its own: toolchains that embed LLVM
(PoCL, hiprtc) abort when loaded into one process, and the rest of the test session never
loads them here.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pytest

import conformance_checks as checks
import models
from backend_cases import CHAINS
from gir.backends.port import BUILTIN

SHAPES = ((3, 5, 70), (2, 300))
CHAIN_CASES = [(m, s, None) for m in CHAINS for s in SHAPES] + \
              [("softmax", (2, 300), "block"), ("layernorm", (3, 5, 70), "block")]  # barriers inside a fused kernel
CI_ZOO = ("sardrn",)


def depths(config) -> dict[str, str]:
    """backend spec -> "full" (named with --backend), "ci" (OpenCL) or "smoke" (other built-ins)."""
    named = config.getoption("backend")
    return {b: "full" for b in named} if named else {b: "ci" if b == "opencl" else "smoke" for b in BUILTIN}


def first_case_per_kind() -> list[str]:
    kinds: dict[str, str] = {}
    for case in checks.CASES:
        kinds.setdefault(case.split("-")[0], case)
    return list(kinds.values())


PARAMS = {  # what each parametrised test runs at each depth
    "case": lambda depth: first_case_per_kind() if depth == "smoke" else list(checks.CASES),
    "chain": lambda depth: CHAIN_CASES[:1] if depth == "smoke" else CHAIN_CASES,
    "model": lambda depth: sorted(models.MODELS) if depth == "full" else CI_ZOO if depth == "ci" else [],
}


def pytest_generate_tests(metafunc):
    if "spec" not in metafunc.fixturenames:
        return
    extra = next((n for n in PARAMS if n in metafunc.fixturenames), None)
    rows, ids = [], []
    for spec, depth in depths(metafunc.config).items():
        if extra is None:
            if depth != "smoke" or metafunc.function is not test_sample_spans_every_structure:
                rows.append(spec)
                ids.append(spec)
            continue
        for value in PARAMS[extra](depth):
            rows.append((spec, value))
            ids.append(f"{spec}-{'-'.join(map(str, value)) if isinstance(value, tuple) else value}")
    metafunc.parametrize(["spec", extra] if extra else "spec", rows, ids=ids)


# -- one worker process per backend -----------------------------------------------------------------
WORKERS: dict[str, ProcessPoolExecutor] = {}


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():
    yield
    for pool in WORKERS.values():
        pool.shutdown(cancel_futures=True)
    WORKERS.clear()


def remote(spec: str, check_fn, *args) -> None:
    """Run a check in the backend's worker; a worker that dies (a crash in native code) fails
    this test and is replaced for the next."""
    if spec not in WORKERS:
        WORKERS[spec] = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        status, detail = WORKERS[spec].submit(checks.outcome, check_fn, spec, *args).result()
    except BrokenProcessPool:
        del WORKERS[spec]
        pytest.fail(f"the {spec} worker process died during {check_fn.__name__}{args}", pytrace=False)
    if status == "skip":
        pytest.skip(detail)
    if status == "fail":
        pytest.fail(detail, pytrace=False)


# -- 1. import and description ----------------------------------------------------------------------
def test_backend_exposes_the_port_interface(spec):
    remote(spec, checks.port_interface)


def test_hardware_description_is_sane(spec):
    remote(spec, checks.hardware_description)


def test_emitter_matches_the_description(spec):
    remote(spec, checks.emitter_matches_description)


# -- 2. templates -----------------------------------------------------------------------------------
def test_template_case(spec, case):
    remote(spec, checks.template_case, case)


def test_sample_spans_every_structure(spec):
    remote(spec, checks.sample_spans_every_structure)


# -- 3. rewritten chains ----------------------------------------------------------------------------
def test_fused_chain(spec, chain):
    remote(spec, checks.fused_chain, *chain)


# -- 4. zoo models ----------------------------------------------------------------------------------
def test_zoo_model(spec, model):
    remote(spec, checks.zoo_model, model)
