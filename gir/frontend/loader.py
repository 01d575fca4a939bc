"""ONNX model -> BasicGraph: read, check, collect unsupported nodes, fix shapes, infer, decompose.

The order matters for the user: a file that is not ONNX is reported before anything else,
an invalid model before unsupported ops, and all unsupported nodes at once (fixing them one
run at a time is miserable) before shape problems, which depend on the overrides the user
passes. Shapes come from the decompositions themselves; ONNX strict shape inference validates
the model and cross-checks every static shape we compute.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .basic import BasicGraph, Tensor
from .decompose import REGISTRY, Builder, Names, Node
from .decompose.context import ONNX_TO_GIR, gir_dtype, onnx_type_name
from .errors import FrontendError, UnsupportedOpError, one_line
from .external_data import load_model, refuse_unresolved
from .limits import check_tensor

DEFAULT_DOMAINS = ("", "ai.onnx")
# Unsupported ops are still fine when all their inputs are constant: onnx.reference folds them.
# Never fold ops with no deterministic value.
_NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                 "Bernoulli", "If", "Loop", "Scan"}


def load(model, input_shapes: dict[str, tuple] | None = None,
         constants: dict[str, np.ndarray] | None = None) -> BasicGraph:
    """Load an ONNX model (path or ModelProto) as a BasicGraph with static shapes.

    input_shapes: binds symbolic dims before shape inference, two ways that can be mixed:
    {input name: shape} sets that input's whole shape, {dim_param: size} sets every input
    dim carrying that symbol ({"batch": 1, "seq": 128}). A key naming a graph input is an
    input (input names win over dim names). constants: {input name: value} binds graph inputs to constant values,
    as if they were initializers (what the onnx backend test does for shape-like inputs).
    """
    model, label, model_name = _read(model)
    _check_names(model, label)
    model = _bind(model, label, input_shapes or {}, constants or {})
    skeleton = _skeleton(model)
    _check(skeleton, label)
    nodes = _named_nodes(model, label)
    _scan_unsupported(model, nodes, label)
    _check_inputs_static(model, label)
    types = _value_types(_infer(skeleton, label))
    return _build(model, nodes, types, label, model_name)


def static_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs whose values GIR needs at compile time: those that flow, through any chain
    of ops, into a position where a decomposition needs a value (Reshape's shape, Slice's
    starts, Pad's pads, ...). Shape and Size cut the chain (they read shapes only). Callers
    bind these with ``constants``."""
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    needed: set[str] = set()
    for node in reversed(model.graph.node):
        entry = REGISTRY.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
        if entry is not None:
            needed.update(node.input[p] for p in entry.static if p < len(node.input) and node.input[p])
        if node.op_type not in ("Shape", "Size") and any(o in needed for o in node.output if o):
            needed.update(t for t in node.input if t)
    return [n for n in names if n in needed]


# ---- reading and checking -------------------------------------------------------------------

def _read(model):
    """The model as a ModelProto with every tensor's data in it. From a path, external data is
    read only after every location passed validation (gir/frontend/external_data.py); a
    ModelProto still pointing at external data has no folder to read it from and is refused."""
    if isinstance(model, onnx.ModelProto):
        name = model.graph.name or "model"
        refuse_unresolved(model, f"model '{name}'")
        return model, f"model '{name}'", name
    if isinstance(model, (bytes, bytearray)):
        raise FrontendError("load() takes a path or an onnx.ModelProto, not bytes")
    path = os.fspath(model)
    label = path
    proto = load_model(path)
    if not proto.ir_version or not proto.HasField("graph"):
        raise FrontendError(f"{label}: not an ONNX model (no IR version or no graph in the file)")
    return proto, label, Path(path).stem


def _check_names(model: onnx.ModelProto, label: str) -> None:
    """ONNX names are UTF-8 strings; protobuf hands a name that is not valid UTF-8 over as bytes,
    which nothing downstream can print, compare with a feed name or emit: refused here, with
    where it is (the bytes escaped)."""
    g = model.graph
    named = [("graph name", g.name)]
    named += [(f"graph {kind} {i}", v.name) for kind, vs in (("input", g.input), ("output", g.output),
                                                             ("value_info", g.value_info), ("initializer", g.initializer))
              for i, v in enumerate(vs)]
    for i, n in enumerate(g.node):
        what = f"node {i} ({n.op_type if isinstance(n.op_type, str) else 'op type'})"
        named += [(what, n.name), (f"{what} op type", n.op_type), (f"{what} domain", n.domain)]
        named += [(f"{what} input {j}", t) for j, t in enumerate(n.input)]
        named += [(f"{what} output {j}", t) for j, t in enumerate(n.output)]
    for what, name in named:
        if isinstance(name, bytes):
            raise FrontendError(f"{label}: {what}: name {name!r} is not valid UTF-8 (ONNX names are UTF-8 strings)")


def _check(model: onnx.ModelProto, label: str) -> None:
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, Exception) as e:  # noqa: BLE001
        raise FrontendError(f"{label}: invalid ONNX model (onnx.checker): {one_line(e)}") from None


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    out = {}
    for o in model.opset_import:
        out["" if o.domain in DEFAULT_DOMAINS else o.domain] = o.version
    return out


def _named_nodes(model: onnx.ModelProto, label: str) -> list[Node]:
    """Node wrappers with unique, non-empty names (ONNX allows empty and repeated ones)."""
    opsets = _opsets(model)
    taken = Names()
    nodes = []
    explicit = {n.name for n in model.graph.node if n.name}
    for i, proto in enumerate(model.graph.node):
        base = proto.name or f"{proto.op_type}_{i}"
        if not proto.name:
            while base in explicit:
                base += "_"
        name = taken.fresh(base)
        domain = "" if proto.domain in DEFAULT_DOMAINS else proto.domain
        nodes.append(Node(proto, name, opsets.get(domain, 0), label))
    return nodes


def _scan_unsupported(model: onnx.ModelProto, nodes: list[Node], label: str) -> None:
    consts = {t.name for t in model.graph.initializer}
    bad = []
    for n in nodes:
        entry = REGISTRY.get(n.op_type) if n.domain == "" else None
        reason = None
        foldable = (n.domain == "" and n.op_type not in _NOT_FOLDABLE and n.inputs and
                    all(t in consts for t in n.inputs if t))
        if entry is None:
            if not foldable:
                bad.append((n.name, n.op_type, n.domain or "ai.onnx", n.opset, None))
                continue
        elif entry.check is not None:
            reason = entry.check(n)
            if reason:
                bad.append((n.name, n.op_type, n.domain or "ai.onnx", n.opset, reason))
                continue
        if foldable or n.op_type in ("Constant", "Shape", "Size"):
            consts.update(t for t in n.outputs if t)
    if bad:
        raise UnsupportedOpError(label, bad)


# ---- shapes ---------------------------------------------------------------------------------

def _bind(model: onnx.ModelProto, label: str, input_shapes: dict, constants: dict) -> onnx.ModelProto:
    if not input_shapes and not constants:
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name for t in g.initializer}
    inputs = {i.name: i for i in g.input if i.name not in inits}
    symbols = _dim_params(inputs.values())
    for name in list(input_shapes) + list(constants):
        if name not in inputs and not (name in input_shapes and name in symbols):
            raise FrontendError(f"{label}: {name!r} is neither a graph input nor a symbolic dim of one "
                                f"(inputs: {', '.join(inputs) or 'none'}; symbolic dims: {', '.join(symbols) or 'none'})")
    by_dim = {name: _dim_size(label, name, size) for name, size in input_shapes.items() if name not in inputs}
    input_shapes = {name: shape for name, shape in input_shapes.items() if name in inputs}
    for vi in inputs.values():
        if vi.name in input_shapes or not vi.type.tensor_type.HasField("shape"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in by_dim:
                d.dim_value = by_dim[d.dim_param]  # clears dim_param (a oneof)
    for name, shape in input_shapes.items():
        tt = inputs[name].type.tensor_type
        shape = tuple(int(d) for d in shape)
        if tt.HasField("shape") and len(tt.shape.dim) != len(shape):
            raise FrontendError(f"{label}: input_shapes[{name!r}] = {shape} has rank {len(shape)}, "
                                f"the input has rank {len(tt.shape.dim)}")
        tt.shape.Clear()
        for d in shape:
            tt.shape.dim.add().dim_value = d
    for name, value in constants.items():
        vi = inputs[name]
        elem = vi.type.tensor_type.elem_type
        arr = np.asarray(value)
        if elem in ONNX_TO_GIR or elem in (onnx.TensorProto.STRING,):
            arr = arr.astype(helper.tensor_dtype_to_np_dtype(elem), copy=False)
        g.initializer.append(numpy_helper.from_array(arr, name))
        g.input.remove(vi)
    if input_shapes or by_dim:  # exported value_info may carry stale (symbolic or old) dims
        del g.value_info[:]
        for o in g.output:  # keep the rank (onnx.checker wants a shape), forget the sizes
            for d in o.type.tensor_type.shape.dim:
                d.Clear()
    return m


def _dim_params(inputs) -> list[str]:
    """The symbolic dim names (dim_param) the given graph inputs carry, in order of appearance."""
    seen = {}
    for vi in inputs:
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") == "tensor_type" and tt.HasField("shape"):
            seen.update((d.dim_param, None) for d in tt.shape.dim
                        if not d.HasField("dim_value") and d.dim_param)
    return list(seen)


def _dim_size(label: str, name: str, size) -> int:
    """A symbolic dim binds to one size: an int, or a one-element shape (what `--shape seq=128` gives)."""
    if isinstance(size, (list, tuple)) and len(size) == 1:
        size = size[0]
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)) or size < 0:
        raise FrontendError(f"{label}: input_shapes[{name!r}] = {size!r}: {name!r} is a symbolic dim, "
                            f"it binds to one size (a whole number >= 0)")
    return int(size)


def _skeleton(model: onnx.ModelProto, limit: int = 4096) -> onnx.ModelProto:
    """The model with its large initializers declared as graph inputs (same type and shape)
    instead: onnx.checker and shape inference serialise the whole model, weights dominate that
    cost, and neither needs their values (small ones stay: shape inference reads them)."""
    big = [t for t in model.graph.initializer if np.prod(t.dims, dtype=np.int64) > limit]
    if not big:
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    keep = [t for t in g.initializer if np.prod(t.dims, dtype=np.int64) <= limit]
    declared = {i.name for i in g.input}
    del g.initializer[:]
    g.initializer.extend(keep)
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in big if t.name not in declared)
    return m


def _infer(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:  # noqa: BLE001 - InferenceError, ValidationError
        raise FrontendError(f"{label}: ONNX shape inference failed: {one_line(e)}") from None


def _check_inputs_static(model: onnx.ModelProto, label: str) -> None:
    inits = {t.name for t in model.graph.initializer}
    unbound = []  # (input, axis, dim_param or None, dims) for every dim with no size
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if vi.type.WhichOneof("value") != "tensor_type":
            raise FrontendError(f"{label}: input {vi.name!r} is a {vi.type.WhichOneof('value')}, "
                                f"GIR takes tensors only")
        tt = vi.type.tensor_type
        gir_dtype(tt.elem_type, f"{label}: input {vi.name!r}")
        if not tt.HasField("shape"):
            raise FrontendError(f"{label}: input {vi.name!r} has no shape (unknown rank); GIR compiles "
                                f"static shapes: bind it with input_shapes={{{vi.name!r}: (...)}} in Python "
                                f"or --shape {vi.name}=AxBx... on the command line")
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        unbound += [(vi.name, axis, d, dims) for axis, d in enumerate(dims) if not isinstance(d, int)]
        for axis, d in enumerate(dims):
            if isinstance(d, int) and d < 0:
                raise FrontendError(f"{label}: input {vi.name!r} has a negative dimension {d} at axis {axis} "
                                    f"(shape {dims})")
        if not any(not isinstance(d, int) for d in dims):
            check_tensor(f"{label}: graph input", vi.name, dims)
    if unbound:
        raise FrontendError(_unbound_message(label, unbound))


def _unbound_message(label: str, unbound: list) -> str:
    """One line: each unbound dim (input, axis, dim_param) and how to bind them all, in Python
    and on the command line (example sizes: 1 for each unbound dim)."""
    each = ", ".join(f"input {name!r} axis {axis} " + (f"dim_param {sym!r}" if sym else "(no dim_param)")
                     for name, axis, sym, _ in unbound)
    shapes = {}
    for name, _, _, dims in unbound:
        shapes[name] = tuple(d if isinstance(d, int) else 1 for d in dims)
    by_input = "{" + ", ".join(f"{n!r}: {s}" for n, s in shapes.items()) + "}"
    flags = " ".join(f"--shape {n}={'x'.join(map(str, s))}" for n, s in shapes.items())
    how = (f"gir.Session(model, input_shapes={by_input}) in Python, {flags} on the command line "
           f"(your sizes in place of the 1s)")
    symbols = list(dict.fromkeys(sym for _, _, sym, _ in unbound if sym))
    if symbols and all(sym for _, _, sym, _ in unbound):
        by_dim = "{" + ", ".join(f"{s!r}: 1" for s in symbols) + "}"
        how += (f"; or by dim name: input_shapes={by_dim}, "
                + " ".join(f"--shape {s}=1" for s in symbols))
    n = len(unbound)
    return f"{label}: {n} unbound symbolic dim{'s' if n > 1 else ''} ({each}); GIR compiles static shapes: bind with {how}"


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    g = model.graph
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        out[vi.name] = vi.type
    return out


def _static_shape(tp: onnx.TypeProto):
    if tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return None
    dims = tp.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return tuple(d.dim_value for d in dims)


# ---- building -------------------------------------------------------------------------------

def _build(model, nodes, types, label, model_name) -> BasicGraph:
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    used = {t for n in g.node for t in n.input if t} | {o.name for o in g.output}
    tensors: dict[str, Tensor] = {}
    graph = BasicGraph(tensors, [], [], [o.name for o in g.output], model_name)
    for vi in g.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        tensors[vi.name] = Tensor(vi.name, tuple(d.dim_value for d in tt.shape.dim),
                                  gir_dtype(tt.elem_type, f"{label}: input {vi.name!r}"))
        graph.inputs.append(vi.name)
    for name, init in inits.items():
        if name not in used:
            continue
        dtype = gir_dtype(init.data_type, f"{label}: initializer {name!r}")
        value = _initializer_value(init, label)
        tensors[name] = Tensor(name, tuple(value.shape), dtype, value)
    _check_value_dtypes(g, types, label)

    reserved = {t for n in g.node for t in list(n.input) + list(n.output) if t} | set(tensors)
    names = Names(reserved)
    op_names = Names({n.name for n in nodes})
    for n in nodes:
        _check_output_sizes(n, graph, types, label)
        b = Builder(graph, n, names, op_names)
        try:
            entry = REGISTRY.get(n.op_type) if n.domain == "" else None
            if entry is not None:
                entry.fn(b, n)
            else:
                _fold_with_onnx_reference(b, n, model)
        except FrontendError:
            raise
        except Exception as e:  # noqa: BLE001 - a decomposition bug: say where, keep the cause
            raise FrontendError(f"{label}: {n.origin}: internal error while decomposing: "
                                f"{type(e).__name__}: {one_line(e)}") from e
        if len(b.ops) == 1:
            b.ops[0].name = n.name
        graph.ops.extend(b.ops)
        _cross_check(b, n, types, label)
    for o in g.output:
        if o.name not in tensors:
            raise FrontendError(f"{label}: graph output {o.name!r} is never produced")
    _prune(graph)
    return graph


def _initializer_value(init: onnx.TensorProto, label: str) -> np.ndarray:
    """The initializer's array; data that does not match its declared shape is a bad model
    (onnx.checker lets raw data longer than the shape through)."""
    what = f"{label}: initializer {init.name!r}"
    if any(d < 0 for d in init.dims):
        raise FrontendError(f"{what} has a negative dimension (dims {list(init.dims)})")
    expected = int(np.prod(init.dims, dtype=np.int64))
    if init.HasField("raw_data") and init.data_location != onnx.TensorProto.EXTERNAL:
        itemsize = helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        if len(init.raw_data) != expected * itemsize:
            raise FrontendError(f"{what} has {len(init.raw_data)} bytes of raw data, its shape {list(init.dims)} of "
                                f"{onnx_type_name(init.data_type)} needs {expected * itemsize}")
    try:
        value = np.array(numpy_helper.to_array(init))
    except Exception as e:  # noqa: BLE001 - typed data of the wrong length, unreadable external data
        raise FrontendError(f"{what}: its data does not match its shape {list(init.dims)}: {one_line(e)}") from None
    if value.size != expected:
        raise FrontendError(f"{what} holds {value.size} values, its shape {list(init.dims)} needs {expected}")
    return value


def _check_output_sizes(n: Node, graph: BasicGraph, types: dict, label: str) -> None:
    """Before a node is decomposed (or folded): its outputs, as ONNX shape inference sizes
    them, within the resource limits (gir/frontend/limits.py)."""
    folds = all(t in graph.tensors and graph.tensors[t].value is not None for t in n.inputs if t)
    for t in n.outputs:
        shape = _static_shape(types[t]) if t and t in types else None
        if shape is not None:
            check_tensor(f"{label}: {n.origin}", t, shape, fold=folds)


def _check_value_dtypes(g: onnx.GraphProto, types: dict, label: str) -> None:
    for n in g.node:
        for t in n.output:
            tp = types.get(t)
            if not t or tp is None:
                continue
            kind = tp.WhichOneof("value")
            if kind != "tensor_type":
                raise FrontendError(f"{label}: tensor {t!r} is a {kind}, GIR supports tensors only")
            if tp.tensor_type.elem_type and tp.tensor_type.elem_type not in ONNX_TO_GIR:
                gir_dtype(tp.tensor_type.elem_type, f"{label}: tensor {t!r} (output of node "
                                                    f"'{n.name or n.op_type}')")


def _cross_check(b: Builder, n: Node, types: dict, label: str) -> None:
    for t in n.outputs:
        if not t:
            continue
        if t not in b.graph.tensors:
            raise FrontendError(f"{label}: {n.origin}: internal error: output {t!r} was not produced")
        ours = b.graph.tensors[t]
        tp = types.get(t)
        if tp is None:
            continue
        theirs = _static_shape(tp)
        elem = tp.tensor_type.elem_type
        if (theirs is not None and tuple(theirs) != tuple(ours.shape)) or \
                (elem and ONNX_TO_GIR.get(elem) != ours.dtype):
            raise FrontendError(f"{label}: {n.origin}: internal error: output {t!r} decomposed as "
                                f"{ours.dtype}{list(ours.shape)}, ONNX infers "
                                f"{onnx_type_name(elem)}{list(theirs) if theirs is not None else '[?]'}")


def _fold_with_onnx_reference(b: Builder, n: Node, model: onnx.ModelProto) -> None:
    """An op GIR does not decompose, on constant inputs: compute it once with onnx.reference."""
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415 - slow import, rarely needed

    ins = [t for t in n.inputs if t]
    feeds = {t: b.value(t) for t in ins}
    if any(v is None for v in feeds.values()):
        raise b.error("op is not supported and its inputs are not all constant")
    vis = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for t, v in feeds.items()]
    outs = [helper.make_empty_tensor_value_info(t) for t in n.outputs if t]
    sub = helper.make_model(helper.make_graph([n.proto], "fold", vis, outs),
                            opset_imports=list(model.opset_import), ir_version=model.ir_version)
    try:
        results = ReferenceEvaluator(sub).run(None, feeds)
    except Exception as e:  # noqa: BLE001
        raise b.error(f"op is not supported and folding it with onnx.reference failed: {one_line(e)}") from None
    for t, v in zip([t for t in n.outputs if t], results):
        v = np.asarray(v)
        dtype = next((d for d in ONNX_TO_GIR.values() if np.dtype(d) == v.dtype), None)
        if dtype is None:
            raise b.error(f"folded output {t!r} has numpy type {v.dtype}, not a GIR dtype")
        b.constant(v, dtype, out=t)
    b.graph.notes.append(f"{n.origin}: folded with onnx.reference (all inputs constant)")


def _prune(graph: BasicGraph) -> None:
    keep = set(graph.inputs) | set(graph.outputs)
    for op in graph.ops:
        keep.update(op.inputs)
        keep.update(op.outputs)
    for name in [t for t in graph.tensors if t not in keep]:
        del graph.tensors[name]
