"""The GIR core: targets, slices, gOperators, graphs, analyses and the reference interpreter."""
from .affine import Affine, ParallelPrimitive, B, U, W, block_coord, var
from .expr import Call, Const, Expr, Input, call
from .gops import Broadcast, Elementwise, Gather, GOp, Move, Reduce, Sync
from .graph import GIRGraph
from .interpreter import InterpreterError, RaceError, Result, Stats, run
from .printer import to_dot, to_text
from .scope import required_scope
from .slices import Buffer, Slice
from .target import BLOCK, DEVICE, DRAM, LANE, REGISTER, SHARED, UNIT, Target, get_target
from .validate import GraphError, validate

__all__ = [
    "Affine", "ParallelPrimitive", "B", "U", "W", "block_coord", "var", "Call", "Const", "Expr", "Input", "call",
    "Broadcast", "Elementwise", "Gather", "GOp", "Move", "Reduce", "Sync", "GIRGraph", "InterpreterError", "RaceError",
    "Result", "Stats", "run", "to_dot", "to_text", "required_scope", "Buffer", "Slice", "BLOCK", "DEVICE", "DRAM",
    "LANE", "REGISTER", "SHARED", "UNIT", "Target", "get_target", "GraphError", "validate",
]
