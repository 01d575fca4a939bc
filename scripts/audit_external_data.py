"""Audit (issue 22 item 6): run `gir explain`, `gir run` and `gir compile` under strace on every
external-data abuse case and show that no file a model names outside its folder is opened (nor a
FIFO or device), and that each command refuses the model with exit 1.

    python3 scripts/audit_external_data.py            # writes results/external_data_audit.md

strace is installed with apt when missing (Debian package `strace`). For each run the table
lists the exit code, whether the run opened any forbidden path (the case's target outside the
folder: /etc/passwd, ../outside.bin, /dev/zero, /proc/self/mem, or the FIFO), and every file
it opened inside the model's folder. A control case (valid external data) must open its data file.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
W = np.arange(6, dtype=np.float32).reshape(2, 3)
OPEN = re.compile(r'^\d+\s+(open|openat|openat2)\((?:AT_FDCWD|\d+), "((?:[^"\\]|\\.)*)"(.*)$')


def ensure_strace() -> str:
    path = shutil.which("strace")
    if path:
        return path
    subprocess.run(["apt-get", "install", "-y", "-q", "strace"], check=True, stdout=subprocess.DEVNULL)
    return shutil.which("strace")


def model(folder: Path, location: str, offset=None, length=None) -> Path:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            w.external_data.add(key=key, value=str(value))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add")], "ext", [x], [y], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = folder / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def cases(base: Path):
    """(name, model folder, location, offset, length, forbidden real paths, expected exit)."""
    outside = base / "outside.bin"
    outside.write_bytes(W.tobytes())
    out = []

    def case(name, location, forbidden, offset=None, length=None, setup=None, code=1):
        folder = base / name / "model"
        folder.mkdir(parents=True)
        (folder / "w.bin").write_bytes(W.tobytes())
        if setup:
            setup(folder)
        out.append((name, folder, model(folder, location, offset, length), forbidden, code))

    case("traversal", "../../outside.bin", {str(outside)})
    case("traversal_etc", "../" * 12 + "etc/passwd", {"/etc/passwd"})
    case("absolute", "/etc/passwd", {"/etc/passwd"})
    case("symlink_out", "link.bin", {str(outside), "/etc/passwd"},
         setup=lambda f: os.symlink(outside, f / "link.bin"))
    case("symlink_etc", "link.bin", {"/etc/passwd"}, setup=lambda f: os.symlink("/etc/passwd", f / "link.bin"))
    case("fifo", "fifo.bin", {"fifo.bin"}, setup=lambda f: os.mkfifo(f / "fifo.bin"))
    case("dev_zero", "/dev/zero", {"/dev/zero"}, 0, 24)
    case("symlink_dev_zero", "z.bin", {"/dev/zero"}, 0, 24, setup=lambda f: os.symlink("/dev/zero", f / "z.bin"))
    case("proc_self_mem", "/proc/self/mem", {"/proc/self/mem"}, 4096, 24)
    case("symlink_proc_self_mem", "m.bin", {"/proc/self/mem"}, 4096, 24,
         setup=lambda f: os.symlink("/proc/self/mem", f / "m.bin"))
    case("offset_beyond", "w.bin", set(), 16, 24)
    case("length_beyond", "w.bin", set(), 0, 4096)
    case("missing", "nothing.bin", set())
    case("control_valid", "w.bin", set(), 0, 24, code=0)
    return out


def opened(log: Path) -> list[str]:
    paths = []
    for line in log.read_text(errors="replace").splitlines():
        m = OPEN.match(line)
        if m:
            paths.append(m.group(2))
    return paths


def run(strace: str, command: str, path: Path, folder: Path) -> tuple[int, list[str], str]:
    log = folder.parent / f"strace.{command}.log"
    extra = {"explain": [], "run": [], "compile": ["-o", str(folder.parent / "out")]}[command]
    env = dict(os.environ, GIR_CACHE_DIR=str(folder.parent / "cache"), OMP_NUM_THREADS="1")
    proc = subprocess.run([strace, "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", str(log),
                           sys.executable, "-m", "gir.cli", command, str(path), "--target", "cpu", "--quiet", *extra],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(ROOT))
    message = [line for line in proc.stderr.splitlines() if line.startswith("gir:")]
    return proc.returncode, opened(log), message[0] if message else ""


def main() -> int:
    strace = ensure_strace()
    rows, bad = [], 0
    with tempfile.TemporaryDirectory(prefix="gir-audit-") as tmp:
        base = Path(os.path.realpath(tmp))
        for name, folder, path, forbidden, code in cases(base):
            for command in ("explain", "run", "compile"):
                rc, paths, message = run(strace, command, path, folder)
                real = {os.path.realpath(p) if not p.startswith("/proc/self") else p for p in paths}
                hits = sorted(p for p in real if p in forbidden or
                              any(p.endswith("/" + f) for f in forbidden if "/" not in f))
                inside = sorted({os.path.relpath(p, folder) for p in real if p.startswith(str(folder) + "/")})
                ok = rc == code and not hits and (code != 0 or "w.bin" in inside)
                bad += not ok
                rows.append(f"| {name} | {command} | {rc} | {', '.join(hits) or 'none'} | {', '.join(inside) or '-'} "
                            f"| {len(paths)} | {'yes' if ok else 'NO'} | {message.replace(str(base), '$TMP').replace('|', '/')[:200]} |")
                print(rows[-1], flush=True)
    text = "\n".join([
        "# External data audit (strace)", "",
        "Command: `python3 scripts/audit_external_data.py` (strace -f -e trace=open,openat,openat2 on "
        "`python -m gir.cli {explain,run,compile} MODEL --target cpu`).", "",
        "Forbidden: the case's target outside the model's folder (or the FIFO). 'opened inside' lists every "
        "file the run opened in the model's folder; 'opens' counts all open calls of the run "
        "(Python, libraries, caches).", "",
        "| case | command | exit | forbidden opened | opened inside the folder | opens | pass | message |",
        "|---|---|---|---|---|---|---|---|", *rows, "",
        f"{len(rows) - bad} of {len(rows)} runs pass.", ""])
    out = ROOT / "results" / "external_data_audit.md"
    out.write_text(text)
    print(f"{len(rows) - bad} of {len(rows)} runs pass; {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
