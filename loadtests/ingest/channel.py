"""The engine's side of the ingest channel without sockets: CPU per request of ``DataPlane.infer`` called directly
against the same requests fed to a ``WorkerLink`` as a worker's frames (decoded, run, answered, the reply framed),
identity FP32 [1,16], in one process, in turns.

    python -m loadtests.ingest.channel [--concurrency 32] [--requests 30000] [--rounds 3]

The difference is the channel's Python per request (the frames' decode and encode, the tensors' views, a task per
call); what this leaves out is the sockets' wake-ups, which ``python -m loadtests.ingest`` includes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.bench_core import machine_line
from loadtests.ingest.bench import IDENTITY
from modelsvc.engine import DataPlane, ModelManager
from modelsvc.protocol import InferRequest, Tensor
from modelsvc.repository import ModelRepository
from modelsvc.server.ingest._engine import EngineChannel, WorkerLink
from modelsvc.server.ingest._wire import FrameReader, Hello, Reply, call_for, decode_to_worker, frame
from modelsvc.tools.onnx_models import identity, write_model


class _Worker:
    """Stands in for the worker's socket: takes the link's writes and resolves each call's waiter."""

    def __init__(self) -> None:
        self.reader = FrameReader()
        self.waiters: dict[int, asyncio.Future[Any]] = {}

    def write(self, data: bytes) -> None:
        for body in self.reader.feed(data):
            reply = decode_to_worker(body)
            if isinstance(reply, Reply):
                self.waiters.pop(reply.id).set_result(reply)

    def close(self) -> None:
        pass


async def _run(concurrency: int, requests: int, rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        write_model(Path(tmp), "identity", identity(), IDENTITY)
        models = ModelManager(ModelRepository(Path(tmp)))
        await models.load_all()
        dataplane = DataPlane(models)
        dataplane.accepting = True
        loop = asyncio.get_running_loop()
        link = WorkerLink(EngineChannel(dataplane, str(Path(tmp) / "unused.sock")), loop)
        worker = _Worker()
        link.connection_made(worker)  # type: ignore[arg-type]
        link.data_received(frame(Hello(0, 0)))
        row = np.ones((1, 16), np.float32)
        ids = iter(range(1, 1 << 62))

        async def direct() -> None:
            await dataplane.infer("identity", None, InferRequest([Tensor("INPUT0", "FP32", (1, 16), row)]))

        async def through_link() -> None:
            ident = next(ids)
            worker.waiters[ident] = waiter = loop.create_future()
            request = InferRequest([Tensor("INPUT0", "FP32", (1, 16), row)])
            call = call_for(ident, "identity", None, request, endpoint=None, trace_headers=None, arena=None, blocks=[])
            link.data_received(frame(call))
            await waiter

        out: dict[str, list[float]] = {"direct": [], "link": []}
        for _ in range(rounds):
            for name, one in (("direct", direct), ("link", through_link)):

                async def caller(n: int, one: Any = one) -> None:
                    for _ in range(n):
                        await one()

                start = time.process_time()
                await asyncio.gather(*(caller(requests // concurrency) for _ in range(concurrency)))
                out[name].append(1e6 * (time.process_time() - start) / requests)
        await models.close()
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=30000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    print(machine_line())
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop comes with litestar[standard]
        runner = asyncio.Runner()
    with runner:
        out = runner.run(_run(args.concurrency, args.requests, args.rounds))
    rounds = f"median of {args.rounds} rounds (one process, no sockets)"
    print(f"\nCPU us per request, concurrency {args.concurrency}, {rounds}")
    print("path | us/request | rounds")
    for name, values in out.items():
        print(f"{name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)}")
    print(f"channel's Python | {statistics.median(out['link']) - statistics.median(out['direct']):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
