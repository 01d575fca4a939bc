"""Both sides of the partition's time check (gir/fusion/plan.py `time_checked`) measured on a GPU,
for scripts/bench_gpu.py: every library call of a session timed alone against its modelled time
(gir/fusion/partition.py `library_call_seconds`), and, for each group of lowered ops the check
gave back to the library, the GIR kernels that held them in the plan of the ridge rule alone
against those library calls. The check keeps an op in GIR while its kernels model at up to
the target's margin x its calls; these rows say how far the model's ratio is from the measured one.

Why an L2 flush and not buffer copies (as bench_gpu's kernel times): a library call's operands
are baked into its cuBLASLt / cuDNN plan, so the call cannot be pointed at copies. Writing a
buffer of twice the L2 before each timed run evicts them instead; the flush is outside the
timed events.
"""
from __future__ import annotations

from gir.frontend.basic import BasicOp
from gir.fusion.partition import library_call_seconds, round_trip_seconds
from gir.fusion.plan import lowered_groups

LIBRARY_RUNS = 30  # per distinct library call; each run is one call after a flush and a spin


def _signature(op: BasicOp, graph) -> tuple:
    """Calls with the same signature run the same library plan: timed once. What an epilogue
    absorbed is named by op (attrs["absorbed"]); the steps it runs are in attrs["epilogue"]."""
    t = graph.tensors
    return (op.kind, tuple(tuple(t[n].shape) for n in op.inputs), tuple(t[op.outputs[0]].shape),
            t[op.outputs[0]].dtype, repr(sorted((k, v) for k, v in op.attrs.items() if k != "absorbed")))


def library_times(gpu, session) -> list[dict]:
    """Per distinct library call of the session (its cuBLASLt GEMMs, cuDNN conv, or im2col
    kernel + GEMMs): the median measured seconds, the modelled call, and the decision's figures."""
    engine, plan = session.engine, session.plan
    g, target = plan.graph, plan.target
    programs: dict[str, list] = {}
    for name, call in zip(engine.library_steps, engine.program):
        if name is not None:
            programs.setdefault(name, []).append(call)
    ops = {s.name: s for s in plan.steps if isinstance(s, BasicOp)}
    decisions = {d.op: d for d in plan.partition.decisions}
    stream = gpu.launcher_stream(engine.launcher)
    rows, by_signature = [], {}
    for name, program in programs.items():
        op, d = ops[name], decisions.get(name)
        key = _signature(op, g)
        if key in by_signature:
            by_signature[key]["ops"].append(name)
            continue
        seconds = gpu.median_seconds(lambda i, program=program: engine.enqueue(program), LIBRARY_RUNS, stream,
                                     before=gpu.flush_l2)
        by_signature[key] = row = {
            "ops": [name], "kind": op.kind, "calls": [c[0] for c in program], "seconds": seconds,
            "modelled_call_s": library_call_seconds(op, g, target), "round_trip_s": round_trip_seconds(op, g, target),
            "flops": d.flops if d else None, "bytes": d.bytes if d else None,
            "given_back": bool(d and d.given_back), "epilogue": d.epilogue if d else ""}
        rows.append(row)
    return rows


def time_check_rows(gpu, session, ridge_session, library: list[dict], kernel_times) -> list[dict]:
    """Per group of ops the time check gave back (`session`'s plan), the GIR kernels that held them
    in `ridge_session` (the ridge rule alone), modelled and measured, against their library calls
    measured in `session` (`library`, from library_times) with the modelled round trip of their
    outputs that the check adds."""
    back = {d.op: d.library_s for d in session.plan.partition.decisions if d.given_back}
    if not back:
        return []
    call = {n: r for r in library for n in r["ops"]}
    groups = lowered_groups(ridge_session.plan, back)
    names = {k.name for _, kernels in groups for k in kernels}
    measured = {r["kernel"]: r["seconds"] for r in kernel_times(gpu, ridge_session, only=names)}
    rows = []
    for ops, kernels in groups:
        ops = sorted(ops)
        if any(n not in call for n in ops):
            continue  # an op the session did not run as a library call (none expected)
        rows.append({"ops": ops, "kernels": [k.name for k in kernels],
                     "gir_modelled_s": sum(k.estimate.seconds for k in kernels),
                     "gir_s": sum(measured[k.name] for k in kernels),
                     "library_modelled_s": sum(back[n] for n in ops),
                     "library_call_s": sum(call[n]["seconds"] for n in ops),
                     "round_trip_s": sum(call[n]["round_trip_s"] for n in ops)})
    return rows


def _us(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def report(rows: list[dict], markdown_table) -> str:
    """Two tables over bench_gpu's model rows: library calls, then the time check's groups."""
    calls, checks = [], []
    for r in rows:
        g = r["gpu"]
        for c in sorted(g.get("library_calls", []), key=lambda c: -c["seconds"] * len(c["ops"])):
            ratio = c["seconds"] / c["modelled_call_s"] if c["modelled_call_s"] else None
            calls.append([r["model"], f"`{c['ops'][0][:50]}`", str(len(c["ops"])), c["kind"], "+".join(c["calls"]),
                          f"{c['flops'] / 1e9:.2f}" if c["flops"] else "-",
                          f"{c['bytes'] / 1e6:.2f}" if c["bytes"] else "-", _us(c["modelled_call_s"]),
                          _us(c["seconds"]), "-" if ratio is None else f"{ratio:.2f}x",
                          "yes" if c["given_back"] else ""])
        for t in g.get("time_checks", []):
            library = t["library_call_s"] + t["round_trip_s"]
            checks.append([r["model"], f"`{t['ops'][0][:50]}`", str(len(t["ops"])), str(len(t["kernels"])),
                           _us(t["gir_modelled_s"]), _us(t["library_modelled_s"]),
                           f"{t['gir_modelled_s'] / t['library_modelled_s']:.2f}x",
                           _us(t["gir_s"]), _us(t["library_call_s"]), _us(t["round_trip_s"]),
                           f"{t['gir_s'] / library:.2f}x"])
    return "\n".join([
        "Library calls timed alone (an L2 flush before each of "
        f"{LIBRARY_RUNS} runs, median; calls of the same shape timed once, `same` counts them) against "
        "`library_call_seconds` (FLOPs at the ridge point's peak, bytes at the copy bandwidth, one launch):\n",
        markdown_table(("model", "op", "same", "kind", "calls", "GFLOP", "MB", "modelled us", "measured us",
                        "measured / modelled", "given back"), calls),
        "The time check measured: each group of lowered ops it gave back to the library, as the GIR kernels "
        "that held them in the plan of the ridge rule alone (modelled; measured on rotated buffers) against "
        "their library calls (modelled with a round trip of the output; measured alone, plus the modelled "
        "round trip). The check gives back a group whose modelled ratio exceeds the target's margin "
        "(`gir.fusion.plan.library_margin`):\n",
        markdown_table(("model", "first op", "ops", "kernels", "GIR modelled us", "library modelled us",
                        "modelled ratio", "GIR measured us", "library measured us", "+ round trip us",
                        "measured ratio"), checks)])
