"""Library ops (matmul, conv) on oneDNN, for the native CPU engine.

Why oneDNN, and the `onednn-cpu-gomp` wheel: it is the CPU library PyTorch, OpenVINO and
onnxruntime's DNNL provider use; the wheel is built on GNU OpenMP, the libgomp GIR's kernels
already load, so library calls and fused kernels share one pool of threads (numpy's OpenBLAS
keeps a second pool that fights OpenMP's for the cores, issue 25), and it installs from pip
with no system package. Its headers come in `onednn-devel-cpu-gomp`. oneDNN has only a C API:
a small C shim (onednn_shim.c) is built by the CPU backend's compiler into the compile cache
and loaded with ctypes. Per op, at session creation, the shim creates the primitive and
reorders constant weights once into the layout it prefers; a run points it at the operands
and at the output's arena slot.

`library()` is the loaded shim or None, with `unavailable()` saying why (the wheels are missing,
no compiler, the build failed); ops oneDNN does not take here (not float32, conv with more than
3 spatial dims, matmul of more than 6 dims, a primitive it cannot create) run through numpy."""
from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import numpy as np

from gir.frontend.basic import BasicOp

SHIM = Path(__file__).with_name("onednn_shim.c")
# Epilogue steps (gir/fusion/epilogue.py) as oneDNN post-ops: kind -> (index into the shim's
# eltwise_algs, alpha and beta from the step's). A residual is a binary add (-1). The numpy
# fallback runs every kind too, so the CPU target declares them all (`EPILOGUES`).
POST_OPS = {
    "relu": (0, lambda a, b: (0.0, 0.0)), "leaky_relu": (0, lambda a, b: (a, 0.0)),
    "sigmoid": (1, lambda a, b: (0.0, 0.0)), "tanh": (2, lambda a, b: (0.0, 0.0)),
    "silu": (3, lambda a, b: (a, 0.0)), "gelu_erf": (4, lambda a, b: (0.0, 0.0)),
    "gelu_tanh": (5, lambda a, b: (0.0, 0.0)), "clip": (6, lambda a, b: (a, b)),
    "hardsigmoid": (7, lambda a, b: (a, b)), "hardswish": (8, lambda a, b: (a, b)),
    "elu": (9, lambda a, b: (a, 0.0)), "residual": (-1, lambda a, b: (0.0, 0.0)),
}
EPILOGUES = {"kinds": tuple(sorted({"bias", *POST_OPS})), "dtypes": ("float32",)}  # sorted: repr(target) keys caches
WHEEL, DEVEL = "onednn-cpu-gomp", "onednn-devel-cpu-gomp"
# $GIR_CPU_LIBRARY=numpy runs every library op through numpy (comparisons, debugging).
ENV = "GIR_CPU_LIBRARY"
_why: list[str] = []


def _wheel_file(dist: str, suffix: str) -> Path:
    d = metadata.distribution(dist)
    for f in d.files or ():
        if str(f).endswith(suffix):
            return Path(d.locate_file(f)).resolve()
    raise FileNotFoundError(f"{dist} has no {suffix}")


def library() -> ctypes.CDLL | None:
    """The built shim linked against the wheel's libdnnl, or None (see `unavailable`)."""
    if os.environ.get(ENV, "").lower() == "numpy":
        _why.append(f"{ENV}=numpy")
        return None
    return _load()


@lru_cache(maxsize=None)
def _load() -> ctypes.CDLL | None:
    try:
        lib_path = _wheel_file(WHEEL, "libdnnl.so.3")
        header = _wheel_file(DEVEL, "oneapi/dnnl/dnnl.h")
    except (metadata.PackageNotFoundError, FileNotFoundError) as err:
        _why.append(f"oneDNN is not installed ({err}; pip install {WHEEL} {DEVEL})")
        return None
    from gir.backends.cpu.compiler import CC, toolchain_version
    from gir.backends.native_cache import cached_library
    libdir, include = lib_path.parent, header.parent.parent.parent
    toolchain = f"{toolchain_version()}\0{metadata.version(WHEEL)}\0{lib_path}"
    try:
        lib = cached_library(toolchain, CC, ["-O2", "-shared", "-fPIC", "-std=c11", f"-I{include}"],
                             SHIM.read_text(), ".c", "the oneDNN shim", f"the CPU ({CC})",
                             libraries=(str(lib_path), f"-Wl,-rpath,{libdir}", "-lgomp"))
    except Exception as err:  # noqa: BLE001 -- no compiler or a failed build: numpy runs the ops
        _why.append(f"the oneDNN shim did not build ({str(err).splitlines()[0]})")
        return None
    vp, i64 = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    post = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float),
            ctypes.c_int]
    lib.gir_dnnl_conv.argtypes = [ctypes.POINTER(vp), ctypes.c_int, i64, i64, i64, ctypes.c_int64, i64, i64, i64,
                                  i64, vp, ctypes.c_int, ctypes.c_int, *post, ctypes.c_char_p, ctypes.c_int]
    lib.gir_dnnl_matmul.argtypes = [ctypes.POINTER(vp), ctypes.c_int, i64, i64, i64, vp, ctypes.c_int, *post,
                                    ctypes.c_char_p, ctypes.c_int]
    lib.gir_dnnl_run.argtypes = [vp] * 8
    lib.gir_dnnl_staging_bytes.argtypes, lib.gir_dnnl_staging_bytes.restype = [vp, ctypes.c_int], ctypes.c_int64
    lib.gir_dnnl_free.argtypes, lib.gir_dnnl_free.restype = [vp], None
    lib.gir_dnnl_threads.argtypes, lib.gir_dnnl_threads.restype = [ctypes.c_int], ctypes.c_int
    lib.gir_dnnl_pool.argtypes, lib.gir_dnnl_pool.restype = [], ctypes.c_int
    lib.gir_dnnl_set_op_threads.argtypes, lib.gir_dnnl_set_op_threads.restype = [vp, ctypes.c_int], None
    lib.gir_dnnl_handoff_bytes.argtypes, lib.gir_dnnl_handoff_bytes.restype = [vp, vp], ctypes.c_int64
    lib.gir_dnnl_handoff.argtypes, lib.gir_dnnl_handoff.restype = [vp, vp, vp], None
    lib.gir_dnnl_version.argtypes, lib.gir_dnnl_version.restype = [ctypes.POINTER(ctypes.c_int)], None
    if lib.gir_dnnl_init():
        _why.append("oneDNN found no CPU engine")
        return None
    return lib


def unavailable() -> str:
    """Why `library()` is None ("" when it is loaded)."""
    return "" if library() is not None else (_why[-1] if _why else "unknown")


def version() -> str:
    lib = library()
    if lib is None:
        return ""
    v = (ctypes.c_int * 3)()
    lib.gir_dnnl_version(v)
    return ".".join(map(str, v))


def aligned_bytes(n: int, align: int = 64) -> np.ndarray:
    """n bytes starting at a multiple of `align` (numpy's own start 16 bytes past a page)."""
    raw = np.empty(n + align, np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip:skip + n]


def _dims(shape) -> ctypes.Array:
    return (ctypes.c_int64 * max(len(shape), 1))(*shape)


class DnnlOp:
    """One library op as a oneDNN primitive. `operands` are the op's input tensor names in the
    order the shim takes them (src, weights, bias; None where absent; then the epilogue's
    residual inputs); `call(src, wei, bias, *residuals, dst)` takes addresses. `staging` is the bytes of src and dst in the primitive's own layout
    (0 where it reads or writes the plain arrays): the caller lends buffers that large with
    `stage(src_buffer, dst_buffer)` (one pair for a whole session), else each op gets its own."""

    def __init__(self, lib, handle, impl: str, operands: list, keep: list):
        self.lib, self.handle, self.impl, self.operands = lib, handle, impl, operands
        self.threads = 0  # OpenMP threads a run uses; 0: the pool's default
        self.blocked = False
        self.separate = False  # the epilogue as primitives of its own after the op, not as post-ops
        self._keep = keep  # arrays the primitive was created from (constant weights stay alive)
        self.staging = tuple(int(lib.gir_dnnl_staging_bytes(handle, i)) for i in (0, 1))
        self.stage(*(aligned_bytes(n) for n in self.staging))

    @property
    def choice(self) -> tuple[bool, int]:
        """(blocked, threads[, separate]): what `prepare` takes to make this primitive again."""
        return (self.blocked, self.threads, True) if self.separate else (self.blocked, self.threads)

    def stage(self, src: np.ndarray, dst: np.ndarray) -> None:
        assert src.nbytes >= self.staging[0] and dst.nbytes >= self.staging[1]
        self._stage = (src, dst)  # kept alive
        self._stage_ptrs = (src.ctypes.data if src.nbytes else None, dst.ctypes.data if dst.nbytes else None)

    def handoff_bytes(self, to: "DnnlOp") -> int:
        """Bytes of this op's output in its primitive's layout where `to` reads its source in
        exactly that layout (both blocked), else 0 (gir_dnnl_handoff_bytes)."""
        return int(self.lib.gir_dnnl_handoff_bytes(self.handle, to.handle))

    def handoff(self, src: np.ndarray | None, dst: np.ndarray | None) -> None:
        """Read the source from / leave the output in these buffers, in the primitive's own
        layout, instead of the plain operands (None: the plain operand, as before)."""
        self._handoff = (src, dst)  # kept alive
        self.lib.gir_dnnl_handoff(self.handle, None if src is None else src.ctypes.data,
                                  None if dst is None else dst.ctypes.data)

    @property
    def layout(self) -> str:
        """How the op reads and writes its activations, for reports: "blocked", "as a matmul" or ""."""
        return "as a matmul" if self.blocked == MATMUL else "blocked" if self.blocked else ""

    def call(self, src: int, wei: int, bias: int, *rest: int) -> None:
        post = (ctypes.c_void_p * len(rest[:-1]))(*rest[:-1]) if len(rest) > 1 else None
        self._check(self.lib.gir_dnnl_run(self.handle, src, wei, bias, rest[-1], *self._stage_ptrs, post))

    def _check(self, status: int) -> None:
        if status:
            raise RuntimeError(f"oneDNN primitive ({self.impl}) failed with status {status}")

    def awake_thunk(self, src: int, wei: int, bias: int, *rest: int):
        """`call` on these addresses, run while the team's other threads spin
        (gir/runtime/awake_call.py), or None where that cannot be."""
        from gir.runtime.awake_call import awake_thunk
        post = (ctypes.c_void_p * len(rest[:-1]))(*rest[:-1]) if len(rest) > 1 else None
        run = awake_thunk(self.lib.gir_dnnl_run, [self.handle.value, src, wei, bias, rest[-1], *self._stage_ptrs,
                                                  ctypes.addressof(post) if post is not None else None], returns_int=True)
        if run is None:
            return None

        def thunk():
            self._check(run())
        thunk.keep = (post, run)
        return thunk

    def __del__(self):
        if self.handle:
            self.lib.gir_dnnl_free(self.handle)
            self.handle = None


# An op of fewer multiply-adds than this is also made for one thread and timed both ways: one
# thread computes ~1M multiply-adds in the ~38 us that forking and joining the pool costs here
# with passive waits (gir calibrate), so small convs can lose more to the fork than
# the second thread saves them (EfficientNet-B0's and ShuffleNet's late 1x1 convs).
TIME_ONE_THREAD_BELOW = 8_000_000


def prepare(op: BasicOp, tensors: dict, constants: dict, choice: tuple | None = None,
            pool_asleep: bool = False) -> DnnlOp | str:
    """A primitive for `op`, or the reason numpy runs it. `constants`: name -> flat array of the
    graph's constant tensors (weights reordered from them now). `choice`: (blocked, threads[, separate]) as
    chosen before (a session read back from the cache), or None to choose now; the primitive's
    own is `.choice`. `pool_asleep`: the op runs after one-thread work, so a choice that forks
    the pool wakes it (`timed`).
    Every choice an op has is made and run on zeros (`timed`), and the fastest kept:
    - blocked (convs): activations reordered into oneDNN's own layout and back at each run
      (True), read and written in place as NCHW (False), or for a 1x1 conv a matmul (MATMUL,
      `pointwise`). Neither wins everywhere. On 2 AMD
      EPYC (AVX-512) cores, one thread, reorders included: a dilated 3x3 conv of 64 channels at
      256x256 54 ms plain against 73 blocked (transposing 16 MB activations out of cache costs
      5-9 ms each way), a strided 1x1 conv (256 -> 512 at 56x56) 6.7 plain against 2.7 blocked;
      EfficientNet-B0's small 1x1 convs mostly run faster plain (no reorder: oneDNN's GEMM).
    - threads (ops of fewer than TIME_ONE_THREAD_BELOW multiply-adds, where the pool has more
      than one thread): 1, made for and run on one thread, or 0, the pool's default.
    - separate (ops with an epilogue): its steps as oneDNN post-ops (False) or as eltwise and
      binary primitives run in place on the output after the op (True). oneDNN's GEMM
      convolution (the plain layout) applies post-ops in a slow pass of its own: ShuffleNet-v2's
      1x1 convs with a ReLU post-op took 80 us against 55 without it (one thread, 2 AMD EPYC
      cores), where the jit eltwise primitive after it costs a few."""
    if choice is not None:
        return _prepare(op, tensors, constants, *choice)
    lib = library()
    threads = (0, 1) if lib is not None and lib.gir_dnnl_pool() > 1 and _macs(op, tensors) < TIME_ONE_THREAD_BELOW else (0,)
    made = [_prepare(op, tensors, constants, *c) for c in candidate_choices(op, tensors, threads)]
    ok = [m for m in made if not isinstance(m, str)]
    # oneDNN's reference kernels are loops for checking, not for running: a 64-channel dilated
    # 3x3 conv at 256x256 with a sum post-op in the plain layout fell onto ref:any and took
    # minutes to time. Where another choice has a real kernel, the reference is not tried.
    real = [m for m in ok if not m.impl.startswith("ref")]
    ok = real or ok
    if len(ok) < 2:
        return ok[0] if ok else made[0]
    # an epilogue apart must win by more than timing noise: fused, a blocked op can also hand
    # its output to the next op in its own layout (the CPU engine's hand-offs), apart it cannot
    return min(ok, key=lambda m: timed(m, op, tensors, asleep=pool_asleep) * (APART_MARGIN if m.separate else 1.0))


MATMUL = "matmul"  # a conv's layout choice: a 1x1 conv as a matmul, W @ X per image, all plain


def candidate_choices(op: BasicOp, tensors: dict, threads: tuple = (0,)) -> list[tuple]:
    """(blocked, threads, separate) of every choice `prepare` makes for `op` with these thread
    counts: each layout (convs: blocked, plain, and the matmul for a 1x1 conv), each epilogue form."""
    layouts = ((True, False) + ((MATMUL,) if pointwise(op, tensors) else ())) if op.kind == "conv" else (False,)
    apart = (False, True) if op.attrs.get("epilogue") else (False,)
    return [(b, n, e) for b in layouts for n in threads for e in apart]


def pointwise(op: BasicOp, tensors: dict) -> bool:
    """A 1x1 conv, stride 1, no padding, one group: per image a matmul W[M, C] @ X[C, HW] on the
    plain layouts, which oneDNN runs as a GEMM with the epilogue in its registers, where its NCHW
    convolution applies post-ops in a slow pass of their own (EfficientNet-B0's 16 -> 96 conv
    at 112x112 with SiLU, one thread, alone: 8.0 ms, 0.92 ms with the SiLU apart, 0.74 ms as a
    matmul; scripts/library_choices.py, results/library_choices_efficientnet_b0.md)."""
    w, a = tensors[op.inputs[1]].shape, op.attrs
    return (op.kind == "conv" and len(w) >= 3 and all(k == 1 for k in w[2:]) and a.get("group", 1) == 1
            and all(v == 1 for v in a["strides"]) and not any(a["pads"]))


def _let_pool_sleep() -> None:
    """Keep this thread busy past the time the pool's threads spin before they sleep (what `gir
    calibrate` waits for the same reason), so the next fork wakes them."""
    import time
    from gir.backends.cpu.calibration import WAKE_GAP_S
    start = time.perf_counter()
    while time.perf_counter() - start < WAKE_GAP_S:
        pass


APART_MARGIN = 1.1  # an epilogue apart is kept only where it times at least 10% faster than fused


def _macs(op: BasicOp, tensors: dict) -> int:
    """Multiply-adds of a conv or matmul."""
    w, y = tensors[op.inputs[1]], tensors[op.outputs[0]]
    if op.kind == "conv":
        return y.size * int(np.prod(w.shape[1:]))
    a = tensors[op.inputs[0]]
    return y.size * (a.shape[-1] if a.shape else 1)


def zeroed_operands(made: DnnlOp, tensors: dict) -> tuple[list, list]:
    """(arrays, addresses) of zeroed operands for a timing call of `made` (None where absent);
    the arrays must outlive the calls."""
    arrays = [None if t is None else aligned_bytes(tensors[t].size * 4) for t in made.operands]
    for a in arrays:
        if a is not None:
            a[:] = 0
    return arrays, [None if a is None else a.ctypes.data for a in arrays]


def timed(made: DnnlOp, op: BasicOp, tensors: dict, repeat: int = 2, asleep: bool = False) -> float:
    """Fastest of `repeat` runs (after one) on zeroed operands. `asleep`: the op runs after
    one-thread work (a one-thread kernel or op before it in the run), so a choice that forks the
    pool is timed with the pool asleep, as it will find it. Timed back to back it found the pool
    spinning and beat one thread, then paid the wake-up in every run: ShuffleNet-v2 at default
    threads on a 2-core Intel VM, 4.5-4.9 ms, 4.0-4.1 ms with every small op on one thread
    (session 24). After a kernel that forks, the pool is awake and back to back is right."""
    import time
    asleep = asleep and not made.threads and library().gir_dnnl_pool() > 1
    arrays, ptrs = zeroed_operands(made, tensors)
    out = aligned_bytes(tensors[op.outputs[0]].size * 4)
    best = float("inf")
    for i in range(repeat + 1):
        if asleep:
            _let_pool_sleep()
        start = time.perf_counter()
        made.call(*ptrs, out.ctypes.data)
        if i:
            best = min(best, time.perf_counter() - start)
    return best


def _prepare(op: BasicOp, tensors: dict, constants: dict, blocked: bool, threads: int,
             separate: bool = False) -> DnnlOp | str:
    """The primitive for one choice (see `prepare`); created under `threads` OpenMP threads
    (oneDNN splits its work for the threads it sees then) and run on them."""
    lib = library()
    if lib is None:
        return unavailable()
    if not threads:
        return _create(lib, op, tensors, constants, blocked, separate)
    pool = lib.gir_dnnl_threads(threads)
    try:
        made = _create(lib, op, tensors, constants, blocked, separate)
    finally:
        lib.gir_dnnl_threads(pool)
    if not isinstance(made, str):
        lib.gir_dnnl_set_op_threads(made.handle, threads)
        made.threads = threads
    return made


def _create(lib, op: BasicOp, tensors: dict, constants: dict, blocked: bool, separate: bool = False) -> DnnlOp | str:
    ts = [tensors[n] for n in (*op.inputs, *op.outputs)]
    if any(t.dtype != "float32" for t in ts):
        return f"{'/'.join(sorted({t.dtype for t in ts}))} (oneDNN runs float32 here)"
    if any(t.size == 0 for t in ts):
        return "an empty operand"
    handle, impl = ctypes.c_void_p(), ctypes.create_string_buffer(128)
    keep = []
    steps = op.attrs.get("epilogue", ())
    unknown = [k for k, *_ in steps if k not in POST_OPS]
    if unknown:
        return f"epilogue step {unknown[0]!r} has no oneDNN post-op here"
    post_kinds = (ctypes.c_int * max(len(steps), 1))(*(POST_OPS[k][0] for k, *_ in steps))
    params = [POST_OPS[k][1](a, b) for k, a, b in steps]
    post_alpha = (ctypes.c_float * max(len(steps), 1))(*(p[0] for p in params))
    post_beta = (ctypes.c_float * max(len(steps), 1))(*(p[1] for p in params))
    separate = bool(separate and steps)
    post = (len(steps), post_kinds, post_alpha, post_beta, int(separate))
    residuals = [op.inputs[int(a)] for k, a, _ in steps if k == "residual"]
    if op.kind == "conv" and any(k == "residual" and int(a) < 3 for k, a, _ in steps):
        return f"a residual input before the conv's bias (input 2) in {op.name}"
    if op.kind == "conv" and blocked == MATMUL:
        # a 1x1 conv as W[M, C] @ X[n][C, HW]: the weights are the left operand, read in place
        x, w, y = tensors[op.inputs[0]], tensors[op.inputs[1]], tensors[op.outputs[0]]
        bias = op.inputs[2] if len(op.inputs) > 2 else None
        hw = int(np.prod(x.shape[2:]))
        status = lib.gir_dnnl_matmul(ctypes.byref(handle), 3, _dims((1, w.shape[0], w.shape[1])),
                                     _dims((x.shape[0], x.shape[1], hw)), _dims((y.shape[0], y.shape[1], hw)),
                                     None, 2 if bias is not None else 0, *post, impl, len(impl))
        operands = [op.inputs[1], op.inputs[0], bias, *residuals]
    elif op.kind == "conv":
        x, w, y = tensors[op.inputs[0]], tensors[op.inputs[1]], tensors[op.outputs[0]]
        nsp = len(x.shape) - 2
        if not 1 <= nsp <= 3:
            return f"a conv over {nsp} spatial dims (oneDNN: 1 to 3)"
        a = op.attrs
        wc = constants.get(op.inputs[1])
        if wc is not None:
            keep.append(wc)
        bias = op.inputs[2] if len(op.inputs) > 2 else None
        status = lib.gir_dnnl_conv(ctypes.byref(handle), nsp, _dims(x.shape), _dims(w.shape), _dims(y.shape),
                                   a["group"], _dims(a["strides"]), _dims(a["dilations"]), _dims(a["pads"][:nsp]),
                                   _dims(a["pads"][nsp:]), None if wc is None else wc.ctypes.data,
                                   int(bias is not None), int(blocked), *post, impl, len(impl))
        operands = [op.inputs[0], op.inputs[1], bias, *residuals]
    elif op.kind == "matmul":
        a_shape, b_shape = tensors[op.inputs[0]].shape, tensors[op.inputs[1]].shape
        a2 = (1,) + tuple(a_shape) if len(a_shape) == 1 else tuple(a_shape)
        b2 = tuple(b_shape) + (1,) if len(b_shape) == 1 else tuple(b_shape)
        nd = max(len(a2), len(b2))
        if nd > 6:
            return f"a matmul of {nd} dims (oneDNN: up to 6 here)"
        a2, b2 = (1,) * (nd - len(a2)) + a2, (1,) * (nd - len(b2)) + b2
        c2 = tuple(np.broadcast_shapes(a2[:-2], b2[:-2])) + (a2[-2], b2[-1])
        bc = constants.get(op.inputs[1])
        if bc is not None:
            keep.append(bc)
        bias = op.inputs[2] if op.attrs.get("bias") else None
        status = lib.gir_dnnl_matmul(ctypes.byref(handle), nd, _dims(a2), _dims(b2), _dims(c2),
                                     None if bc is None else bc.ctypes.data, int(bias is not None), *post, impl, len(impl))
        operands = [op.inputs[0], op.inputs[1], bias, *residuals]
    else:
        return f"a {op.kind} op"
    if status:
        if handle.value:
            lib.gir_dnnl_free(handle)
        return f"oneDNN refused it (status {status})"
    made = DnnlOp(lib, handle, impl.value.decode(errors="replace"), operands, keep)
    made.blocked = blocked  # False for a matmul (its only layout)
    made.separate = separate
    return made
