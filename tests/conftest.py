import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


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
