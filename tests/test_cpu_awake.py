"""Small CPU kernels that fork to keep the team awake (gir/backends/cpu/awake.py): between two
kernels that fork, where the one-thread kernels between them would outlast the team's spin,
the ones that would carry it past the spin fork too; a stretch that a library op bounds is left
alone; and the session still matches onnxruntime."""
from dataclasses import replace

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import gir
from gir.backends.cpu.awake import woken_kernels
from gir.backends.cpu.emitter import CpuEmitter
from gir.backends.kernels import plan_launches
from gir.frontend import load
from gir.frontend.basic import BasicOp
from gir.fusion.plan import plan
from gir.ir import get_target
from gir.ir.one_thread import runs_on_one_thread

CPU = get_target("cpu")


def _gemv_small_gemv(rows: int = 24, k: int = 768, n: int = 3072):
    """GEMV (9 MB: forks) -> add to a [rows, n] input and sum over rows (under 1 MiB: one
    thread) -> GEMV (forks)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) / 30, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((n, k)).astype(np.float32) / 50, "w2")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "z"], ["a"]),
             helper.make_node("Tanh", ["a"], ["t"]),
             helper.make_node("ReduceSum", ["t", "axes"], ["r"], keepdims=1),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    io = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph(nodes, "awake", [io("x", [1, k]), io("z", [rows, n])], [io("y", [1, k])], [w1, w2, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _with_spin(spin_s: float):
    return replace(CPU, processors=max(CPU.processors, 2), timing=replace(CPU.timing, spin_s=spin_s))


def _launches(model, target):
    p = plan(load(model), target)
    return p, plan_launches(p)


def test_small_kernels_between_forking_kernels_fork_where_they_outlast_the_spin():
    target = _with_spin(1e-9)  # any one-thread work outlasts it
    p, launches = _launches(_gemv_small_gemv(), target)
    kernels = [x[1] for x in launches if not isinstance(x, BasicOp)]
    forks = [not runs_on_one_thread(k.params, target) for k in kernels]
    assert forks[0] and forks[-1] and not all(forks), [k.name for k in kernels]
    between = [k for k, f in zip(kernels[1:-1], forks[1:-1]) if not f and k.prim.num_units > 1]
    woken = woken_kernels(p, launches)
    assert woken and woken == {k.name for k in between}
    emitter = CpuEmitter(target)
    emitter.woken = woken
    for k in between:
        source = emitter.kernel_source(k)
        assert "#pragma omp parallel for" in source and "awake.py" in source
    assert woken_kernels(*_launches(_gemv_small_gemv(), _with_spin(1.0))) == frozenset()  # all within the spin


def gemv_softmax_library_model():
    """GEMV (forks) -> softmax (one thread) -> a library matmul -> softmax (one thread) -> GEMV
    (forks); tests/test_awake_call.py runs it too."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((768, 3072)).astype(np.float32) / 30, "w1"),
             numpy_helper.from_array(rng.standard_normal((3072, 768)).astype(np.float32) / 50, "w2"),
             numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32) / 8, "w3"),
             numpy_helper.from_array(np.array([48, 64], np.int64), "rows"),
             numpy_helper.from_array(np.array([1, 3072], np.int64), "flat")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Reshape", ["h", "rows"], ["r"]),
             helper.make_node("Softmax", ["r"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "w3"], ["m"]),
             helper.make_node("Softmax", ["m"], ["q"], axis=-1), helper.make_node("Reshape", ["q", "flat"], ["r2"]),
             helper.make_node("MatMul", ["r2", "w2"], ["y"])]
    io = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    return helper.make_model(helper.make_graph(nodes, "lib", [io("x", [1, 768])], [io("y", [1, 768])], inits),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_a_stretch_a_library_op_bounds_is_left_alone():
    """GEMV (forks) -> softmax (one thread) -> a library matmul -> softmax (one thread) -> GEMV
    (forks): the library op's threads are chosen when the engine makes it, so neither softmax
    is woken, though each would be were the library op taken to fork."""
    model = gemv_softmax_library_model()
    target = _with_spin(1e-9)
    p, launches = _launches(model, target)
    kinds = ["library" if isinstance(x, BasicOp) else "forks" if not runs_on_one_thread(x[1].params, target)
             else "one thread" for x in launches]
    assert kinds == ["forks", "one thread", "library", "one thread", "forks"], kinds
    assert all(x[1].prim.num_units > 1 for x, kind in zip(launches, kinds) if kind == "one thread")
    assert woken_kernels(p, launches) == frozenset()


def test_a_session_with_woken_kernels_matches_onnxruntime():
    model = _gemv_small_gemv()
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((1, 768)).astype(np.float32), "z": rng.standard_normal((24, 3072)).astype(np.float32)}
    session = gir.Session(model, target="cpu", plan_cache=None)
    assert set(session.engine.emitted[2]) == woken_kernels(session.plan, plan_launches(session.plan))
    (got,) = session.run(None, feeds)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    from gir.runtime.profile import profile
    rows = profile(session, feeds, repeat=2)  # `gir run --profile` says which kernels fork to keep the team awake
    marked = {r.step for r in rows if r.form.endswith("(forks: team awake)")}
    woken = {launch[0] for launch in session.engine.emitted[1]
             if not isinstance(launch, BasicOp) and launch[1].name in session.engine.emitted[2]}
    assert marked == woken
