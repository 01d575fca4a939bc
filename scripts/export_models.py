"""Export small configurations of standard architectures with torch.onnx, both exporters.

Writes models/exported/<name>_<exporter>.onnx (weights inline), <name>_<exporter>.npz (the
PyTorch reference: every graph input and output by its ONNX name) and manifest.json (per file:
inputs with their symbolic dimensions and the values to bind them to, outputs, exporter, opset,
torch version, onnxruntime's agreement with PyTorch). The exporters are torch.onnx's dynamo
exporter (PyTorch's default, opset 18) and the TorchScript exporter (dynamo=False, opset 17),
with batch and sequence dimensions dynamic as exports usually have them.

Needs the pins of scripts/requirements-export.txt (PyTorch, transformers, onnxscript); GIR
itself and its tests never import them. Deterministic: seeded weights and inputs.

    python scripts/export_models.py [--only bert gpt2 ...] [--exporter dynamo torchscript]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_cnns import EfficientNetB0, MobileNetV3Small, ResNet50, ShuffleNetV2, randomize_batchnorm  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "models" / "exported"
OPSETS = {"dynamo": 18, "torchscript": 17}
SEED = 0


@dataclass
class Spec:
    """One model to export: the module, its example inputs in forward order (ONNX names),
    which axes are dynamic (ONNX dim names), and the output names."""
    module: nn.Module
    inputs: dict[str, torch.Tensor]
    dynamic: dict[str, dict[int, str]]
    outputs: list[str]
    dim_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    derived: dict[str, tuple[str, int]] = field(default_factory=dict)  # name: (base dim, offset)


class Outputs(nn.Module):
    """Wraps a transformers model so that its forward takes and returns plain tensors in a fixed
    order (the exported graph's inputs and outputs)."""

    def __init__(self, model, keys):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *args):
        names = self.model.forward.__code__.co_varnames[1:1 + len(args)]
        out = self.model(**dict(zip(names, args)))
        return tuple(out[k] for k in self.keys)


def _generator():
    return torch.Generator().manual_seed(SEED)


def _ids(g, vocab, *shape):
    return torch.randint(0, vocab, shape, generator=g)


def _padding_mask(batch, seq):
    """The last item of the batch has its final two positions padded (mask 0)."""
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, -2:] = 0
    return mask


def bert() -> Spec:
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32, initializer_range=0.2)
    model = BertModel(cfg).eval()
    g, batch, seq = _generator(), 2, 8

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    inputs = {"input_ids": _ids(g, 64, batch, seq), "attention_mask": _padding_mask(batch, seq),
              "token_type_ids": torch.cat([torch.zeros(batch, seq // 2, dtype=torch.int64),
                                           torch.ones(batch, seq - seq // 2, dtype=torch.int64)], 1)}
    dyn = {n: {0: "batch", 1: "sequence"} for n in inputs}
    return Spec(Bert(), inputs, dyn, ["last_hidden_state", "pooler_output"], {"sequence": (2, 32)})


def gpt2() -> Spec:
    """One decode step: one new token per sequence, the keys and values of 7 earlier tokens."""
    from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64, initializer_range=0.2,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    g, batch, past, heads, head_dim = _generator(), 2, 7, 2, 16

    class Decode(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, past_key_0, past_value_0, past_key_1, past_value_1):
            cache = DynamicCache(config=cfg)
            cache.update(past_key_0, past_value_0, 0)
            cache.update(past_key_1, past_value_1, 1)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            kv = out.past_key_values
            return (out.logits, kv.layers[0].keys, kv.layers[0].values, kv.layers[1].keys, kv.layers[1].values)

    inputs = {"input_ids": _ids(g, 64, batch, 1), "attention_mask": _padding_mask(batch, past + 1)}
    inputs["attention_mask"][-1, -2:] = 1
    inputs["attention_mask"][-1, :2] = 0  # left padding, as batched generation does
    dyn = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch", 1: "total_sequence"}}
    for layer in range(2):
        for kind in ("key", "value"):
            name = f"past_key_values.{layer}.{kind}"
            inputs[name] = torch.randn(batch, heads, past, head_dim, generator=g)
            dyn[name] = {0: "batch", 2: "past_sequence"}
    outputs = ["logits"] + [f"present.{layer}.{kind}" for layer in range(2) for kind in ("key", "value")]
    return Spec(Decode(), inputs, dyn, outputs, {"past_sequence": (1, 62)}, {"total_sequence": ("past_sequence", 1)})


def vit() -> Spec:
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, initializer_range=0.2)
    model = ViTModel(cfg).eval()

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            out = self.model(pixel_values=pixel_values)
            return out.last_hidden_state, out.pooler_output

    inputs = {"pixel_values": torch.randn(2, 3, 32, 32, generator=_generator())}
    return Spec(ViT(), inputs, {"pixel_values": {0: "batch"}}, ["last_hidden_state", "pooler_output"])


def llama() -> Spec:
    """A LLaMA-style decoder: token embedding, one decoder layer (RMSNorm, rotary embeddings,
    grouped-query attention, SiLU-gated MLP) and the final RMSNorm (LlamaModel, one layer)."""
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.2, use_cache=False)
    model = LlamaModel(cfg).eval()
    for m in model.modules():  # RMSNorm weights start at 1: make them do something
        if type(m).__name__ == "LlamaRMSNorm":
            m.weight.data.copy_(torch.rand(m.weight.shape, generator=_generator()) + 0.5)
    g, batch, seq = _generator(), 2, 8

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    inputs = {"input_ids": _ids(g, 64, batch, seq), "attention_mask": _padding_mask(batch, seq)}
    dyn = {n: {0: "batch", 1: "sequence"} for n in inputs}
    return Spec(Llama(), inputs, dyn, ["last_hidden_state"], {"sequence": (2, 64)})


def _cnn(model: nn.Module, size: int = 64) -> Spec:
    g = _generator()
    torch.manual_seed(SEED)
    randomize_batchnorm(model, g)
    inputs = {"pixel_values": torch.randn(2, 3, size, size, generator=g)}
    return Spec(model.eval(), inputs, {"pixel_values": {0: "batch"}}, ["logits"])


def _seeded(build):
    def make():
        torch.manual_seed(SEED)
        return build()
    make.__doc__ = build.__doc__
    return make


MODELS = {
    "bert": _seeded(bert),
    "gpt2": _seeded(gpt2),
    "vit": _seeded(vit),
    "llama": _seeded(llama),
    "resnet50": _seeded(lambda: _cnn(ResNet50())),
    "efficientnet_b0": _seeded(lambda: _cnn(EfficientNetB0())),
    "shufflenet_v2": _seeded(lambda: _cnn(ShuffleNetV2())),
    "mobilenet_v3": _seeded(lambda: _cnn(MobileNetV3Small())),
}


def _dynamic_shapes(spec: Spec):
    """torch.export Dims for the dynamo exporter, one per dim name, derived ones as offsets."""
    dims = {}
    for axes in spec.dynamic.values():
        for name in axes.values():
            if name in spec.derived or name in dims:
                continue
            lo, hi = spec.dim_bounds.get(name, (1, 64))
            dims[name] = torch.export.Dim(name, min=lo, max=hi)
    for name, (base, offset) in spec.derived.items():
        dims[name] = dims[base] + offset
    return tuple({a: dims[d] for a, d in spec.dynamic.get(n, {}).items()} or None for n in spec.inputs)


def export(name: str, spec: Spec, exporter: str, path: Path) -> None:
    args = tuple(spec.inputs.values())
    common = dict(input_names=list(spec.inputs), output_names=spec.outputs, opset_version=OPSETS[exporter])
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(spec.module, args, str(path), dynamo=True, external_data=False,
                              dynamic_shapes=_dynamic_shapes(spec), **common)
        else:
            axes = {n: dict(a) for n, a in spec.dynamic.items()}
            torch.onnx.export(spec.module, args, str(path), dynamo=False, dynamic_axes=axes, **common)
    _strip_stack_traces(path)


def _strip_stack_traces(path: Path) -> None:
    """Drop the dynamo exporter's per-node Python stack traces: they hold this machine's file
    paths (the file would differ per checkout) and are a third of each file. Every other node
    annotation (namespace, class hierarchy, fx node, name scopes) stays as the exporter wrote it."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
    onnx.save(model, str(path))


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b| (the measure tests/test_exported_models.py uses)."""
    return float(np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))


def _graph_dims(model: onnx.ModelProto) -> dict[str, list]:
    """Each graph input's shape as the file states it: ints and symbolic names."""
    inits = {t.name for t in model.graph.initializer}
    return {i.name: [d.dim_param if d.dim_param else d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input if i.name not in inits}


def run(names, exporters, out: Path = OUT) -> dict:
    import onnxruntime as ort
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name in names:
        for exporter in exporters:
            spec = MODELS[name]()
            with torch.no_grad():
                ref = spec.module(*spec.inputs.values())
            ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
            key = f"{name}_{exporter}"
            path = out / f"{key}.onnx"
            export(name, spec, exporter, path)
            model = onnx.load(str(path))
            feeds = {n: t.numpy() for n, t in spec.inputs.items()}
            expected = {n: t.numpy() for n, t in zip(spec.outputs, ref)}
            np.savez_compressed(out / f"{key}.npz", **feeds, **expected)
            got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(spec.outputs, feeds)
            ort_err = max(_rel_err(a, expected[n]) for a, n in zip(got, spec.outputs))
            dims = _graph_dims(model)
            ops = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in model.graph.node})
            manifest[key] = {
                "model": name, "exporter": exporter, "file": path.name, "reference": f"{key}.npz",
                "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                "torch": torch.__version__, "inputs": {n: {"shape": dims[n], "bind": list(feeds[n].shape),
                                                           "dtype": str(feeds[n].dtype)} for n in feeds},
                "outputs": {n: list(expected[n].shape) for n in spec.outputs},
                "nodes": len(model.graph.node), "ops": ops, "bytes": path.stat().st_size,
                "onnxruntime_rel_err": ort_err,
            }
            print(f"{key:<28} {path.stat().st_size / 1024:8.1f} KiB {len(model.graph.node):5d} nodes  "
                  f"onnxruntime rel err {ort_err:.1e}", flush=True)
    manifest = dict(sorted(manifest.items()))
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    ap.add_argument("--exporter", nargs="+", choices=sorted(OPSETS), default=list(OPSETS))
    ap.add_argument("--out", type=Path, default=OUT, help="folder (default: models/exported)")
    args = ap.parse_args(argv)
    run(args.only, args.exporter, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
