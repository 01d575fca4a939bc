"""The models torch.onnx exported (models/exported/, written by scripts/export_models.py): their
manifest, each file loaded with its symbolic dims bound, and its PyTorch reference.

Shared by tests/test_exported_models.py and scripts/exported_report.py; needs no PyTorch.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

EXPORTED = Path(__file__).resolve().parent / "exported"


def manifest() -> dict:
    """{key: entry}; key is <model>_<exporter>; entry: file, reference, exporter, opset, torch,
    inputs ({name: shape as written, sizes to bind, dtype}), outputs ({name: shape}), ops."""
    return json.loads((EXPORTED / "manifest.json").read_text())


def input_shapes(entry: dict) -> dict[str, tuple]:
    """The sizes that bind each input's symbolic dims (those of the reference inputs)."""
    return {n: tuple(i["bind"]) for n, i in entry["inputs"].items()}


def load_bound(entry: dict):
    """The exported file as a BasicGraph, symbolic dims bound to the reference sizes."""
    from gir.frontend import load
    return load(str(EXPORTED / entry["file"]), input_shapes=input_shapes(entry))


def reference(entry: dict) -> tuple[dict, dict]:
    """(feeds, expected outputs) that PyTorch produced, by ONNX name."""
    data = np.load(EXPORTED / entry["reference"])
    return {n: data[n] for n in entry["inputs"]}, {n: data[n] for n in entry["outputs"]}


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| over the whole tensor."""
    want = np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want)) / max(float(np.max(np.abs(want))), 1e-30))
