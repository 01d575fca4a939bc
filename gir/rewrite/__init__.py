"""GIR-Graph rewriting (paper section 5): sync insertion, gOperator merging and swapping,
driven greedily (Algorithm 1)."""
from .driver import RULES, Step, optimize

__all__ = ["RULES", "Step", "optimize"]
