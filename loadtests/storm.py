"""Bursts and storms (issue 29, part 2): the doc_classifier pair under closed-loop clients that honour Retry-After.

    python -m loadtests.storm                                  # one round: 2 clients, 64 clients, a burst of 64
    python -m loadtests.storm --rounds 3 --json storm.json     # three rounds, the phases in turn
    python -m loadtests.storm --deadline-s 10                  # every request sends Request-Timeout: 10
    python -m loadtests.storm --url http://127.0.0.1:8080 --model-pid 123 --logic-pid 124   # a running pair

Three phases per round, one after the other on the same pair, so each round's ratios compare figures taken minutes
apart on the same (shared, noisy) machine:

- **2 clients** (``--base-clients``) for ``--base-s`` seconds: the latency the pair gives a light load;
- **64 clients** (``--clients``) for ``--storm-s`` seconds, a storm: each sends one ``--words``-word document per
  ``POST /v1/classify``, and on a 503 sleeps what its ``Retry-After`` says (1 s without one) before sending again;
- **a burst** of ``--burst`` documents of ``--burst-min-words`` to ``--burst-max-words`` words sent at once, each
  once (no retry): what the pair answers and what it refuses.

Per phase: requests sent, answered (2xx), refused (503; how many with Retry-After), other answers; p50 and p99 of
the answered requests' latency, p99 of the refusals' (from send to answer, as the client sees it), and for the
burst the time the last answer took. Verdicts (issue 29, goal 2): the storm's answered p99 within 2x of the
2-client p99 of the same round; the storm's refusals in under 25 ms (p99) at the client; Retry-After on every 503;
nothing of the burst refused. Exit status 1 when one fails. The load generator runs in this process, on the
pair's cores; the table names the CPU, its flags and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from loadtests.bench_core import machine_line
from loadtests.harness._documents import TOKENS_PER_WORD, long_document, short_documents
from loadtests.harness._main import run
from loadtests.harness._openloop import deadline_headers, markdown_table, ms, percentile, request_bodies, write_json
from loadtests.harness._pair_procs import (
    ROUTE,
    add_pair_arguments,
    check_pair_arguments,
    own_cpu_seconds,
    pair_from,
    proc_stats,
)

HEADER = [
    "round", "phase", "sent", "2xx", "503", "other", "2xx/s", "p50 2xx ms", "p99 2xx ms", "max 2xx ms",
    "p99 503 ms", "max 503 ms", "Retry-After on 503", "last answer s",
]  # fmt: skip
TARGET_RATIO = 2.0
"""The storm's p99 of answered requests may be at most this many times the 2-client p99 (issue 29)."""
TARGET_REFUSAL_S = 0.025
"""A refusal's p99 at the client (issue 29)."""


@dataclass
class Phase:
    """What became of one phase's requests: latencies by outcome, and how many refusals had Retry-After."""

    name: str
    round: int
    seconds: float = 0.0
    ok: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    slowest: list[tuple[float, float]] = field(default_factory=list)
    """The refusals' (latency, time since the phase began), the slowest kept for the JSON."""
    began: float = field(default_factory=time.monotonic)
    answered_at: list[tuple[float, float]] = field(default_factory=list)
    """The answered requests' (latency, time since the phase began)."""
    other: dict[str, int] = field(default_factory=dict)
    retry_after: int = 0
    last_s: float = float("nan")
    """From the phase's start to its last answer."""

    @property
    def sent(self) -> int:
        return len(self.ok) + len(self.refused) + sum(self.other.values())

    def record(self, outcome: Answer | str, latency: float) -> float | None:
        """Counts one answer (or a transport error's name); the Retry-After in seconds for a 503, else None."""
        if isinstance(outcome, str):
            self.other[outcome] = self.other.get(outcome, 0) + 1
            return None
        status, headers = outcome
        if 200 <= status < 300:
            self.ok.append(latency)
            self.answered_at.append((round(latency, 3), round(time.monotonic() - latency - self.began, 3)))
            return None
        if status == 503:
            self.refused.append(latency)
            self.slowest.append((latency, time.monotonic() - latency - self.began))
            if len(self.slowest) > 64:
                self.slowest = sorted(self.slowest, reverse=True)[:32]
            value = headers.get("retry-after")
            if value is not None:
                self.retry_after += 1
                try:
                    return max(0.0, float(value))
                except ValueError:
                    return 1.0
            return 1.0
        key = str(status)
        self.other[key] = self.other.get(key, 0) + 1
        return None

    def summary(self) -> dict[str, Any]:
        return {
            "round": self.round, "phase": self.name, "seconds": self.seconds, "sent": self.sent, "ok": len(self.ok),
            "refused": len(self.refused), "other": dict(self.other), "ok_per_s": len(self.ok) / self.seconds,
            "p50_ok_s": percentile(self.ok, 50), "p99_ok_s": percentile(self.ok, 99),
            "max_ok_s": percentile(self.ok, 100), "p99_refused_s": percentile(self.refused, 99),
            "max_refused_s": percentile(self.refused, 100), "retry_after": self.retry_after, "last_s": self.last_s,
            "answered": self.answered_at,
            "slowest_refusals": [[round(a, 4), round(b, 3)] for a, b in sorted(self.slowest, reverse=True)[:16]],
        }  # fmt: skip


def row(p: dict[str, Any]) -> list[object]:
    last = p["last_s"]
    return [
        p["round"], p["phase"], p["sent"], p["ok"], p["refused"], sum(p["other"].values()), f"{p['ok_per_s']:.2f}",
        ms(p["p50_ok_s"]), ms(p["p99_ok_s"]), ms(p["max_ok_s"]), ms(p["p99_refused_s"]), ms(p["max_refused_s"]),
        f"{p['retry_after']}/{p['refused']}", "-" if last != last else f"{last:.1f}",
    ]  # fmt: skip


Answer = tuple[int, dict[str, str]]
"""An answer's status and headers (names in lower case)."""


class Connection:
    """One caller's keep-alive HTTP/1.1 connection, written and read by hand: httpx costs about 2 ms of CPU per
    request on these cores, so 64 callers woken by the same Retry-After would queue behind the client's own loop
    for 100 ms and more, and that would be measured as the server's refusal latency. Opened before a phase starts
    (callers of a running service have their connections); reopened when the server has closed it (an idle
    keep-alive connection, or ``Connection: close``)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"POST {ROUTE} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n{extra}"
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def connect(self) -> None:
        """Open the connection ahead of the first request (a caller that has been calling already has one)."""
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port)

    async def post(self, body: bytes) -> Answer:
        request = (self._head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        for attempt in (0, 1):
            fresh = self._streams is None
            if self._streams is None:
                self._streams = await asyncio.open_connection(self.host, self.port)
            reader, writer = self._streams
            try:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if fresh or attempt:
                    raise
                continue  # the server closed the idle connection: once more on a new one
            lines = head.decode("latin-1").split("\r\n")
            headers = dict(
                (k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)
            )
            await reader.readexactly(int(headers.get("content-length", "0")))
            if headers.get("connection", "").lower() == "close":
                self.close()
            return int(lines[0].split()[1]), headers
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


async def _send(connection: Connection, body: bytes) -> tuple[Answer | str, float]:
    start = time.monotonic()
    try:
        answer = await connection.post(body)
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        connection.close()
        return type(exc).__name__, time.monotonic() - start
    return answer, time.monotonic() - start


async def closed_loop(
    url: str, bodies: list[bytes], clients: int, seconds: float, phase: Phase, headers: dict[str, str]
) -> None:
    """``clients`` callers for ``seconds``, each sending its next document when the last is answered, or after the
    refusal's Retry-After; answers to requests sent before the end are waited for and counted."""
    connections = [Connection(url, headers) for _ in range(clients)]
    await asyncio.gather(*(c.connect() for c in connections))
    start = time.monotonic()
    end = start + seconds

    async def caller(k: int) -> None:
        i = k
        while time.monotonic() < end:
            outcome, latency = await _send(connections[k], bodies[i % len(bodies)])
            i += clients
            pause = phase.record(outcome, latency)
            if pause is not None:  # refused: come back when the server says
                await asyncio.sleep(pause)

    await asyncio.gather(*(caller(k) for k in range(clients)))
    phase.seconds = phase.last_s = time.monotonic() - start
    for connection in connections:
        connection.close()


async def burst(url: str, bodies: list[bytes], phase: Phase, headers: dict[str, str]) -> None:
    """Every body at once, each sent once."""
    connections = [Connection(url, headers) for _ in bodies]
    await asyncio.gather(*(c.connect() for c in connections))
    start = time.monotonic()
    answers = await asyncio.gather(*(_send(c, body) for c, body in zip(connections, bodies, strict=True)))
    phase.seconds = phase.last_s = time.monotonic() - start
    for connection in connections:
        connection.close()
    for outcome, latency in answers:
        phase.record(outcome, latency)


def burst_bodies(count: int, min_words: int, max_words: int, seed: int = 29) -> list[bytes]:
    """``count`` one-document bodies of ``min_words`` to ``max_words`` words (uniform), labels in turn."""
    labels = list(short_documents())
    rng = random.Random(seed)
    out = []
    for i in range(count):
        words = rng.randint(min_words, max_words)
        text = long_document(labels[i % len(labels)], round(words * TOKENS_PER_WORD) + 8, seed=seed + i)
        out.append(json.dumps({"documents": " ".join(text.split()[:words])}).encode())
    return out


async def settle(url: str, seconds: float) -> None:
    """Wait ``seconds``, then until one small request is answered: the previous phase's work is done."""
    await asyncio.sleep(seconds)
    connection = Connection(url, {})
    try:
        for _ in range(120):
            if (await connection.post(b'{"documents": "settle"}'))[0] == 200:
                return
            await asyncio.sleep(0.5)
    finally:
        connection.close()


def verdicts(phases: list[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    base = {p["round"]: p for p in phases if p["phase"] == "2 clients"}
    storms = [p for p in phases if p["phase"].endswith("clients") and p["phase"] != "2 clients"]
    bursts = [p for p in phases if p["phase"].startswith("burst")]
    ratios = [s["p99_ok_s"] / base[s["round"]]["p99_ok_s"] for s in storms if base[s["round"]]["p99_ok_s"] > 0]
    refusals = [p for p in storms if p["refused"]]
    worst_refusal = max((p["p99_refused_s"] for p in refusals), default=float("nan"))
    refused = sum(p["refused"] for p in phases)
    with_retry = sum(p["retry_after"] for p in phases)
    burst_refused = sum(p["refused"] + sum(p["other"].values()) for p in bursts)
    burst_sent = sum(p["sent"] for p in bursts)
    return [
        (f"storm: p99 of 2xx within {TARGET_RATIO:g}x of the 2-client p99 (each round)",
         bool(ratios) and max(ratios) <= TARGET_RATIO, ", ".join(f"{r:.2f}x" for r in ratios) or "no 2xx"),
        (f"storm: refusals in < {TARGET_REFUSAL_S * 1000:.0f} ms at the client (p99, worst round)",
         None if not refusals else worst_refusal < TARGET_REFUSAL_S,
         f"{ms(worst_refusal)} ms over {sum(p['refused'] for p in storms)} 503s" if refusals else "no 503s"),
        ("Retry-After on every 503", None if not refused else with_retry == refused, f"{with_retry}/{refused}"),
        ("the burst served, nothing refused", burst_sent > 0 and burst_refused == 0,
         f"{burst_refused} of {burst_sent} not answered"),
    ]  # fmt: skip


def budget_hint(phases: list[dict[str, Any]]) -> str | None:
    """A line for a burst refused at the default budget but served under a deadline: how long it took, which is
    what ``max_wait_s`` must exceed (and stay below the storm's first wave, which looks alike on arrival)."""
    plain = [p for p in phases if p["phase"].startswith("burst") and "deadline" not in p["phase"] and p["refused"]]
    served = [p for p in phases if "deadline" in p["phase"] and p["ok"] == p["sent"]]
    if not plain or not served:
        return None
    work = max(p["last_s"] for p in served)
    return (f"the burst was refused at the service's max_wait_s and took {work:.1f} s under a deadline: on this "
            "pair the budget should exceed that and stay below the storm's first wave (service.yaml's admission "
            "comment; LOGICD_ADMISSION__MAX_WAIT_S overrides it)")  # fmt: skip


def cpu_flags() -> str:
    words = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    return " ".join(sorted({w for w in words if w.startswith(("avx", "amx", "sse4", "fma"))}))


def load_average() -> str:
    """The machine's 1-minute load average (the pair shares its cores with whatever else runs)."""
    path = Path("/proc/loadavg")
    return path.read_text().split()[0] if path.exists() else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.storm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the three phases (1)")
    parser.add_argument("--base-clients", type=int, default=2, help="clients of the baseline phase (2)")
    parser.add_argument("--base-s", type=float, default=12.0, help="seconds of the baseline phase (12)")
    parser.add_argument("--clients", type=int, default=64, help="clients of the storm (64)")
    parser.add_argument("--storm-s", type=float, default=20.0, help="seconds of the storm (20)")
    parser.add_argument("--words", type=int, default=1500, help="words per document, baseline and storm (1500)")
    parser.add_argument("--burst", type=int, default=64, help="documents of the burst, sent at once (64)")
    parser.add_argument("--burst-min-words", type=int, default=5)
    parser.add_argument("--burst-max-words", type=int, default=1200)
    parser.add_argument(
        "--burst-deadline-s", type=float, help="also send the burst with Request-Timeout: this many seconds"
    )
    parser.add_argument("--settle-s", type=float, default=3.0, help="pause between phases (3)")
    parser.add_argument("--deadline-s", type=float, help="send Request-Timeout with every request")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    add_pair_arguments(parser)
    args = parser.parse_args(argv)
    check_pair_arguments(parser, args)
    if min(args.rounds, args.base_clients, args.clients, args.burst, args.burst_min_words) < 1:
        parser.error("--rounds, --base-clients, --clients, --burst and --burst-min-words must be at least 1")
    if args.burst_max_words < args.burst_min_words or args.words < 10:
        parser.error("--burst-max-words must be at least --burst-min-words, and --words at least 10")
    headers = deadline_headers(args.deadline_s, "request-timeout")
    bodies = request_bodies(args.words, count=max(24, args.clients))
    mixed = burst_bodies(args.burst, args.burst_min_words, args.burst_max_words)
    phases: list[Phase] = []
    load = [load_average()]
    phases_names = (f"{args.base_clients} clients", f"{args.clients} clients")
    names = [*phases_names, f"burst of {args.burst}"]
    if args.burst_deadline_s is not None:
        names.append(f"burst of {args.burst}, deadline {args.burst_deadline_s:g} s")
    with pair_from(args) as pair:
        asyncio.run(settle(pair.url, 0.0))
        for body in bodies[:4]:  # warm-up: the first long documents are slower
            httpx.post(pair.url + ROUTE, content=body, timeout=300.0, headers={"content-type": "application/json"})
        start = own_cpu_seconds(), proc_stats(pair.model_pid), proc_stats(pair.logic_pid), time.monotonic()
        for r in range(1, args.rounds + 1):
            for name in names:
                phase = Phase(name, r)
                print(f"round {r}: {name} ...", flush=True)
                if name.startswith("burst") and "deadline" in name:
                    asyncio.run(burst(pair.url, mixed, phase, deadline_headers(args.burst_deadline_s, "")))
                elif name.startswith("burst"):
                    asyncio.run(burst(pair.url, mixed, phase, headers))
                else:
                    clients, seconds = (
                        (args.base_clients, args.base_s) if name == phases_names[0] else (args.clients, args.storm_s)
                    )
                    asyncio.run(closed_loop(pair.url, bodies, clients, seconds, phase, headers))
                phases.append(phase)
                asyncio.run(settle(pair.url, args.settle_s))
        end = own_cpu_seconds(), proc_stats(pair.model_pid), proc_stats(pair.logic_pid), time.monotonic()
    summaries = [p.summary() for p in phases]
    wall = end[3] - start[3]
    print(
        f"\n{machine_line()}\nflags: {cpu_flags()}\nload average: {load[0]} at the start, {load_average()} at the end"
    )
    print(f"{args.words}-word documents in the baseline and the storm; the burst {args.burst_min_words} to "
          f"{args.burst_max_words} words; {', '.join(f'{k}: {v}' for k, v in headers.items()) or 'no deadline'}; "
          f"clients honour Retry-After\n")  # fmt: skip
    print(markdown_table(HEADER, [row(p) for p in summaries]))
    cpu = {
        "generator": end[0] - start[0], "model": end[1].cpu_s - start[1].cpu_s, "logic": end[2].cpu_s - start[2].cpu_s,
    }  # fmt: skip
    print(f"\nCPU over {wall:.0f} s, % of one core: model {100 * cpu['model'] / wall:.0f}, logic "
          f"{100 * cpu['logic'] / wall:.0f}, load generator {100 * cpu['generator'] / wall:.0f}\n")  # fmt: skip
    results = verdicts(summaries)
    labels = {True: "yes", False: "NO", None: "n/a"}
    print(markdown_table(["verdict", "held", "figures"], [[w, labels[ok], f] for w, ok, f in results]))
    hint = budget_hint(summaries)
    if hint is not None:
        print(f"\n{hint}")
    write_json(args.json, {
        "script": "storm", "machine": machine_line(), "flags": cpu_flags(), "load": [load[0], load_average()],
        "headers": headers,
        "phases": summaries, "cpu_seconds": cpu, "wall_s": wall,
        "verdicts": [{"what": w, "held": ok, "figures": f} for w, ok, f in results],
    })  # fmt: skip
    return 0 if all(ok is not False for _, ok, _ in results) else 1


if __name__ == "__main__":
    run(lambda: main(sys.argv[1:]))
