"""onnx's backend node tests (built in memory by onnx) for every op the frontend supports,
run through tests/onnx_backend.py's ReferenceBackend (frontend + the numpy reference).

INCLUDE names the tests per op; EXCLUDED lists every case left out, with the reason. An
included case that fails fails the suite. Only the CPU variant runs (the backend has no other
device); the other categories (real models, pytorch-converted, ...) are not included.
"""
from __future__ import annotations

import re
import warnings

import onnx.backend.test

from onnx_backend import ReferenceBackend

# op -> regex over test names (without the _cpu suffix); anchored to avoid Cosh under Cos, etc.
INCLUDE = {
    "Abs": r"abs", "Add": r"add(_.*)?", "And": r"and.*", "AveragePool": r"averagepool_.*",
    "BatchNormalization": r"batchnorm_.*", "Cast": r"cast_.*", "CastLike": r"castlike_.*", "Ceil": r"ceil(_example)?",
    "Clip": r"clip(_.*)?", "Concat": r"concat_.*", "Constant": r"constant", "ConstantOfShape": r"constantofshape_.*",
    "Conv": r"conv_with_.*", "Cos": r"cos(_example)?", "Div": r"div(_.*)?", "Equal": r"equal(_.*)?", "Erf": r"erf",
    "Exp": r"exp(_example)?", "Expand": r"expand_dim_.*", "Flatten": r"flatten_.*", "Floor": r"floor(_example)?",
    "Gather": r"gather_(\d|2d|negative).*", "Gelu": r"gelu_.*", "Gemm": r"gemm_.*",
    "GlobalAveragePool": r"globalaveragepool.*", "GlobalMaxPool": r"globalmaxpool.*",
    "Greater": r"greater(_.*)?", "HardSigmoid": r"hardsigmoid.*", "HardSwish": r"hardswish.*",
    "Identity": r"identity.*", "InstanceNormalization": r"instancenorm_.*", "IsNaN": r"isnan.*",
    "LayerNormalization": r"layer_normalization_.*", "LeakyRelu": r"leakyrelu.*", "Less": r"less(_.*)?",
    "Log": r"log(_example)?", "LogSoftmax": r"logsoftmax_.*", "MatMul": r"matmul_\d.*", "Max": r"max_.*",
    "MaxPool": r"maxpool_.*", "Mean": r"mean_.*", "Min": r"min_.*", "Mul": r"mul(_.*)?", "Neg": r"neg(_example)?",
    "Not": r"not_.*", "Or": r"or.*", "Pad": r"(constant|edge|reflect|wrap)_pad.*", "Pow": r"pow(_.*)?",
    "PRelu": r"prelu_.*", "Reciprocal": r"reciprocal(_example)?", "Reduce*": r"reduce_.*", "Relu": r"relu.*",
    "Reshape": r"reshape_.*", "Shape": r"shape(_.*)?", "Sigmoid": r"sigmoid(_example)?", "Sin": r"sin(_example)?",
    "Size": r"size(_example)?", "Slice": r"slice.*", "Softmax": r"softmax_.*", "Split": r"split_(?!to_sequence).*",
    "Sqrt": r"sqrt(_example)?", "Squeeze": r"squeeze(_.*)?", "Sub": r"sub(_.*)?", "Sum": r"sum_.*", "Tanh": r"tanh(_example)?",
    "Tile": r"tile.*", "Transpose": r"transpose_.*", "Unsqueeze": r"unsqueeze_.*", "Where": r"where_.*",
    "Xor": r"xor.*",
    "GatherND": r"gathernd_.*", "ArgMax": r"argmax_.*", "ArgMin": r"argmin_.*", "CumSum": r"cumsum_.*",
    "Trilu": r"tril.*|triu.*", "Mod": r"mod_.*", "Range": r"range_.*", "Dropout": r"dropout_.*",
    "Resize": r"resize_.*", "Upsample": r"upsample_.*", "RMSNormalization": r"rms_normalization_.*", "Attention": r"attention_.*",
    "ConvTranspose": r"convtranspose.*", "Einsum": r"einsum_.*",
    # function-expanded composite ops: bodies made only of the ops above
    "(composites)": r"(elu|selu|softplus|softsign|thresholdedrelu|shrink_(hard|soft))(_example|_default)?_expanded.*"
                    r"|swish_expanded|mvn_expanded.*|group_normalization_.*_expanded|(space|depth)to(space|depth)_.*expanded"
                    r"|center_crop_pad_.*_expanded|rotary_embedding(_.*)?_expanded|flexattention(_.*)?_expanded.*"
                    r"|causal_conv_with_state_.*_expanded|basic_conv_with.*|matmul_bcast",
}

# test name regex (searched in the test name) -> why it is left out. Every exclusion is here.
EXCLUDED = {
    r"_(u?int16|uint32|uint64)_":
        "int16/uint16/uint32/uint64 tensors: not GIR dtypes (gir.ir.dtypes); the frontend rejects them by name",
    r"FLOAT8|FLOAT4E2M1|_U?INT[24]_|e8m0":
        "float8, float4, int4, int2 tensors: not GIR dtypes; the frontend rejects them by name",
    r"^test_equal_string":
        "string tensors: not a GIR dtype",
    r"^test_identity_(opt|sequence)_":
        "optional / sequence inputs: GIR takes tensors only",
    r"^test_batchnorm_.*_training_mode_":
        "BatchNormalization training_mode=1 (batch statistics, running-stat outputs): GIR is inference only",
    r"^test_layer_normalization_[a-z0-9_]*(axis\d|axis_negative_\d|epsilon|default_axis)_cpu$":
        "the node asks for the Mean and InvStdDev outputs, which GIR does not produce (only Y); "
        "the _expanded variants of the same cases run",
    r"^test_maxpool_with_argmax_":
        "MaxPool's Indices output is not supported (only Y)",
    r"^test_range_.*_expanded_cpu$":
        "Range's function body is a Loop (control flow), which GIR does not compile; Range itself runs",
    r"^test_resize_downsample_scales_(linear|cubic)_align_corners_cpu$":
        "align_corners with a scale whose output length is not scale * input length: onnx's reference (which made "
        "the expected outputs) divides by scale * length_original - 1, the specification and onnxruntime by the "
        "integer output length - 1; GIR follows the specification and matches onnxruntime (tests/test_set_b_ops.py)",
    r"^test_attention_4d_(causal_fp16|gqa_with_past_and_present_fp16)_cpu$":
        "fp16 Attention: GIR computes the scores and softmax in fp32 (as softmax_precision=1 asks); onnx's "
        "reference (which made the expected outputs) computes them in fp16, and 1-2 outputs differ by one fp16 ulp, "
        "over the case's rtol of 1e-3 (the _expanded variants, fp16 op by op, pass)",
    r"^test_wrap_pad_":
        "Pad mode='wrap' is not supported (constant, reflect, edge)",
}

def node_tests(backend, module: str, extra_excluded=()) -> dict:
    """onnx's node test classes for `backend`: the INCLUDEd ops only (the ~3,400 cases of ops GIR
    does not claim are dropped, not reported as skipped); EXCLUDED cases stay, skipped."""
    with warnings.catch_warnings():  # onnx's own case generators overflow on purpose (cast, reduce)
        warnings.simplefilter("ignore", RuntimeWarning)
        test = onnx.backend.test.BackendTest(backend, module)
    for pattern in INCLUDE.values():
        test.include(rf"^test_(?:{pattern})_cpu$")
    for pattern in (*EXCLUDED, *extra_excluded):
        test.exclude(pattern)
    wanted = re.compile("|".join(rf"^test_(?:{p})_cpu$" for p in INCLUDE.values()))
    cases = test.test_cases  # a property that builds new classes on every access: read it once
    for case in cases.values():
        for name in [n for n in vars(case) if n.startswith("test_") and not wanted.search(n)]:
            delattr(case, name)
    return {k: c for k, c in cases.items() if any(n.startswith("test_") for n in vars(c))}


globals().update(node_tests(ReferenceBackend, __name__))
