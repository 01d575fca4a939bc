"""A directed acyclic graph drawn as SVG, laid out here: nodes in rows by longest path from a
source (a source sits just above its first reader), each row ordered by the mean position of
the node's predecessors, edges as curves.

Why not Graphviz: the pictures of a report are small DAGs in program order, this layout is
enough for them, and it needs nothing installed, runs in milliseconds (a BERT-base report
draws hundreds) and gives the same bytes every time.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

CHAR_W, LINE_H, PAD, GAP_X, GAP_Y = 6.6, 14, 6, 16, 34
MAX_CHARS = 44


@dataclass
class Node:
    key: object
    lines: list[str]
    fill: str = "#ffffff"
    diamond: bool = False


def clip(text: str, limit: int = MAX_CHARS) -> str:
    """Long tensor names keep their end, which is the part that tells them apart."""
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def dag_svg(nodes: list[Node], edges: list[tuple[object, object, bool]], title: str) -> str:
    """`edges`: (from key, to key, dashed). Nodes are given in a topological order."""
    rows = _rows(nodes, edges)
    size = {n.key: ((max(len(line) for line in n.lines) * CHAR_W + 2 * PAD) * (1.5 if n.diamond else 1),
                    len(n.lines) * LINE_H + 2 * PAD) for n in nodes}
    widths = [sum(size[n.key][0] for n in row) + GAP_X * (len(row) - 1) for row in rows]
    width = max([*widths, len(title) * CHAR_W]) + 2 * GAP_X
    pos, y = {}, 28.0
    for row, row_width in zip(rows, widths):
        x, height = (width - row_width) / 2, max(size[n.key][1] for n in row)
        for n in row:
            w, h = size[n.key]
            pos[n.key] = (x, y + (height - h) / 2, w, h)
            x += w + GAP_X
        y += height + GAP_Y
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y:.0f}" '
           f'viewBox="0 0 {width:.0f} {y:.0f}" font-family="monospace" font-size="11">',
           '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
           'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#555"/></marker></defs>',
           f'<text x="{GAP_X}" y="16" font-weight="bold">{escape(title)}</text>']
    for a, b, dashed in edges:
        ax, ay, aw, ah = pos[a]
        bx, by, bw, _ = pos[b]
        x1, y1, x2, y2 = ax + aw / 2, ay + ah, bx + bw / 2, by
        bend, dash = max(12.0, (y2 - y1) / 2), ' stroke-dasharray="4 3"' if dashed else ""
        out.append(f'<path d="M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}" '
                   f'fill="none" stroke="#555"{dash} marker-end="url(#arrow)"/>')
    for n in nodes:
        x, y0, w, h = pos[n.key]
        if n.diamond:
            out.append(f'<polygon points="{x + w / 2:.1f},{y0:.1f} {x + w:.1f},{y0 + h / 2:.1f} {x + w / 2:.1f},{y0 + h:.1f} '
                       f'{x:.1f},{y0 + h / 2:.1f}" fill="{n.fill}" stroke="#333"/>')
        else:
            out.append(f'<rect x="{x:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{h:.1f}" rx="4" fill="{n.fill}" stroke="#333"/>')
        for i, line in enumerate(n.lines):
            out.append(f'<text x="{x + w / 2:.1f}" y="{y0 + PAD + (i + 0.8) * LINE_H:.1f}" text-anchor="middle">'
                       f'{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _rows(nodes: list[Node], edges) -> list[list[Node]]:
    preds: dict = {n.key: [] for n in nodes}
    succs: dict = {n.key: [] for n in nodes}
    for a, b, _ in edges:
        preds[b].append(a)
        succs[a].append(b)
    depth: dict = {}
    for n in nodes:
        depth[n.key] = 1 + max((depth[p] for p in preds[n.key]), default=-1)
    for n in nodes:  # a source (a load) sits just above its first reader, not in the top row
        if not preds[n.key] and succs[n.key]:
            depth[n.key] = max(0, min(depth[s] for s in succs[n.key]) - 1)
    rows: list[list[Node]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for n in nodes:
        rows[depth[n.key]].append(n)
    place: dict = {}
    for row in rows:
        order = {n.key: i for i, n in enumerate(row)}
        row.sort(key=lambda n: (sum(place[p] for p in preds[n.key]) / len(preds[n.key]) if preds[n.key] else order[n.key],
                                order[n.key]))
        place.update({n.key: i for i, n in enumerate(row)})
    return rows
