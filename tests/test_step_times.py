"""scripts/step_times_cpu.py: every step of a CPU session gets a time measured inside whole runs."""
import sys
from pathlib import Path

import onnx

import models
from gir.runtime import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from step_times_cpu import step_times  # noqa: E402


def test_every_step_is_timed_inside_whole_runs():
    model = onnx.load("models/bundled/bert_tiny.onnx")
    session = Session(model, target="cpu", plan_cache=None)
    total, times = step_times(session, models.example_inputs(model, 0), runs=3)
    assert set(times) == set(session.engine.call_steps)
    assert all(t > 0 for t in times.values()) and total >= 0.5 * sum(times.values())
