"""How ``logicd plan`` scales with traffic: the wall time and peak memory of the whole command (start-up, every
option of every accelerator family, the cost against traffic and throughput, the table) on the write-up's plan
(logicd/plan/accelerators.yaml) with every service's traffic scaled so that the total peak is 10, 10^3 ... 10^12
requests/s. Each size runs as its own process, ``repeat`` times; the table gives the best wall time and the
largest peak RSS (os.wait4's ru_maxrss), with the plan's node count to show the size of what was planned, and the
best time of the planning alone in this process (without the interpreter's start and the imports).

    python -m loadtests.plan_scale                 # 10 .. 10^12 req/s, 3 runs each
    python -m loadtests.plan_scale --sizes 1e9 --repeat 5

The issue's bar: 10^9 requests/s in under 2 s and 200 MB (issue 30).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "logicd" / "plan" / "accelerators.yaml"


def cpu() -> str:
    """The CPU's model name and the flags that matter to Python's arithmetic, from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    wanted = [f for f in ("avx2", "avx512f", "bmi2", "fma", "sse4_2") if flags and f in flags.group(1).split()]
    return f"{model.group(1) if model else platform.machine()}, {os.cpu_count()} CPUs, flags {' '.join(wanted)}"


def scaled(total: float) -> str:
    """The write-up's plan with every service's peak and average scaled so that the peaks sum to ``total``."""
    data = yaml.safe_load(PLAN.read_text())
    peak = sum(s["peak_rps"] for s in data["services"])
    for s in data["services"]:
        s["peak_rps"] = s["peak_rps"] * total / peak
        s["average_rps"] = s["average_rps"] * total / peak
    return yaml.safe_dump(data, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,1e3,1e5,1e7,1e9,1e12", help="total peak requests/s, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size (best time, largest memory)")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    print(f"logicd plan on {PLAN.relative_to(ROOT)}, traffic scaled; CPU: {cpu()}; Python {platform.python_version()}")
    print(f"{'total peak req/s':>18}  {'nodes at peak':>16}  {'best s':>7}  {'peak RSS MB':>11}  {'in-process s':>12}  "
          f"{'runs':>4}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            path = Path(tmp) / f"plan-{size:g}.yaml"
            path.write_text(scaled(size))
            best, rss, nodes = float("inf"), 0, 0
            for _ in range(args.repeat):
                seconds, used, out = _measured(path)
                best, rss = min(best, seconds), max(rss, used)
                data = json.loads(out)
                cheapest = min((o for o in data["options"] if not o["unavailable"]),
                               key=lambda o: o["cost_per_hour"]["peak"])  # fmt: skip
                nodes = sum(cheapest["nodes"]["peak"].values())
            inner = min(_in_process(path) for _ in range(args.repeat))
            print(f"{size:>18,.0f}  {nodes:>16,}  {best:>7.2f}  {rss / 1e6:>11.1f}  {inner:>12.3f}  {args.repeat:>4}")
    return 0


def _in_process(path: Path) -> float:
    """Seconds of the planning alone (read, every option, the sensitivity, table and JSON), in this process."""
    from logicd.plan import as_json, plan_file, render_text

    start = time.perf_counter()
    planned = plan_file(path)
    render_text(planned)
    json.dumps(as_json(planned))
    return time.perf_counter() - start


def _measured(path: Path) -> tuple[float, int, str]:
    """One run, with its own peak RSS: Popen without communicate's reaping, then os.wait4 for the usage."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "logicd", "plan", str(path), "--json"], stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"logicd plan failed ({proc.returncode}): {err.read().strip()}")
        return seconds, usage.ru_maxrss * 1024, out.read()


if __name__ == "__main__":
    raise SystemExit(main())
