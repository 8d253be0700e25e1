"""modelsvc from two checkouts side by side over HTTP: identity FP32 [16] with binary tensors, perf_analyzer at
concurrency 1, 8 and 32, the two servers measured in turns (the order swapped each round), since these machines
are shared and noisy: the ratio of each round is the figure, not one run each.

    python -m loadtests.ab_http BASE_DIR [--head DIR] [--rounds 4]

BASE_DIR is another checkout (e.g. ``git worktree add --detach /tmp/base REV``); both servers run this venv's
Python with the checkout first on PYTHONPATH. For the data plane alone (no sockets), run
``PYTHONPATH=DIR python -m loadtests.bench_dataplane`` for each side in turns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from loadtests.bench_core import machine_line
from loadtests.harness import _perf, _servers
from modelsvc.tools.onnx_models import identity, write_model

CONFIG = """name: "identity"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
"""
CONCURRENCY = (1, 8, 32)


def _server(side: str, root: Path, repo: Path) -> _servers.ServerProcess:
    http, grpc, metrics = _servers.free_port(), _servers.free_port(), _servers.free_port()
    argv = [sys.executable, "-m", "modelsvc", "serve", "--model-repository", str(repo), "--http-port", str(http),
            "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--http-address", "127.0.0.1"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(root))
    return _servers.ServerProcess(f"modelsvc-{side}", argv, http, env, cwd=Path(tempfile.gettempdir()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.ab_http", description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the other checkout")
    parser.add_argument("--head", type=Path, default=_servers.ROOT, help="this checkout (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    if problem := _perf.perf_analyzer_problem():
        parser.error(problem)
    sides = {"base": args.base.resolve(), "head": args.head.resolve()}
    got: dict[int, dict[str, list[float]]] = {c: {"base": [], "head": []} for c in CONCURRENCY}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        repo = Path(tmp) / "repo"
        write_model(repo, "identity", identity(), CONFIG)
        servers = {side: stack.enter_context(_server(side, root, repo)) for side, root in sides.items()}
        for c in CONCURRENCY:
            for r in range(args.rounds):
                for side in ("base", "head") if r % 2 == 0 else ("head", "base"):
                    url = f"127.0.0.1:{servers[side].http_port}"
                    result, output, _ = _perf.run_perf_analyzer("identity", url, c, Path(tmp), window_ms=2000)
                    if result is None:
                        raise SystemExit(f"perf_analyzer found no stable measurement on {side}:\n{output[-2000:]}")
                    got[c][side].append(result.infer_per_s)
    flags = {f for f in Path("/proc/cpuinfo").read_text().split() if f.startswith(("avx", "amx"))}
    print(f"{machine_line()}  flags={' '.join(sorted(flags))}")
    print(f"base {sides['base']}, head {sides['head']}; {args.rounds} rounds in turns, perf_analyzer 2 s windows\n")
    print("| concurrency | base infer/s (median) | head infer/s (median) | head/base (median of the rounds' ratios) |")
    print("|---:|---:|---:|---:|")
    for c, sides_got in got.items():
        ratios = [h / b for h, b in zip(sides_got["head"], sides_got["base"], strict=True)]
        print(f"| {c} | {statistics.median(sides_got['base']):.0f} | {statistics.median(sides_got['head']):.0f} | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f} to {max(ratios):.3f}) |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
