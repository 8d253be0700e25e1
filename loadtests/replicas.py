"""Several model-service replicas behind one AsyncClient (issue 17, part 2): calls, errors, latency and each
replica's share, closed loop, in four phases on real ``modelsvc serve`` processes of a python echo model.

    python -m loadtests.replicas [--seconds 3] [--concurrency 8] [--slow-ms 20]

Phases: one URL (the plain client, the baseline); two replicas; two replicas, one slow (its model sleeps
``--slow-ms`` per batch); two replicas, one killed with SIGKILL a third of the way in (what the survivor takes,
and what the failover costs the calls in flight). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from loadtests.harness._servers import ServerProcess, modelsvc_server
from modelsvc.client import AsyncClient

MODEL = """
import time
import triton_python_backend_utils as pb_utils

SLEEP_S = {sleep}


class TritonPythonModel:
    def execute(self, requests):
        if SLEEP_S:
            time.sleep(SLEEP_S)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""

CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def echo_repository(root: Path, sleep_s: float) -> Path:
    """A model repository at ``root`` with the python model ``echo`` (FP32 IN -> OUT), ``sleep_s`` per batch."""
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(MODEL.format(sleep=sleep_s))
    (root / "echo" / "config.pbtxt").write_text(CONFIG)
    return root


@contextlib.contextmanager
def _servers(slow_s: float) -> Iterator[tuple[ServerProcess, ServerProcess, ServerProcess]]:
    """Three ``python -m modelsvc serve`` (two of the fast repository, one of the slow), started side by side."""
    with tempfile.TemporaryDirectory() as tmp:
        fast, slow = echo_repository(Path(tmp) / "fast", 0.0), echo_repository(Path(tmp) / "slow", slow_s)
        servers = (
            modelsvc_server(fast, as_module=True),
            modelsvc_server(fast, as_module=True),
            modelsvc_server(slow, as_module=True),
        )
        try:
            for s in servers:
                s.start()
            for s in servers:
                s.wait_ready()
            yield servers
        finally:
            for s in servers:
                s.close()


async def _phase(
    name: str, url: str | list[str], seconds: float, concurrency: int, kill: ServerProcess | None = None
) -> list[str]:
    latencies: list[float] = []
    errors = 0
    end = time.monotonic() + seconds

    async def send(client: AsyncClient, i: int) -> None:
        nonlocal errors
        value = np.array([[float(i)]], np.float32)
        while time.monotonic() < end:
            start = time.perf_counter()
            try:
                await client.infer("echo", {"IN": value}, timeout=10.0)
                latencies.append(time.perf_counter() - start)
            except Exception:  # counted: the point of the run
                errors += 1

    async with AsyncClient(url) as client:
        await client.server_ready()  # connections and, for replicas, the probe started
        tasks = [asyncio.create_task(send(client, i)) for i in range(concurrency)]
        if kill is not None and kill.proc is not None:
            await asyncio.sleep(seconds / 3)
            kill.proc.kill()
        await asyncio.gather(*tasks)
        states = client.replicas()
    total = sum(s.calls for s in states) or 1
    share = " / ".join(f"{100 * s.calls / total:.0f}%" for s in states) if states else "-"
    ms = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return [
        name,
        str(len(latencies)),
        str(errors),
        f"{len(latencies) / seconds:.0f}",
        f"{np.percentile(ms, 50):.1f}",
        f"{np.percentile(ms, 99):.1f}",
        f"{ms.max():.1f}",
        share,
    ]


async def _run(args: argparse.Namespace) -> None:
    with _servers(args.slow_ms / 1000) as (a, b, slow):
        rows = [
            await _phase("one URL (plain client)", a.base_url, args.seconds, args.concurrency),
            await _phase("two replicas", [a.base_url, b.base_url], args.seconds, args.concurrency),
            await _phase(
                f"two, one slow (+{args.slow_ms:g} ms)", [a.base_url, slow.base_url], args.seconds, args.concurrency
            ),
            await _phase("two, kill -9 of one", [a.base_url, b.base_url], args.seconds, args.concurrency, kill=a),
        ]
    head = ["phase", "calls", "errors", "calls/s", "p50 ms", "p99 ms", "max ms", "share (first / second)"]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.replicas", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each phase")
    parser.add_argument("--concurrency", type=int, default=8, help="calls in flight at once")
    parser.add_argument("--slow-ms", type=float, default=20.0, help="the slow replica's sleep per batch")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.concurrency < 1 or args.slow_ms < 0:
        parser.error("--seconds > 0, --concurrency >= 1 and --slow-ms >= 0")
    asyncio.run(_run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
