"""Frontend: ONNX model -> BasicGraph (static shapes, a handful of basic operator kinds),
plus the numpy reference executor that later stages are checked against."""
from .basic import KINDS, BasicGraph, BasicOp, GraphError, Tensor, check_graph
from .decompose import SUPPORTED_OPS
from .errors import FrontendError, UnsupportedOpError
from .loader import load, static_inputs
from .lower import lower_conv, lower_matmul
from .reference import run_reference

__all__ = [
    "KINDS", "BasicGraph", "BasicOp", "Tensor", "GraphError", "check_graph", "SUPPORTED_OPS",
    "FrontendError", "UnsupportedOpError", "load", "static_inputs", "lower_matmul", "lower_conv",
    "run_reference",
]
