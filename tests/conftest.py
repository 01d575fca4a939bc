import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
PERF_MODEL_RANK = Path(__file__).resolve().parent.parent / "scripts" / "perf_model_rank.py"


@pytest.fixture(scope="module")
def rank():
    """scripts/perf_model_rank.py as a module (scripts/ is no package), for its tests."""
    spec = importlib.util.spec_from_file_location("perf_model_rank", PERF_MODEL_RANK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def pytest_addoption(parser):
    parser.addoption("--backend", action="append", default=[], metavar="NAME",
                     help="run the backend conformance suite (tests/conformance) in full for this backend: a "
                          "folder name under gir/backends or a path to a backend folder; repeatable. Without it "
                          "the suite checks the built-in backends at CI depth.")


def pytest_configure(config):
    """The suite gets its own compile cache (one per run, shared by its tests and their worker
    processes), so it neither reads a user's cached results nor fills their cache; a
    GIR_CACHE_DIR set by the caller wins."""
    if "GIR_CACHE_DIR" not in os.environ:
        import tempfile
        config._gir_cache = os.environ["GIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="gir-test-cache-")


def pytest_unconfigure(config):
    if getattr(config, "_gir_cache", None):
        import shutil
        shutil.rmtree(config._gir_cache, ignore_errors=True)
        del os.environ["GIR_CACHE_DIR"]
