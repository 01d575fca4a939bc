"""Every onnx backend node test (no inclusion list) through gir.backend, counted.

    nice python scripts/onnx_node_census.py [--executor reference|pipeline] [--timeout 60] [--only REGEX]

Each case is loaded by the GIR frontend exactly as gir.backend loads it (shape-like inputs
bound as constants) and run by the chosen executor: ``pipeline`` is gir.backend as shipped
(plan for the CPU target, emit C, build and run natively; slow: a C build per case),
``reference`` runs the same BasicGraph in the numpy reference executor (fast; the frontend and
every decomposition are the same, only kernel generation is skipped). Outcomes:

  passed       every output matches onnx's expected output at the case's rtol/atol
  unsupported  refused up front with UnsupportedOpError (ops not registered, or a registry
               ``check`` refusing the attribute combination), counted per op type
  refused      another clean one-line FrontendError (dtype not in GIR, dynamic shape, ...)
  failed       wrong numbers, a traceback, or over the time limit

A failed case whose nodes are all ops GIR claims (registered, default domain) is listed: the
target is none, apart from the divergences the node tests document case by case (EXCLUDED in
tests/test_onnx_backend_nodes.py, and PIPELINE_EXCLUDED for the pipeline), which are listed
separately with their reasons. Writes results/onnx_node_census.md and .json.
"""
from __future__ import annotations

import argparse
import ast
import collections
import json
import re
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx.backend.test.loader import load_model_tests

import gir.backend
from gir.frontend import FrontendError, check_graph, run_reference
from gir.frontend.decompose import REGISTRY
from gir.frontend.errors import UnsupportedOpError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "results" / "onnx_node_census"


class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CaseTimeout()


def backend_for(executor: str):
    if executor == "pipeline":
        return gir.backend

    def compile_graph(graph):
        check_graph(graph)  # the BasicGraph contract, as the node tests check it
        return lambda feeds: run_reference(graph, feeds)
    return gir.backend.make_backend(compile_graph, "CensusReference")


def _normalize(t):
    return onnx.numpy_helper.to_array(t) if isinstance(t, onnx.TensorProto) else t


def claimed(model: onnx.ModelProto) -> bool:
    """Every node of the case is an op GIR registers (default domain)."""
    return all(n.domain in ("", "ai.onnx") and n.op_type in REGISTRY for n in model.graph.node)


def run_case(backend, case) -> tuple[str, str]:
    """(outcome, detail) for one onnx node test case."""
    try:
        rep = backend.prepare(case.model, "CPU")
        for inputs, expected in case.data_sets:
            got = rep.run([_normalize(x) for x in inputs])
            expected = [_normalize(x) for x in expected]
            if len(got) != len(expected):
                return "failed", f"{len(got)} outputs, expected {len(expected)}"
            for i, (g, e) in enumerate(zip(got, expected)):
                g, e = np.asarray(g), np.asarray(e)
                if g.shape != e.shape or (e.dtype != object and g.dtype != e.dtype):
                    return "failed", f"output {i}: {g.dtype}{list(g.shape)}, expected {e.dtype}{list(e.shape)}"
                if e.dtype.name == "bfloat16":  # as onnx's runner: in float32, two bfloat16 ulps
                    np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32),
                                               rtol=max(case.rtol, 2 ** -6), atol=case.atol)
                elif e.dtype.kind in "fc":
                    np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)
                else:
                    np.testing.assert_array_equal(g, e)
        return "passed", ""
    except UnsupportedOpError as e:
        return "unsupported", ",".join(sorted({op for _, op, *_ in e.nodes}))
    except FrontendError as e:
        return "refused", str(e)
    except CaseTimeout:
        return "failed", "over the time limit"
    except AssertionError as e:
        return "failed", " ".join(str(e).split())[:300]
    except Exception as e:  # noqa: BLE001 - a census records every crash
        return "failed", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def documented_exclusions(executor: str) -> dict[str, str]:
    """{test-name regex: reason} from the node tests' EXCLUDED (and PIPELINE_EXCLUDED), read
    as literals so that the census does not build onnx's test suite twice."""
    found = {}
    files = [("test_onnx_backend_nodes.py", "EXCLUDED")]
    if executor == "pipeline":
        files.append(("test_onnx_backend_pipeline.py", "PIPELINE_EXCLUDED"))
    for file, name in files:
        tree = ast.parse((ROOT / "tests" / file).read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                found.update(ast.literal_eval(node.value))
    return found


def _documented(name: str, exclusions: dict[str, str]) -> str | None:
    for pattern, reason in exclusions.items():
        if re.search(pattern, name + "_cpu"):
            return reason
    return None


def _reason_class(detail: str) -> str:
    """A refusal message without its model/node prefix, for grouping."""
    dtype = re.search(r"element type (\w+)", detail)
    if dtype:
        return f"a tensor of element type {dtype.group(1)}, not a GIR dtype"
    tail = detail.split(": ", 2)[-1]
    return re.sub(r"'[^']*'|\[[^\]]*\]|\([^)]*\)|\d+", "_", tail)[:120]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executor", choices=("reference", "pipeline"), default="reference")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per case")
    ap.add_argument("--only", default=None, help="regex over test names")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="path without suffix (.md and .json are written)")
    args = ap.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in load_model_tests(kind="node") if not args.only or re.search(args.only, c.name)]
    backend = backend_for(args.executor)
    signal.signal(signal.SIGALRM, _alarm)
    rows, start = [], time.time()
    for k, case in enumerate(sorted(cases, key=lambda c: c.name)):
        t0 = time.time()
        signal.alarm(args.timeout)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                outcome, detail = run_case(backend, case)
            except CaseTimeout:
                outcome, detail = "failed", "over the time limit"
            finally:
                signal.alarm(0)
        ops = sorted({n.op_type for n in case.model.graph.node})
        rows.append({"name": case.name, "ops": ops, "claimed": claimed(case.model), "outcome": outcome,
                     "detail": detail, "seconds": round(time.time() - t0, 2)})
        if outcome == "failed":
            print(f"FAILED {case.name}: {detail[:200]}", file=sys.stderr, flush=True)
        if (k + 1) % 200 == 0:
            print(f"{k + 1}/{len(cases)} cases, {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    write(rows, args, time.time() - start)
    return 0


def write(rows, args, seconds) -> None:
    count = collections.Counter(r["outcome"] for r in rows)
    unsupported = collections.Counter()
    for r in rows:
        if r["outcome"] == "unsupported":
            for op in r["detail"].split(","):
                unsupported[op] += 1
    refused = collections.Counter(_reason_class(r["detail"]) for r in rows if r["outcome"] == "refused")
    exclusions = documented_exclusions(args.executor)
    for r in rows:
        r["documented"] = _documented(r["name"], exclusions) if r["outcome"] == "failed" else None
    documented = [r for r in rows if r["outcome"] == "failed" and r["claimed"] and r["documented"]]
    failed_claimed = [r for r in rows if r["outcome"] == "failed" and r["claimed"] and not r["documented"]]
    failed_other = [r for r in rows if r["outcome"] == "failed" and not r["claimed"]]
    lines = [
        "# onnx backend node tests through gir.backend (every case, no inclusion list)",
        "",
        f"Command: `nice python scripts/onnx_node_census.py --executor {args.executor} --timeout {args.timeout}"
        + (f" --only '{args.only}'" if args.only else "")
        + (f" --out {args.out}" if Path(args.out).resolve() != DEFAULT_OUT else "") + "`",
        f"onnx {onnx.__version__}; executor: {args.executor}"
        + (" (gir.backend as shipped: CPU plan, emitted C, native run)" if args.executor == "pipeline"
           else " (GIR frontend + decompositions, BasicGraph run by the numpy reference executor)")
        + f"; {seconds:.0f} s in all.",
        "",
        "| outcome | cases |", "|---|---:|",
        f"| passed | {count['passed']} |",
        f"| refused as unsupported (UnsupportedOpError) | {count['unsupported']} |",
        f"| refused otherwise (clean one-line FrontendError) | {count['refused']} |",
        f"| failed, all ops claimed by GIR | {len(failed_claimed)} |",
        f"| failed, all ops claimed, a divergence the node tests document (EXCLUDED) | {len(documented)} |",
        f"| failed, case has ops GIR does not claim | {len(failed_other)} |",
        f"| total | {len(rows)} |",
        "",
        f"## Failures among ops GIR claims ({len(failed_claimed)})", "",
    ]
    lines += [f"- `{r['name']}` ({', '.join(r['ops'])}): {r['detail']}" for r in failed_claimed] or ["none"]
    lines += ["", f"## Documented divergences among ops GIR claims ({len(documented)})", "",
              "Excluded case by case in the node tests, with the reason given there.", ""]
    lines += [f"- `{r['name']}`: {r['documented']}" for r in documented] or ["none"]
    lines += ["", f"## Other failures ({len(failed_other)})",
              "", "Cases holding an op GIR does not register that the loader folded or accepted anyway.", ""]
    lines += [f"- `{r['name']}` ({', '.join(r['ops'])}): {r['detail']}" for r in failed_other] or ["none"]
    lines += ["", f"## Refused as unsupported, per op type ({len(unsupported)} op types)", "",
              "| op type | cases |", "|---|---:|"]
    lines += [f"| {op} | {n} |" for op, n in sorted(unsupported.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines += ["", "## Refused otherwise, per reason", "", "| reason (numbers and names elided) | cases |", "|---|---:|"]
    lines += [f"| {reason.replace('|', '/')} | {n} |" for reason, n in refused.most_common()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"executor": args.executor, "onnx": onnx.__version__,
                                                    "counts": dict(count), "cases": rows}, indent=1) + "\n")
    print("\n".join(lines[:17]))


if __name__ == "__main__":
    sys.exit(main())
