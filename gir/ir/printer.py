"""Readable forms of a GIR-Graph: text for terminals and `gir explain`, Graphviz DOT for pictures."""
from __future__ import annotations

from .graph import GIRGraph
from .gops import Sync
from .target import SCOPE_NAMES


def to_text(graph: GIRGraph) -> str:
    lines = [f"gir-graph {graph.name}  {graph.prim}  target={graph.target.name}"]
    for buf in graph.buffers.values():
        per = {"register": "per unit", "shared": "per block", "dram": ""}[buf.level]
        shape = f" shape={buf.shape}" if buf.shape else ""
        lines.append(f"  buffer {buf.name}: {buf.level} {buf.size} x {buf.dtype} {per}{shape} ({buf.role})".rstrip())
    for node, op in graph.ops():
        deps = sorted(graph.producers(node))
        after = f"   <- {', '.join(f'#{d}' for d in deps)}" if deps else ""
        lines.append(f"  #{node} {op}{after}")
    return "\n".join(lines)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: GIRGraph) -> str:
    """Nodes are gOperators (syncs drawn as diamonds), edges carry the slice read."""
    lines = [f"digraph {_quote(graph.name)} {{", "  rankdir=TB; node [fontname=monospace, fontsize=10];",
             f"  label={_quote(f'{graph.name}: {graph.prim}')};"]
    for node, op in graph.ops():
        if isinstance(op, Sync):
            label, shape = f"#{node} Sync({SCOPE_NAMES[op.scope]})\\n{op.slice.buffer}", "diamond"
        else:
            label = f"#{node} {op.kind}\\n-> {op.writes()[0].buffer}"
            shape = "box"
        lines.append(f"  n{node} [label={_quote(label)}, shape={shape}];")
    for a, b, data in graph.graph.edges(data=True):
        style = "solid" if data["kind"] == "raw" else "dashed"
        lines.append(f"  n{a} -> n{b} [label={_quote(str(data['slice'].buffer))}, style={style}];")
    lines.append("}")
    return "\n".join(lines)
