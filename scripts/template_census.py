"""How many graph structures and candidates each template offers at BERT-base shapes.

    python scripts/template_census.py [--target h100]
"""
import argparse
import time

import numpy as np

from gir.frontend.basic import BasicOp, Tensor
from gir.ir import Input, call, get_target
from gir.templates import candidates

S, H, HEADS, D, FFN, VOCAB = 128, 768, 12, 64, 3072, 30522


def cases():
    t = lambda n, s, dt="float32", v=None: Tensor(n, s, dt, v)
    yield ("elementwise: bias + GELU(erf) [1,128,3072]",
           BasicOp("gelu", "elementwise", ["x", "b"], ["y"], {"expr": call("erf", Input(0) + Input(1)), "dtype": "float32"}, ""),
           {"x": t("x", (1, S, FFN)), "b": t("b", (FFN,)), "y": t("y", (1, S, FFN))})
    yield ("reduce: sum over hidden [1,128,768] axis -1",
           BasicOp("sum", "reduce", ["x"], ["y"], {"op": "sum", "axes": (2,), "keepdims": True}, ""),
           {"x": t("x", (1, S, H)), "y": t("y", (1, S, 1))})
    yield ("reduce: softmax max [1,12,128,128] axis -1",
           BasicOp("max", "reduce", ["x"], ["y"], {"op": "max", "axes": (3,), "keepdims": True}, ""),
           {"x": t("x", (1, HEADS, S, S)), "y": t("y", (1, HEADS, S, 1))})
    yield ("layout: heads transpose [1,128,12,64] -> [1,12,128,64]",
           BasicOp("tr", "layout", ["x"], ["y"], {"offset": 0, "shape": (1, HEADS, S, D), "strides": (S * H, D, H, 1)}, ""),
           {"x": t("x", (1, S, HEADS, D)), "y": t("y", (1, HEADS, S, D))})
    yield ("layout: key transpose [1,12,128,64] -> [1,12,64,128]",
           BasicOp("kt", "layout", ["x"], ["y"], {"offset": 0, "shape": (1, HEADS, D, S), "strides": (S * H, S * D, 1, D)}, ""),
           {"x": t("x", (1, HEADS, S, D)), "y": t("y", (1, HEADS, D, S))})
    yield ("concat: KV cache [1,12,128,64] + [1,12,1,64] axis 2",
           BasicOp("cat", "concat", ["p", "n"], ["y"], {"axis": 2}, ""),
           {"p": t("p", (1, HEADS, S, D)), "n": t("n", (1, HEADS, 1, D)), "y": t("y", (1, HEADS, S + 1, D))})
    yield ("pad: constant [1,128,768] -> [1,130,768]",
           BasicOp("pad", "pad", ["x"], ["y"], {"pads": ((0, 0), (1, 1), (0, 0)), "mode": "constant", "value": 0.0}, ""),
           {"x": t("x", (1, S, H)), "y": t("y", (1, S + 2, H))})
    ids = np.arange(S, dtype=np.int64)
    yield ("gather: word embedding [30522,768] x 128 ids",
           BasicOp("emb", "gather", ["w", "i"], ["y"], {"axis": 0}, ""),
           {"w": t("w", (VOCAB, H)), "i": t("i", (1, S), "int64", ids.reshape(1, S)), "y": t("y", (1, S, H))})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="h100")
    target = get_target(ap.parse_args().target)
    print(f"| basic operator at a BERT-base shape ({target.name}) | structures | candidates | rejected | seconds |")
    print("|---|---|---|---|---|")
    for label, op, tensors in cases():
        start = time.perf_counter()
        found = candidates(op, tensors, target)
        structures = ", ".join(f"{k} {v}" for k, v in found.structures.items())
        print(f"| {label} | {structures} | {len(found.candidates)} | {len(found.rejected)} | {time.perf_counter() - start:.2f} |")


if __name__ == "__main__":
    main()
