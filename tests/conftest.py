import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def pytest_addoption(parser):
    parser.addoption("--backend", action="append", default=[], metavar="NAME",
                     help="run the backend conformance suite (tests/conformance) in full for this backend: a "
                          "folder name under gir/backends or a path to a backend folder; repeatable. Without it "
                          "the suite checks the built-in backends at CI depth.")
