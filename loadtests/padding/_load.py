"""The padding benchmark's client (``bench_padding``): request lengths, prebuilt v2 binary-tensor requests, and a
closed loop that checks every answer while it measures.

The loop reuses the load generator's raw keep-alive HTTP connections (``loadgen._transports.HttpTransport``)
and its request encoder, so that 16 clients cost little CPU beside the server on a 2-core machine; the loop's
own CPU time is measured and reported with each row.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadtests.harness._servers import tree_cpu_seconds
from loadtests.loadgen._inputs import Target, TensorSpec, encode_v2_http, http_request
from loadtests.loadgen._runner import _event_loop_runner
from loadtests.loadgen._stats import ServerCounters
from loadtests.loadgen._transports import HttpTransport

Array = np.ndarray[Any, Any]

MIN_TOKENS, MAX_TOKENS = 8, 256
"""Request lengths are drawn log-uniform from 8 to 256 tokens: mean (256 - 8) / ln 32 = 71.6."""

Check = Callable[[Any], str | None]
"""Looks at one answer's outputs: None when right, else what is wrong."""


def draw_lengths(count: int, seed: int) -> list[int]:
    """``count`` lengths, log-uniform over [MIN_TOKENS, MAX_TOKENS], rounded to whole tokens (seeded)."""
    rng = np.random.default_rng(seed)
    logs = rng.uniform(math.log(MIN_TOKENS), math.log(MAX_TOKENS), size=count)
    return [int(min(MAX_TOKENS, max(MIN_TOKENS, round(math.exp(v))))) for v in logs]


def token_rows(lengths: Sequence[int], seed: int, vocab: tuple[int, int] = (1000, 30000)) -> list[Array]:
    """One int64 row of token ids per length (ids within a BERT vocabulary), seeded."""
    rng = np.random.default_rng(seed + 1)
    return [rng.integers(vocab[0], vocab[1], size=n, dtype=np.int64) for n in lengths]


def padded(row: Array, length: int) -> Array:
    out = np.zeros(length, dtype=row.dtype)
    out[: len(row)] = row
    return out


def bert_inputs(ids: Array, send_length: int, token_types: bool) -> dict[str, Array]:
    """[1, send_length] input_ids / attention_mask (/ token_type_ids) for one request, zero-padded past the
    row's own tokens (the mask is 0 there)."""
    tensors = {
        "input_ids": padded(ids, send_length)[None, :],
        "attention_mask": padded(np.ones(len(ids), dtype=np.int64), send_length)[None, :],
    }
    if token_types:
        tensors["token_type_ids"] = np.zeros((1, send_length), dtype=np.int64)
    return tensors


@dataclass
class Payload:
    """One prebuilt request and how its answer is checked."""

    request: bytes
    useful: int
    """The request's own tokens."""
    sent: int
    """The tokens it carries (its own, or MAX_TOKENS when the client padded it)."""
    check: Check | None = None
    """Set before the load; a payload without a check is a defect of the benchmark (raised when answered)."""


def v2_payload(url: str, model: str, tensors: dict[str, Array], outputs: Sequence[str], useful: int) -> Payload:
    specs = [TensorSpec(name, "INT64", (-1,)) for name in tensors]
    request = encode_v2_http(Target(url, model), tensors, specs, outputs)
    return Payload(request, useful, int(next(iter(tensors.values())).shape[-1]))


_NP_TYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "FP16": np.float16}


def decode_v2(body: bytes) -> dict[str, Array]:
    """The outputs of a v2 infer answer with binary (or JSON) output data.

    The JSON header is read with ``raw_decode`` over a latin-1 view of the body (every byte maps to one
    character, and the header itself is ASCII), so its end is found without the response's headers."""
    header, end = json.JSONDecoder().raw_decode(body.decode("latin-1"))
    out: dict[str, Array] = {}
    offset = end
    for entry in header["outputs"]:
        dtype = _NP_TYPES[entry["datatype"]]
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is None:
            out[entry["name"]] = np.asarray(entry["data"], dtype=dtype).reshape(entry["shape"])
            continue
        out[entry["name"]] = np.frombuffer(body, dtype=dtype, count=size // np.dtype(dtype).itemsize,
                                           offset=offset).reshape(entry["shape"])  # fmt: skip
        offset += size
    return out


def infer_once(url: str, payload: Payload) -> dict[str, Array]:
    """Send one request alone (for references) and decode its answer; raises on an error status."""

    async def one() -> dict[str, Array]:
        host, port = Target(url).host_port
        transport = HttpTransport(host, port, 120.0)
        try:
            status, body = await transport.exchange(payload.request)
        finally:
            await transport.close()
        if status != 200:
            raise RuntimeError(f"reference request answered {status}: {body[:300]!r}")
        return decode_v2(body)

    result: dict[str, Array] = _event_loop_runner()(one())
    return result


# ---------------------------------------------------------------------------------------------------------
# the closed loop


@dataclass
class Measured:
    """One row's window: client-side figures and the server's counters over it."""

    seconds: float
    latencies_ms: list[float]
    errors: dict[str, int]
    checked: int
    """Answers checked (warm-up and window, every answer that came back)."""
    wrong: int
    first_wrong: str
    useful_tokens: int
    """Own tokens of the requests answered inside the window."""
    sent_tokens: int
    client_cpu_pct: float
    server_cpu_pct: float
    inference_count: int
    execution_count: int
    metrics: dict[str, float] = field(default_factory=dict)
    """Deltas of the server's ``modelsvc_batch_tokens_*`` counters for the model (empty when it has none)."""

    @property
    def per_s(self) -> float:
        return len(self.latencies_ms) / self.seconds

    def p(self, pct: float) -> float:
        return float(np.percentile(self.latencies_ms, pct)) if self.latencies_ms else math.nan

    @property
    def avg_batch(self) -> float:
        return self.inference_count / self.execution_count if self.execution_count else math.nan


_METRIC = re.compile(r"^(modelsvc_batch_tokens_(?:computed|useful))(?:_total)?\{([^}]*)\}\s+(\S+)", re.M)


def token_metrics(text: str, model: str) -> dict[str, float]:
    """``modelsvc_batch_tokens_computed`` and ``_useful`` of ``model`` (all versions summed) in a /metrics page."""
    out: dict[str, float] = {}
    for name, labels, value in _METRIC.findall(text):
        if f'model="{model}"' in labels:
            out[name] = out.get(name, 0.0) + float(value)
    return out


async def _get(transport: HttpTransport, url: str, path: str) -> bytes:
    host, port = Target(url).host_port
    status, body = await transport.exchange(http_request("GET", host, port, path, b"", {}))
    if status != 200:
        raise RuntimeError(f"GET {url}{path} answered {status}: {body[:300]!r}")
    return body


async def _snapshot(stats: HttpTransport, metrics: HttpTransport | None, url: str, metrics_url: str,
                    model: str) -> tuple[ServerCounters, dict[str, float]]:  # fmt: skip
    counters = ServerCounters.from_stats_json(json.loads(await _get(stats, url, f"/v2/models/{model}/stats")))
    tokens = token_metrics((await _get(metrics, metrics_url, "/metrics")).decode(), model) if metrics else {}
    return counters, tokens


def closed_loop(
    url: str,
    payloads: Sequence[Payload],
    *,
    model: str,
    server_url: str,
    metrics_url: str,
    server_pids: Sequence[int],
    clients: int,
    warmup_s: float,
    seconds: float,
    decode: Callable[[bytes], Any] = decode_v2,
) -> Measured:
    """``clients`` closed-loop clients send ``payloads`` to ``url``'s host (client k starts at payload k and
    steps by ``clients``) for ``warmup_s`` + ``seconds``; only answers that arrive inside the window count for
    throughput and latency, every answer is checked. ``model``'s statistics are read from ``server_url`` and its
    token counters from ``metrics_url`` (empty: not read) at the window's start and end; the process trees
    of ``server_pids`` give the server's CPU (for a service: the model server's and the logic server's)."""

    async def run() -> Measured:
        host, port = Target(url).host_port
        transport = HttpTransport(host, port, warmup_s + seconds + 10.0)  # a stuck server cannot hold the run
        s_host, s_port = Target(server_url).host_port
        stats_http = HttpTransport(s_host, s_port, 30.0)
        metrics_http = None
        if metrics_url:
            m_host, m_port = Target(metrics_url).host_port
            metrics_http = HttpTransport(m_host, m_port, 30.0)
        latencies: list[float] = []
        errors: dict[str, int] = {}
        wrong = checked = useful = sent_tokens = 0
        first_wrong = ""
        start = time.perf_counter() + warmup_s
        end = start + seconds

        async def worker(offset: int) -> None:
            nonlocal wrong, checked, useful, sent_tokens, first_wrong
            i = offset
            while (sent := time.perf_counter()) < end:
                payload = payloads[i % len(payloads)]
                i += clients
                try:
                    status, body = await transport.exchange(payload.request)
                except (OSError, TimeoutError) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                done = time.perf_counter()
                if status != 200:
                    kind = f"http {status}"
                    errors[kind] = errors.get(kind, 0) + 1
                    if not first_wrong:
                        first_wrong = f"{kind}: {body[:300]!r}"
                    continue
                if payload.check is None:
                    raise RuntimeError("a payload without a check was sent")
                problem = payload.check(decode(body))
                checked += 1
                if problem is not None:
                    wrong += 1
                    first_wrong = first_wrong or problem
                if start <= done <= end:
                    latencies.append((done - sent) * 1000.0)
                    useful += payload.useful
                    sent_tokens += payload.sent

        async def sample() -> tuple[tuple[ServerCounters, dict[str, float]], tuple[ServerCounters, dict[str, float]]]:
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            cpu0, srv0 = time.process_time(), sum(tree_cpu_seconds(pid) for pid in server_pids)
            before = await _snapshot(stats_http, metrics_http, server_url, metrics_url, model)
            await asyncio.sleep(max(0.0, end - time.perf_counter()))
            after = await _snapshot(stats_http, metrics_http, server_url, metrics_url, model)
            cpu[:] = [time.process_time() - cpu0, sum(tree_cpu_seconds(pid) for pid in server_pids) - srv0]
            return before, after

        cpu: list[float] = [math.nan, math.nan]
        window = asyncio.create_task(sample())
        try:
            await asyncio.gather(*(worker(k) for k in range(clients)))
            (counters0, tokens0), (counters1, tokens1) = await window
        finally:
            window.cancel()
            for t in (transport, stats_http, metrics_http):
                if t is not None:
                    await t.close()
        metrics = {k: tokens1[k] - tokens0.get(k, 0.0) for k in tokens1}
        return Measured(
            seconds, latencies, errors, checked, wrong, first_wrong, useful, sent_tokens,
            100.0 * cpu[0] / seconds, 100.0 * cpu[1] / seconds,
            counters1.inference_count - counters0.inference_count,
            counters1.execution_count - counters0.execution_count, metrics,
        )  # fmt: skip

    measured: Measured = _event_loop_runner()(run())
    return measured
