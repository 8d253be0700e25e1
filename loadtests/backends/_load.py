"""bench_backends' measurements: a variant's runtime in-process (a worker process, loadtests/backends/_worker.py),
the same model served (one modelsvc per variant, requests of batch B from a few concurrent clients), and the
doc_classifier pair (modelsvc + logicd) on long documents.

Every cell is time-boxed by calls AND seconds: calls stop when ``max_s`` has passed or ``max_calls`` were made,
whichever comes first, at least one call (per client, served); the time counts until the last answer. So a cell of
a 2.5 s call costs one call, and a cell of a 10 ms call costs about ``max_s``. The first round warms each cell up
with untimed calls first: one, two for TorchScript (its profiling executor optimizes a graph on its second run).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO, Any

import httpx
import numpy as np

from loadtests.backends._variants import MODEL, Built
from loadtests.backends._worker import token_batch
from loadtests.harness import _servers
from loadtests.harness._perf import Input, _binary_request


@dataclass
class Cell:
    """One measured cell: sequences per second over ``calls`` calls in ``seconds``."""

    seq_per_s: float
    calls: int
    seconds: float


class Worker:
    """A variant's runtime in a process of its own (see _worker); closed with the benchmark."""

    def __init__(self, built: Built, ready_timeout_s: float = 180.0):
        args = [f"{k}={v}" for k, v in built.params.items()]
        argv = [sys.executable, "-m", "loadtests.backends._worker", built.runtime, str(built.model_file), *args]
        self.name = built.variant.key
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=_servers.ROOT, preexec_fn=_servers.die_with_parent,
        )  # fmt: skip
        self.info = self._read(ready_timeout_s)

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=timeout_s)
            stderr: IO[str] | None = self.proc.stderr
            tail = stderr.read()[-2000:] if stderr is not None else ""
            raise RuntimeError(f"{self.name}'s worker exited with code {self.proc.returncode}: {tail.strip()}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.name}'s worker: {answer['error']}")
        return answer

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read(600.0)

    def cell(self, batch: int, tokens: int, max_calls: int, max_s: float, warm: int) -> Cell:
        got = self.ask({"op": "cell", "batch": batch, "tokens": tokens, "max_calls": max_calls, "max_s": max_s,
                        "warm": warm})  # fmt: skip
        return Cell(batch * got["calls"] / got["seconds"], got["calls"], got["seconds"])

    def embed(self, inputs: dict[str, list[list[int]]]) -> np.ndarray[Any, Any]:
        return np.asarray(self.ask({"op": "embed", **inputs})["embedding"], dtype=np.float64)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def served_cell(
    base_url: str, batch: int, tokens: int, clients: int, max_calls: int, max_s: float, warm: int
) -> Cell:
    """``clients`` closed-loop clients each send requests of batch ``batch`` x ``tokens`` (v2 binary tensors, asking
    for ``sentence_embedding`` only) to the served ``minilm``; time-boxed like the in-process cells."""
    arrays = token_batch(batch, tokens)
    inputs = [Input(name, "INT64", array) for name, array in arrays.items()]
    body, head_len = _binary_request(inputs, ["sentence_embedding"])
    headers = {"Inference-Header-Content-Length": str(head_len), "Content-Type": "application/octet-stream"}
    url = f"{base_url}/v2/models/{MODEL}/infer"

    async def run() -> Cell:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(limits=limits, timeout=600.0) as client:

            async def call() -> None:
                response = await client.post(url, content=body, headers=headers)
                if response.status_code != 200:
                    raise RuntimeError(f"served {batch}x{tokens}: HTTP {response.status_code} {response.text[:300]}")

            for _ in range(warm):
                await call()
            started = time.perf_counter()
            issued = 0
            last = started

            async def worker() -> None:
                nonlocal issued, last
                while issued < clients or (issued < max_calls and time.perf_counter() - started < max_s):
                    issued += 1
                    await call()
                    last = time.perf_counter()

            await asyncio.gather(*(worker() for _ in range(clients)))
            return Cell(batch * issued / (last - started), issued, last - started)

    return asyncio.run(run())
