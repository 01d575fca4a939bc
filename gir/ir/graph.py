"""GIR-Graph: gOperators as nodes of a networkx DiGraph, memory slices on the edges,
wrapped by one parallel primitive.

The builder records gOperators in program order and derives the edges from it: a read
depends on the last gOperator that wrote or synced the same buffer (the edge carries the
read slice), and a write waits for earlier readers and writers of its buffer. Deriving edges
instead of asking callers for them means a missing Sync shows up as a direct writer->reader
edge, which is exactly what the interpreter's race check and sync insertion look for.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import networkx as nx

from .affine import ParallelPrimitive
from .gops import GOp, Sync
from .slices import Buffer, Slice
from .target import DRAM, Target


@dataclass
class GIRGraph:
    name: str
    prim: ParallelPrimitive
    target: Target
    buffers: dict[str, Buffer] = field(default_factory=dict)
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)
    _next_id: int = 0
    # Dependency state after the last node in program order (last writer, readers since), so
    # that appending a node adds its own edges instead of rebuilding all (planning builds
    # graphs op by op); and the cached program order with its gOperators (the analyses ask for
    # them again and again). All are reset by any other mutation.
    _tail: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _order: list | None = field(default=None, init=False, repr=False, compare=False)
    _ops: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _index: dict | None = field(default=None, init=False, repr=False, compare=False)

    # -- building -------------------------------------------------------------------------
    def buffer(self, name: str, level: str, size: int | tuple, dtype: str = "float32", role: str = "temp") -> Buffer:
        if name in self.buffers:
            raise ValueError(f"{self.name}: buffer {name!r} declared twice")
        shape = tuple(size) if isinstance(size, tuple) else None
        buf = Buffer(name, level, prod(shape) if shape is not None else int(size), dtype, role,
                     shape if level == DRAM else None)
        if role != "temp" and level != DRAM:
            raise ValueError(f"{self.name}: only DRAM buffers can be model {role}s ({name})")
        self.buffers[name] = buf
        return buf

    def add(self, op: GOp) -> int:
        """Append a gOperator in program order; returns its node id."""
        for s in self._slices(op):
            if s.buffer not in self.buffers:
                raise KeyError(f"{self.name}: {op.kind} uses undeclared buffer {s.buffer!r}")
            for expr in (s.offset, *s.bounds):
                self.prim.check_variables(expr)
        node = self._next_id
        self._next_id += 1
        self.graph.add_node(node, op=op, order=float(node))  # after every node: ids only grow
        if self._tail is None:
            self._rebuild_edges()
        else:
            self._link(node, *self._tail)
            if self._order is not None:
                self._order.append(node)
            self._ops = self._index = None
        return node

    # -- program order and queries ------------------------------------------------------
    def order(self) -> list[int]:
        """Program order, which is a topological order: every edge is derived from it (`_link`
        links a node only to nodes before it), so sorting by it is the lexicographic topological
        sort without the search (planning asks for it tens of thousands of times)."""
        if self._order is None:
            nodes = self.graph.nodes
            self._order = sorted(nodes, key=lambda n: nodes[n]["order"])
        return list(self._order)

    def edges_follow_order(self) -> bool:
        """Every edge runs forward in program order (what makes the graph acyclic); false only
        where an edge was added around `_link`."""
        nodes = self.graph.nodes
        return all(nodes[a]["order"] < nodes[b]["order"] for a, b in self.graph.edges)

    def ops(self) -> list[tuple[int, GOp]]:
        if self._ops is None:
            self._ops = tuple((n, self.graph.nodes[n]["op"]) for n in self.order())
        return list(self._ops)

    def op(self, node: int) -> GOp:
        return self.graph.nodes[node]["op"]

    def role_buffers(self, role: str) -> list[Buffer]:
        return [b for b in self.buffers.values() if b.role == role]

    def __len__(self):
        return self.graph.number_of_nodes()

    # -- mutation (for rewrites) --------------------------------------------------------
    def replace(self, node: int, op: GOp) -> None:
        self.graph.nodes[node]["op"] = op
        self._rebuild_edges()

    def replace_all(self, ops: dict[int, GOp]) -> None:
        """Several replacements, edges rebuilt once (one rebuild each would be quadratic)."""
        for node, op in ops.items():
            self.graph.nodes[node]["op"] = op
        if ops:
            self._rebuild_edges()

    def accesses(self, buffer: str) -> tuple[list[int], list[int], list[int]]:
        """(writers, readers, syncs) of a buffer in program order (Syncs are neither writer nor
        reader), indexed once per version of the graph: the rewrite rules ask for every buffer."""
        if self._index is None:
            index: dict[str, tuple[list, list, list]] = {}
            for n, op in self.ops():
                if isinstance(op, Sync):
                    index.setdefault(op.slice.buffer, ([], [], []))[2].append(n)
                    continue
                for k, slices in ((0, op.writes()), (1, op.reads())):
                    for b in dict.fromkeys(s.buffer for s in slices):
                        index.setdefault(b, ([], [], []))[k].append(n)
            self._index = index
        w, r, sy = self._index.get(buffer, ([], [], []))
        return list(w), list(r), list(sy)

    def remove(self, node: int) -> None:
        self.graph.remove_node(node)
        self._rebuild_edges()

    def insert_after(self, anchor: int, op: GOp) -> int:
        """Insert right after `anchor` in program order."""
        orders = sorted(self.graph.nodes[n]["order"] for n in self.graph)
        here = self.graph.nodes[anchor]["order"]
        later = [o for o in orders if o > here]
        node = self._next_id
        self._next_id += 1
        self.graph.add_node(node, op=op, order=(here + later[0]) / 2 if later else here + 1)
        self._rebuild_edges()
        return node

    def insert_before(self, anchor: int, op: GOp) -> int:
        orders = sorted(self.graph.nodes[n]["order"] for n in self.graph)
        here = self.graph.nodes[anchor]["order"]
        earlier = [o for o in orders if o < here]
        node = self._next_id
        self._next_id += 1
        self.graph.add_node(node, op=op, order=(here + earlier[-1]) / 2 if earlier else here - 1)
        self._rebuild_edges()
        return node

    def copy(self) -> "GIRGraph":
        """Keeps the cached program order: the rewrite driver copies before every trial."""
        out = GIRGraph(self.name, self.prim, self.target, dict(self.buffers), self.graph.copy(), self._next_id)
        if self._order is not None:
            out._order, out._ops, out._index = list(self._order), self._ops, self._index
        return out

    # -- edges ----------------------------------------------------------------------------
    @staticmethod
    def _slices(op: GOp) -> list[Slice]:
        if isinstance(op, Sync):
            return [op.slice]
        return [*op.reads(), *op.writes()]

    def _rebuild_edges(self) -> None:
        self.graph.remove_edges_from(list(self.graph.edges))
        last_writer: dict[str, int] = {}
        readers: dict[str, list[int]] = {}
        by_order = sorted(self.graph.nodes, key=lambda n: self.graph.nodes[n]["order"])
        for node in by_order:
            self._link(node, last_writer, readers)
        self._tail, self._order, self._ops, self._index = (last_writer, readers), None, None, None

    def _link(self, node: int, last_writer: dict, readers: dict) -> None:
        """Edges into `node` from the nodes before it, given their state; updates the state."""
        op = self.graph.nodes[node]["op"]
        reads = [op.slice] if isinstance(op, Sync) else list(op.reads())
        writes = [op.slice] if isinstance(op, Sync) else list(op.writes())
        for s in reads:
            src = last_writer.get(s.buffer)
            if src is not None and src != node:
                self._edge(src, node, "raw", s)
            readers.setdefault(s.buffer, []).append(node)
        for s in writes:
            for r in readers.get(s.buffer, []):
                if r != node:
                    self._edge(r, node, "war", s)
            src = last_writer.get(s.buffer)
            if src is not None and src != node:
                self._edge(src, node, "waw", s)
            last_writer[s.buffer] = node
            readers[s.buffer] = []

    def _edge(self, a: int, b: int, kind: str, s: Slice) -> None:
        if self.graph.has_edge(a, b):
            data = self.graph.edges[a, b]
            if kind == "raw" and data["kind"] != "raw":
                data.update(kind=kind, slice=s)
            return
        self.graph.add_edge(a, b, kind=kind, slice=s)

    def producers(self, node: int) -> list[int]:
        """Nodes whose writes this node reads (dataflow predecessors)."""
        return [p for p in self.graph.predecessors(node) if self.graph.edges[p, node]["kind"] == "raw"]

    def consumers(self, node: int) -> list[int]:
        return [c for c in self.graph.successors(node) if self.graph.edges[node, c]["kind"] == "raw"]
