"""The memory-intensive part of a model as standalone ONNX models, so that GIR and onnxruntime
can be timed on it alone (scripts/bench.py's second table).

A region is a set of ONNX nodes none of whose basic operators is a library call in the plan
GIR ran; nodes whose operators share a fused subgraph of that plan are in one region. Each
region is cut out with onnx.utils.Extractor. Its inputs get the values the full model computes
for them (onnxruntime on the same feeds, the intermediates as extra outputs), so gathers index
and masks mask as they do in the model. Regions with the same structure (node types,
attributes, wiring, input and weight shapes, small constants: the repeated layers of a
transformer) are timed once and counted as many times as they occur.
"""
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx.utils import Extractor

SMALL_CONSTANT = 16  # elements: constants this small (shapes, axes, starts) are part of a region's structure


@dataclass
class Region:
    nodes: list[str]                       # ONNX node names, in model order
    model: onnx.ModelProto | None = None   # the region alone; None when it could not be cut out
    skipped: str = ""                      # why it could not
    key: tuple = ()
    feeds: dict = field(default_factory=dict)


def onnx_node(op) -> str:
    """The ONNX node a basic operator came from (BasicOp.origin: "node 'NAME' (OpType, ...)")."""
    return re.match(r"node '(.*)' \(", op.origin).group(1)


def find_regions(model: onnx.ModelProto, partition) -> list[list[str]]:
    """Node names per region, regions in model order; `partition`: a Plan's Partition."""
    library = {onnx_node(op) for op in partition.library}
    owner = {}  # ONNX node -> index of the first fused subgraph holding one of its operators
    parent = list(range(len(partition.subgraphs)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for i, ops in enumerate(partition.subgraphs):
        for op in ops:
            node = onnx_node(op)
            if node in owner:
                parent[root(i)] = root(owner[node])
            else:
                owner[node] = i
    groups: dict[int, list[str]] = {}
    for node in (n.name for n in model.graph.node):
        if node in owner and node not in library:
            groups.setdefault(root(owner[node]), []).append(node)
    return list(groups.values())


def constant_tensors(model: onnx.ModelProto) -> set[str]:
    """Initializers and what nodes compute from them alone (the frontend folds those)."""
    constants = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        if all(t in constants for t in node.input if t):
            constants.update(t for t in node.output if t)
    return constants


def cut(model: onnx.ModelProto, extractor: Extractor, constants: set[str], names: list[str]) -> Region:
    """The region as a model of its own: inputs are the non-constant tensors it reads from
    outside, outputs what it produces that the rest of the model or the model's outputs read."""
    by_name = {n.name: n for n in model.graph.node}
    if len(by_name) != len(model.graph.node) or "" in by_name:
        return Region(names, skipped="the model has unnamed or repeated node names")
    members = set(names)
    inside = [by_name[n] for n in names]
    produced = {t for n in inside for t in n.output if t}
    inputs = list(dict.fromkeys(t for n in inside for t in n.input if t and t not in produced and t not in constants))
    read_outside = {t for n in model.graph.node if n.name not in members for t in n.input}
    read_outside |= {o.name for o in model.graph.output}
    outputs = [t for t in dict.fromkeys(t for n in inside for t in n.output if t) if t in read_outside]
    if not outputs:
        return Region(names, skipped="nothing it computes is read outside it")
    try:
        sub = extractor.extract_model(inputs, outputs)
    except ValueError as err:  # a tensor without a static type (shape inference could not tell)
        return Region(names, skipped=f"onnx.utils.Extractor: {err}")
    extra = [n.name for n in sub.graph.node if n.name not in members and not all(o in constants for o in n.output)]
    if extra:
        return Region(names, skipped=f"not closed: the cut pulls in {len(extra)} other node(s), e.g. {extra[0]}")
    return Region(names, sub, key=structure_key(sub))


def structure_key(sub: onnx.ModelProto) -> tuple:
    """Equal for regions that differ only in tensor names and the values of large weights."""
    canon: dict[str, str] = {}

    def name(t: str) -> str:
        return canon.setdefault(t, f"t{len(canon)}") if t else ""
    g = sub.graph
    inputs = tuple((name(i.name), i.type.SerializeToString()) for i in g.input)
    nodes = tuple((n.op_type, n.domain, tuple(a.SerializeToString() for a in n.attribute),
                   tuple(name(t) for t in n.input), tuple(name(t) for t in n.output)) for n in g.node)
    weights = tuple(sorted((name(t.name), tuple(t.dims), t.data_type,
                            t.SerializeToString() if np.prod(t.dims) <= SMALL_CONSTANT else b"")
                           for t in g.initializer))
    return inputs, nodes, weights, tuple(name(o.name) for o in g.output)


def regions(model: onnx.ModelProto, partition, feeds: dict) -> list[Region]:
    """Every region of the model, cut out, with the values the full model gives its inputs."""
    inferred = onnx.shape_inference.infer_shapes(model)
    extractor, constants = Extractor(inferred), constant_tensors(model)
    found = [cut(model, extractor, constants, names) for names in find_regions(model, partition)]
    wanted = list(dict.fromkeys(i.name for r in found if r.model for i in r.model.graph.input if i.name not in feeds))
    values = dict(feeds)
    if wanted:
        values.update(zip(wanted, intermediates(inferred, feeds, wanted)))
    for r in found:
        if r.model:
            r.feeds = {i.name: values[i.name] for i in r.model.graph.input}
    return found


def intermediates(inferred: onnx.ModelProto, feeds: dict, names: list[str]) -> list[np.ndarray]:
    """onnxruntime's values of intermediate tensors of the full model on `feeds`."""
    full = onnx.ModelProto()
    full.CopyFrom(inferred)
    known = {vi.name: vi for vi in full.graph.value_info}
    full.graph.output.extend(known[n] for n in names)
    session = ort.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(names, feeds)
