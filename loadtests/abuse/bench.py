"""Issue 29's attacks on the gRPC port, against modelsvc's own HTTP/2 engine, against modelsvc on grpcio (grpc's C
core, the baseline of the same run) and against a real Triton 2.51 (its gRPC port is grpc core too) where
nvidia-pytriton is installed:

    python -m loadtests.abuse                         # every attack, one round, ~3 min here
    python -m loadtests.abuse --rounds 2 --attacks stall_one ping_flood
    python -m loadtests.abuse --servers h2 grpcio     # without Triton

The attacks (``_attacks``), each on 127.0.0.1 and bounded:

- ``continuation``: a HEADERS block continued by CONTINUATION frames without end (up to 64 MiB);
- ``rapid_reset``: 20,000 streams opened and reset at once (HEADERS + RST_STREAM CANCEL, 200 pairs a write);
- ``stall_one``: one connection, up to 2,000 streams that each send 512 KiB of a declared 4 MiB message (as much
  as the server's windows allow) and stall;
- ``ping_flood``: PINGs from a client that never reads, until its send blocks 2 s (up to 2,000,000);
- ``stall_many``: 8 connections x 200 such stalled streams.

Every (attack, server) pair gets a fresh server (the same identity model, python backend, in one repository);
the servers take turns within each round. Reported: what the server took before it stopped taking it, the streams
it took (opened and not refused), how it stopped the attack, the growth of its process's resident set (peak,
sampled every 20 ms, against just before), and whether a well-behaved client (tritonclient.grpc, a new
connection, one ModelInfer, 10 s deadline) was served while the attack's connections were still open.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.abuse import _attacks as at
from loadtests.bench_core import machine_line
from loadtests.grid._models import CONFIG, ENGINES
from loadtests.harness import _servers

MODEL = "identity_py"
ATTACKS = ("continuation", "rapid_reset", "stall_one", "ping_flood", "stall_many")
SERVERS = ("h2", "grpcio", "triton")
LABELS = {"h2": "modelsvc (own HTTP/2)", "grpcio": "modelsvc --grpc-engine grpcio", "triton": "Triton 2.51"}


@dataclass
class Row:
    attack: str
    server: str
    round: int
    out: at.Outcome
    rss_mb: float
    served: str
    alive: bool


def probe(grpc_port: int) -> str:
    """One ModelInfer from a well-behaved client on a new connection: ``yes (N ms)`` or ``no: why``."""
    import tritonclient.grpc as grpcclient

    row = np.arange(16, dtype=np.float32).reshape(1, 16)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(row)
        t0 = time.perf_counter()
        result = client.infer(MODEL, [inp], client_timeout=10.0)
        ms = (time.perf_counter() - t0) * 1e3
        ok = np.array_equal(result.as_numpy("OUTPUT0"), row)
        return f"yes ({ms:.0f} ms)" if ok else "no: a wrong answer"
    except Exception as exc:  # the client's error, whatever it is, is the answer
        return f"no: {str(exc).splitlines()[0][:60]}"
    finally:
        client.close()


def write_repo(repo: Path) -> None:
    config = CONFIG.format(name=MODEL, engine=ENGINES["python"], mbs=8, dim=16, delay=0)
    _servers.write_triton_identity(repo, MODEL, config)


@contextmanager
def started(kind: str, repo: Path, workdir: Path) -> Iterator[_servers.ServerProcess]:
    if kind == "triton":
        server = _servers.triton_server(repo, workdir)
    else:
        extra = ["--allow-metrics", "false", "--grpc-address", "127.0.0.1", "--grpc-engine", kind]
        server = _servers.modelsvc_server(repo, as_module=True, extra_args=extra)
    with server:
        yield server


def _hold(make: Callable[[], Any], count: int) -> tuple[list[Any], at.Outcome]:
    """``count`` attackers made and run side by side (threads); their outcomes summed; left open."""
    attackers = [make() for _ in range(count)]
    outs: list[at.Outcome] = [at.Outcome() for _ in attackers]

    def run(i: int) -> None:
        outs[i] = attackers[i].run()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = at.Outcome(
        accepted=sum(o.accepted for o in outs),
        streams=sum(o.streams for o in outs),
        refused=sum(o.refused for o in outs),
    )
    ends = sorted({o.ended for o in outs})
    total.ended = ", ".join(f"{sum(o.ended == e for o in outs)}x {e}" if count > 1 else e for e in ends)
    total.notes = sorted({n for o in outs for n in o.notes})
    return attackers, total


def attack(name: str, port: int) -> tuple[list[Any], at.Outcome]:
    if name == "continuation":
        return [], at.continuation_flood(port)
    if name == "rapid_reset":
        return [], at.rapid_reset(port)
    if name == "stall_one":
        return _hold(lambda: at.Stall(port, 2000), 1)
    if name == "ping_flood":
        return _hold(lambda: at.PingFlood(port), 1)
    if name == "stall_many":
        return _hold(lambda: at.Stall(port, 200), 8)
    raise ValueError(name)


def measure(name: str, kind: str, rnd: int, repo: Path, workdir: Path) -> Row:
    with started(kind, repo, workdir) as server:
        assert server.proc is not None
        assert server.grpc_port is not None
        probe(server.grpc_port)  # warm: the first call's costs are not the attack's
        with at.RssPeak(server.proc.pid) as rss:
            held, out = attack(name, server.grpc_port)
            served = probe(server.grpc_port)
        for attacker in held:
            if isinstance(attacker, at.PingFlood):
                attacker.answered()
                out.notes = attacker.out.notes
            attacker.close()
        alive = server.proc.poll() is None
    row = Row(name, kind, rnd, out, rss.growth_mb, served, alive)
    print(f"  {name:12} {kind:7} round {rnd}: {_cells(row)}", flush=True)
    return row


def _taken(row: Row) -> str:
    out = row.out
    if row.attack == "ping_flood":
        return f"{out.accepted:,} PINGs"
    if row.attack == "rapid_reset":
        return f"{out.accepted:,} streams reset"
    return f"{out.accepted / (1 << 20):,.1f} MiB"


def _cells(row: Row) -> str:
    streams = f"{row.out.streams:,}" + (f" ({row.out.refused:,} refused)" if row.out.refused else "")
    alive = "" if row.alive else " (server died)"
    return f"| {_taken(row)} | {streams} | {row.out.ended} | +{row.rss_mb:.0f} MB | {row.served}{alive} |" + (
        f" {'; '.join(row.out.notes)}" if row.out.notes else ""
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.abuse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    servers = list(args.servers)
    if "triton" in servers and _servers.pytriton_dir() is None:
        print("nvidia-pytriton is not installed: no Triton column", file=sys.stderr)
        servers.remove("triton")
    print(f"{machine_line()}  load average {os.getloadavg()[0]:.1f}", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="abuse-") as tmp:
        repo = Path(tmp) / "repo"
        write_repo(repo)
        for rnd in range(1, args.rounds + 1):
            for name in args.attacks:
                order = servers if rnd % 2 else servers[::-1]
                for kind in order:
                    try:
                        rows.append(measure(name, kind, rnd, repo, Path(tmp)))
                    except RuntimeError as exc:  # a server that would not start: said, and the run goes on
                        print(f"  {name} {kind}: not measured: {str(exc).splitlines()[0]}", file=sys.stderr)
    print()
    print("| attack | server | round | taken before it stopped | streams taken | how it stopped | RSS | served |")
    print("|---|---|---:|---|---|---|---:|---|")
    for name in args.attacks:
        for kind in servers:
            for row in (r for r in rows if r.attack == name and r.server == kind):
                print(f"| {name} | {LABELS[kind]} | {row.round} {_cells(row)}")
    return 0
