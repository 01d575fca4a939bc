"""Executing a plan: library calls and GIR kernels in order over named tensors."""
from .executor import ExecutionError, execute
from .memory import MemoryPlan, plan_memory
from .session import NodeArg, Session, SessionError

__all__ = ["execute", "ExecutionError", "MemoryPlan", "plan_memory", "NodeArg", "Session", "SessionError"]
