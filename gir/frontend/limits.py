"""Resource limits as data: the largest tensor the frontend will plan and the largest it will
compute at compile time (constant folding).

Why limits at all: planning enumerates parallel units (memory grows with the tensor), emitted
kernels index with 32-bit integers, and a folded constant is computed in the compiling process.
A model above a limit is refused up front with one line naming the model, node, tensor and the
limit (exit 1), instead of running out of memory or time later. Both limits are settable,
per process, through the environment (read at each check, so a test or a caller can change it):

    GIR_MAX_TENSOR_ELEMENTS  any tensor of the model: inputs, intermediates, outputs
    GIR_MAX_FOLD_ELEMENTS    any tensor GIR computes while loading (ConstantOfShape, folded ops)
    GIR_MAX_GROUP_OPS        basic operators fused into one kernel by the greedy grouping

The group limit is not a refusal: a longer run of fusable ops is cut into several kernels.
Rewriting a fused group checks every step on the whole merged graph, so its time grows with
the square of the group's size (50 chained Softmax ops as one group of 200: about 105 s); cut
at 24, planning grows linearly with the model. The zoo's largest group has 13 basic operators,
so no zoo plan changes.
"""
from __future__ import annotations

import math
import os

from .errors import FrontendError

MAX_TENSOR_ELEMENTS = 2**26  # 256 MiB of float32; planning a Relu of this size on `cpu`: 12 s, 1.7 GB
MAX_FOLD_ELEMENTS = 2**26  # 256 MiB of float32 computed at compile time (weights are not folded twice)
MAX_GROUP_OPS = 24  # basic operators per fused group (the zoo's largest: 13)


def _setting(env: str, default: int) -> int:
    text = os.environ.get(env)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise FrontendError(f"${env} must be a whole number of elements, not {text!r}") from None
    if value < 1:
        raise FrontendError(f"${env} must be >= 1, not {value}")
    return value


def max_tensor_elements() -> int:
    return _setting("GIR_MAX_TENSOR_ELEMENTS", MAX_TENSOR_ELEMENTS)


def max_fold_elements() -> int:
    return _setting("GIR_MAX_FOLD_ELEMENTS", MAX_FOLD_ELEMENTS)


def max_group_ops() -> int:
    return _setting("GIR_MAX_GROUP_OPS", MAX_GROUP_OPS)


def check_tensor(where: str, tensor: str, shape, fold: bool = False) -> None:
    """Raise a FrontendError (`where` names the model and node) when a tensor of `shape` is
    above the tensor limit, or, when GIR would compute its value now (`fold`), the fold limit."""
    n = math.prod(int(d) for d in shape)
    for limited, limit, env, what in ((True, max_tensor_elements(), "GIR_MAX_TENSOR_ELEMENTS", "planned"),
                                      (fold, max_fold_elements(), "GIR_MAX_FOLD_ELEMENTS", "folded at compile time")):
        if limited and n > limit:
            raise FrontendError(f"{where}: tensor {tensor!r} of shape {list(shape)} has {n} elements, above the "
                                f"limit of {limit} for a tensor {what} (${env} raises it)")
