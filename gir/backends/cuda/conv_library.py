"""Convolutions in cuDNN 9 through its Python frontend's graph API, for the CUDA launcher's
device runtime (dnn.Conv calls on resident pointers). Optional for the port: without cuDNN the
device engine runs convolutions as an im2col kernel + cuBLASLt.

One frontend graph per shape: conv_fprop, plus the bias where an engine fuses it (else the plain
convolution, and the engine adds the bias by GEMM), heuristics A then FALLBACK, no engine that
computes in less than the data's precision (`_inexact_notes`), planned before any capture and
executed on the launcher's stream. Workspaces only grow and are all kept for the launcher's
life: a captured graph holds the pointer it was captured with. On an H200 (2026-11-26) this
ran the gpu-marked tests and five zoo CNNs (results/bench_gpu_h200.md), then with cuDNN's
default engines; the exclusion of TF32 ones came after and has not run on a GPU yet."""
from __future__ import annotations

import ctypes
import dataclasses
import glob
import os
import sys

from gir.frontend.basic import contiguous_strides


class CudnnConvolutions:
    def __init__(self, stream: int, alloc):
        self.alloc, self.library, self.note = alloc, None, ""
        self.plans: dict = {}  # Conv.shape_key -> (built graph or None, prepare's answer)
        self.refusals: list[str] = []  # shapes (or bias fusions) cuDNN had no engine for, and why
        self.workspaces: list = []
        try:
            cudnn = _cudnn_frontend()
            handle = cudnn.create_handle()
            cudnn.set_stream(handle=handle, stream=stream)
        except Exception as e:  # noqa: BLE001 -- not installed, libcudnn not found, or it cannot start
            self.note = (f"cuDNN unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}; "
                         f"pip install 'gir[cuda]' installs it")
            self.dnn = None
            return
        self.dnn = (cudnn, handle)
        self.library = f"cudnn {cudnn.backend_version_string()} (frontend {cudnn.__version__})"

    def _graph(self, c, with_bias: bool):
        """(graph, x, w, y, bias tensor or None, workspace bytes), or the reason cuDNN refused."""
        cudnn, handle = self.dnn
        dtype = {"float32": cudnn.data_type.FLOAT, "float16": cudnn.data_type.HALF,
                 "bfloat16": cudnn.data_type.BFLOAT16}[c.dtype]
        f32 = cudnn.data_type.FLOAT
        x_shape, w_shape, y_shape, pre, post, strides, dilations = _at_least_2d(c)
        try:
            graph = cudnn.pygraph(io_data_type=dtype, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
            x = graph.tensor(name="x", dim=list(x_shape), stride=_strides(x_shape), data_type=dtype)
            w = graph.tensor(name="w", dim=list(w_shape), stride=_strides(w_shape), data_type=dtype)
            y = graph.conv_fprop(image=x, weight=w, pre_padding=list(pre), post_padding=list(post),
                                 stride=list(strides), dilation=list(dilations), compute_data_type=f32, name="conv")
            bias = None
            if with_bias:
                bias_shape = [1, w_shape[0]] + [1] * (len(x_shape) - 2)
                bias = graph.tensor(name="bias", dim=bias_shape, stride=_strides(bias_shape), data_type=dtype)
                y = graph.bias(input=y, bias=bias, compute_data_type=f32, name="add_bias")
            y.set_output(True).set_data_type(dtype).set_dim(list(y_shape)).set_stride(_strides(y_shape))
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.deselect_numeric_notes(_inexact_notes(cudnn, c.dtype))
            graph.check_support()
            graph.build_plans()
        except Exception as e:  # noqa: BLE001 -- cudnnGraphNotSupportedError or a cuDNN status
            return str(e).splitlines()[0] if str(e) else type(e).__name__
        return graph, x, w, y, bias, graph.get_workspace_size()

    def prepare(self, c) -> bool | None:
        """The graph for this shape, once: with the bias when an engine fuses it (True), else the
        plain convolution, kept under the bias-free shape (False); None when cuDNN has no engine
        for it (the reason is kept in `refusals`)."""
        if c.shape_key in self.plans:
            return self.plans[c.shape_key][1]
        built = self._graph(c, with_bias=bool(c.bias))
        if isinstance(built, str) and c.bias:  # the plain convolution, the bias by GEMM after it
            self.refusals.append(f"x {c.x_shape}, w {c.w_shape} with its bias: {built}")
            fits = None if self.prepare(dataclasses.replace(c, bias=0)) is None else False
            self.plans[c.shape_key] = (None, fits)
            return fits
        if isinstance(built, str):
            self.refusals.append(f"x {c.x_shape}, w {c.w_shape}: {built}")
            self.plans[c.shape_key] = (None, None)
            return None
        need = built[-1]
        if need and (not self.workspaces or self.workspaces[-1].nbytes < need):
            self.workspaces.append(self.alloc(need))
        self.plans[c.shape_key] = (built, True)
        return True

    def run(self, c) -> None:
        """Enqueue `c` (prepared) on the launcher's stream."""
        (graph, x, w, y, bias, need), _ = self.plans[c.shape_key]
        cudnn, handle = self.dnn
        pack = {x: c.x, w: c.w, y: c.y}
        if bias is not None:
            pack[bias] = c.bias
        graph.execute(pack, self.workspaces[-1].ptr if need else 0, handle=handle)

    def close(self, free) -> None:
        if self.dnn is not None:
            cudnn, handle = self.dnn
            self.plans.clear()
            cudnn.destroy_handle(handle)
            self.dnn = None
        for workspace in self.workspaces:
            free(workspace)
        self.workspaces.clear()


def _inexact_notes(cudnn, dtype: str) -> list:
    """cuDNN engines GIR does not use: any that accumulates in less than fp32, and for fp32
    data the tensor-core (TF32) and down-converting ones, as cuBLASLt runs COMPUTE_32F. With
    cuDNN's default engines on an H200 (2026-11-26) fp32 models differed from onnxruntime by
    up to 4.5e-4 (ShuffleNet; SAR-DRN 1.3e-4, RedNet-50 2.8e-4) against 2e-7 through
    im2col + cuBLASLt. A shape left with no engine runs as im2col + GEMM."""
    notes = [cudnn.numerical_note.REDUCED_PRECISION_REDUCTION]
    if dtype == "float32":
        notes += [cudnn.numerical_note.TENSOR_CORE, cudnn.numerical_note.DOWN_CONVERT_INPUTS]
    return notes


def _strides(shape) -> list[int]:
    return list(contiguous_strides(shape))


def _at_least_2d(c):
    """cuDNN's graph convolutions are 2-D or 3-D: a 1-D one gets a unit trailing axis."""
    geometry = (c.x_shape, c.w_shape, c.y_shape, c.pre_pads, c.post_pads, c.strides, c.dilations)
    if len(c.x_shape) > 3:
        return geometry
    x, w, y, pre, post, strides, dilations = geometry
    return x + (1,), w + (1,), y + (1,), pre + (0,), post + (0,), strides + (1,), dilations + (1,)


def _cudnn_frontend():
    """The cuDNN frontend module with libcudnn loaded. The frontend looks for libcudnn only in
    the interpreter's own site-packages; the library is loaded first from wherever
    nvidia-cudnn-cu13 is on sys.path (a --target or user install, a virtual environment).

    Its package imports torch when torch is installed (for its torch-tensor conveniences, which
    GIR does not use: it passes device pointers and cuDNN's own types). That import costs
    seconds at Session creation, and on an H200 (2026-11-26) it failed inside a Session built
    from the compile cache ("partially initialized module 'torch'"), so torch is kept out of
    it: unless torch is already imported, `import torch` fails while cudnn is imported."""
    for entry in sys.path:
        found = sorted(glob.glob(os.path.join(entry or ".", "nvidia", "cudnn", "lib", "libcudnn.so.9")))
        if found:
            ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
            break
    if "cudnn" in sys.modules or "torch" in sys.modules:
        import cudnn
        return cudnn
    sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile
    try:
        import cudnn
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return cudnn
