"""Executing a plan: library calls and GIR kernels in order over named tensors."""
from .executor import execute

__all__ = ["execute"]
