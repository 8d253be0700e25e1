"""The h2 engine's own CPU per unary call, in-process, this checkout against another (its bounds' cost on the hot
path, without a network or a model):

    python -m loadtests.abuse.engine_cost --before /tmp/base      # /tmp/base: `git archive <commit> modelsvc | tar -x`

Each run (a child process per checkout, the checkouts in turns, ``--rounds`` times) feeds one ``H2Connection``
40,000 calls as a grpc client sends them (HEADERS with indexed fields, one DATA of a 100-byte message with
END_STREAM), 8 at a time and the next 8 once those are answered, with a WINDOW_UPDATE for what the answers took;
the handler reads the message and answers it with the same bytes and OK trailers. The transport counts bytes. The
figure is process CPU time per call, with what was loaded frozen out of the collector as `modelsvc serve` does.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CALLS = 40_000
AT_ONCE = 8


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def write(self, data: Any) -> None:
        self.sent += len(data)

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.sent += len(part)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def close(self) -> None:
        pass


async def _run(calls: int) -> float:
    import hpack

    from modelsvc.server.grpc.h2._connection import PREFACE, SETTINGS, H2Connection, frame, literal

    trailers = literal(b"grpc-status", b"0")
    done = 0
    answered = asyncio.Event()  # the 8 calls in flight are answered

    class Handler:
        def open(self, stream: Any) -> None:
            stream.task = stream.conn.loop.create_task(self.answer(stream))

        async def answer(self, stream: Any) -> None:
            nonlocal done
            stream.send(await stream.read(), trailers)
            done += 1
            if done % AT_ONCE == 0:
                answered.set()

    conn = H2Connection(Handler(), 1 << 26, lambda _: None)
    conn.connection_made(_Transport())
    conn.data_received(PREFACE + frame(SETTINGS, 0, 0))
    encoder = hpack.Encoder()
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
               (b":authority", b"bench"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip
    message = b"\x00" + struct.pack(">I", 100) + bytes(100)
    chunks, sid = [], 1
    for _ in range(calls // AT_ONCE):
        parts = []
        for _ in range(AT_ONCE):
            parts.append(frame(1, 0x4, sid, encoder.encode(headers)) + frame(0, 0x1, sid, message))
            sid += 2
        parts.append(frame(8, 0, 0, struct.pack(">I", 4096)))  # WINDOW_UPDATE: what the answers took
        chunks.append(b"".join(parts))
    await asyncio.sleep(0)
    gc.collect()  # as `modelsvc serve` does once loaded: what is there is kept out of the collector's scans
    gc.freeze()
    start = time.process_time()
    for chunk in chunks:
        conn.data_received(chunk)
        await answered.wait()
        answered.clear()
    return (time.process_time() - start) / (len(chunks) * AT_ONCE) * 1e6


def _child(checkout: Path) -> float:
    """One run in a child process whose ``modelsvc`` is the one in ``checkout`` (this file run by its path, so
    that nothing of this checkout comes before it)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    run = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child"], env=env, capture_output=True, text=True, check=True
    )
    return float(run.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.abuse.engine_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a folder holding another checkout's modelsvc package")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(f"{asyncio.run(_run(CALLS)):.3f}")
        return 0
    from loadtests.bench_core import machine_line

    print(machine_line(), flush=True)
    sides: dict[str, list[float]] = {"this checkout": []}
    if args.before is not None:
        sides["before"] = []
    for rnd in range(args.rounds):
        order = list(sides) if rnd % 2 else list(sides)[::-1]
        for side in order:
            us = _child(args.before if side == "before" else ROOT)
            sides[side].append(us)
            print(f"round {rnd + 1} {side:13} {us:.2f} us/call", flush=True)
    print("\n| checkout | us of CPU per call (rounds) | median |\n|---|---|---:|")
    for side, values in sides.items():
        print(f"| {side} | {', '.join(f'{v:.2f}' for v in values)} | {statistics.median(values):.2f} |")
    if args.before is not None:
        ratio = statistics.median(sides["this checkout"]) / statistics.median(sides["before"])
        print(f"\nthis checkout / before: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
