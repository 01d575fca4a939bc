"""Frontend errors: one line each, naming the model, and the node or tensor at fault, so a user
can act on the message without a traceback."""
from __future__ import annotations


def one_line(text: str) -> str:
    """onnx and protobuf messages span lines; keep the gist on one."""
    parts = [p.strip() for p in str(text).splitlines() if p.strip()]
    return "; ".join(parts)


class FrontendError(ValueError):
    """A model GIR cannot load: unreadable, invalid, dynamic shapes, unsupported dtype."""

    def __init__(self, message: str):
        super().__init__(one_line(message))


class UnsupportedDtypeError(FrontendError):
    """A valid model with a tensor of an element type GIR does not have (float8, int4,
    uint16, string, ...): an unsupported model, not a bad one."""


class UnsupportedOpError(FrontendError):
    """Every node GIR cannot decompose, collected in one error.

    ``nodes`` holds (node name, op type, domain, opset, reason or None) per node."""

    def __init__(self, model: str, nodes: list[tuple[str, str, str, int, str | None]]):
        self.model = model
        self.nodes = list(nodes)
        items = []
        for name, op_type, domain, opset, reason in self.nodes:
            item = f"node '{name}' ({op_type}, {domain or 'ai.onnx'} opset {opset})"
            items.append(f"{item}: {reason}" if reason else item)
        n = len(items)
        super().__init__(f"{model}: {n} unsupported node{'s' if n != 1 else ''}: " + "; ".join(items))
