"""py-spy on one running server under perf_analyzer load: where its Python threads spend their samples."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from loadtests.harness import _perf, _servers

SECONDS = 6
RATE = 200
TOP = 15
_LINE = re.compile(r"\s*\((?P<file>[^():]+):\d+\)$")


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _function(frame: str) -> str:
    """``handle (modelsvc/server/http/_endpoint.py:271)`` -> ``handle (_endpoint.py)``: one name per function."""
    match = _LINE.search(frame)
    if match is None:
        return frame.strip()
    return f"{frame[: match.start()].strip()} ({Path(match['file']).name})"


def summarize(raw: str) -> str:
    """Self and inclusive shares of the samples, per function, from py-spy's raw (collapsed stacks) output."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_function(f) for f in stack.split(";")]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    if not total:
        return "(no samples)"
    lines = [f"{total} samples; self % | inclusive % (top {TOP} each)"]
    for (name, n), (iname, inn) in zip(own.most_common(TOP), inclusive.most_common(TOP), strict=False):
        lines.append(f"  {100 * n / total:5.1f} {name:<60.60} | {100 * inn / total:5.1f} {iname:.60}")
    return "\n".join(lines)


def profile_server(proc: _servers.ServerProcess, model: str, concurrency: int, workdir: Path, out: Path) -> str:
    """Load ``model`` at ``concurrency`` with perf_analyzer while py-spy records the server for SECONDS."""
    spy = _py_spy()
    if spy is None:
        return "py-spy not installed"
    assert proc.proc is not None
    exe = _perf.perf_analyzer_path()
    assert exe is not None
    load = subprocess.Popen(
        [str(exe), "-m", model, "-i", "http", "-u", proc.url, "--concurrency-range", f"{concurrency}:{concurrency}",
         "--max-threads", str(concurrency), "--measurement-interval", str((SECONDS + 6) * 1000),
         "--measurement-mode", "time_windows", "--max-trials", "1", "--stability-percentage", "100"],
        env=_perf.perf_analyzer_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(2)
        raw = out.with_suffix(".txt")
        cmd = [spy, "record", "-p", str(proc.proc.pid), "-d", str(SECONDS), "-r", str(RATE), "-f", "raw",
               "-o", str(raw), "--nonblocking", "--subprocesses"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SECONDS + 60)
        if done.returncode != 0 or not raw.exists():
            return f"py-spy failed: {(done.stdout + done.stderr).strip()[-500:]}"
        return summarize(raw.read_text())
    finally:
        load.terminate()
        load.wait(timeout=30)
