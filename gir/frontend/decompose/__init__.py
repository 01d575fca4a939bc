"""ONNX node -> basic ops. One module per op family registers its ops in REGISTRY; importing
this package imports them all."""
from . import constants, elementwise, indexing, layout, linalg, normalization, pooling, reduce  # noqa: F401
from . import attention, conv_transpose, einsum, resize  # noqa: F401  (set B of issue 21)
from .context import Builder, Names, Node
from .registry import REGISTRY, Decomposition, register

SUPPORTED_OPS = frozenset(REGISTRY)

__all__ = ["REGISTRY", "SUPPORTED_OPS", "Decomposition", "register", "Builder", "Names", "Node"]
