"""Admission: each route lets in what the pair can serve in time; the rest is answered at once, not queued.

A crowd of callers must not turn into a queue of requests that all time out: a request that cannot be served in
time gets 503 with ``Retry-After`` before its body is even read, and the requests already admitted keep the
latency they had. Which may wait for a slot is decided by expected wait, the learnt cost of what is ahead of
them, against the caller's deadline or the ``max_wait_s`` budget of service.yaml; a burst that fits waits its
turn, a storm is refused down to what keeps the admitted requests' latency (``logicd._gate``).

The caller's deadline comes from a header: ``Request-Timeout: 1.5`` (seconds) or gRPC's
``grpc-timeout: 1500m`` (an integer and a unit: H, M, S, m, u, n), the smaller when both are sent. It bounds
the wait for a slot and the handler (504 past it), and every model call made under it carries the time left
to the model service (``modelsvc.client.deadline``), which drops a request still queued when it passes.

The ``auto`` in-flight limit comes from the models' capacity as modelsvc reports it (their config JSON): what the
model service can hold without queueing into its timeouts is, per model, two batches per instance (one running,
one forming) plus the queue policy's ``max_queue_size``; a batch is ``max_batch_size`` rows, or fewer when
``max_batch_tokens`` (padding-aware batching) bounds it. A route's requests cost rows (windows) and tokens,
measured as they run (``Context.infer_chunks``), so the limit in requests follows what the route's requests
really send: many for short texts, one or two for long documents.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from modelsvc.protocol import grpc_timeout_s

from ._config import AdmissionConfig
from ._gate import RouteGate

__all__ = ["Admission", "Capacity", "DeadlineError", "RouteGate", "parse_deadline"]

DEADLINE_HEADERS = ("request-timeout", "grpc-timeout")
_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")
#: a deadline longer than this is no deadline a caller means (and would overflow the loop's timers)
MAX_DEADLINE_S = 86_400.0


class DeadlineError(ValueError):
    """A deadline header that cannot be read; the message names it."""


def parse_deadline(headers: Mapping[str, str]) -> float | None:
    """Seconds the caller waits, from ``Request-Timeout`` or ``grpc-timeout`` (lower-case names); None
    without either."""
    found: list[float] = []
    request_timeout = headers.get("request-timeout")
    if request_timeout is not None:
        text = request_timeout.strip()
        if not _SECONDS.fullmatch(text) or float(text) <= 0:
            raise DeadlineError(f"Request-Timeout must be a positive number of seconds, such as 1.5; got {text!r}")
        found.append(float(text))
    grpc_timeout = headers.get("grpc-timeout")
    if grpc_timeout is not None:
        seconds = grpc_timeout_s(grpc_timeout)
        if not seconds:  # unreadable, or zero
            raise DeadlineError(
                "grpc-timeout must be 1 to 8 digits and a unit (H, M, S, m, u or n), such as 1500m; "
                f"got {grpc_timeout.strip()!r}"
            )
        found.append(seconds)
    return min(min(found), MAX_DEADLINE_S) if found else None


# -- capacity --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    """What one model can hold, from its config JSON (``/v2/models/<m>/config``)."""

    instances: int
    max_batch_size: int
    max_batch_tokens: int | None
    max_queue_size: int
    """The default queue policy's (0: unbounded, so it adds nothing)."""
    queue_timeout_s: float | None
    """The default queue policy's ``default_timeout_microseconds``, in seconds (None: none)."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> Capacity:
        config = config or {}
        instances = sum(max(int(g.get("count") or 1), 1) for g in config.get("instance_group") or []) or 1
        batching = config.get("dynamic_batching") or {}
        policy = batching.get("default_queue_policy") or {}
        timeout_us = int(policy.get("default_timeout_microseconds") or 0)
        tokens = ((config.get("parameters") or {}).get("max_batch_tokens") or {}).get("string_value")
        return cls(
            instances=instances,
            max_batch_size=max(int(config.get("max_batch_size") or 0), 1),
            max_batch_tokens=int(tokens) if isinstance(tokens, str) and tokens.strip().isdigit() else None,
            max_queue_size=int(policy.get("max_queue_size") or 0),
            queue_timeout_s=timeout_us / 1e6 if timeout_us > 0 else None,
        )

    def rows(self, tokens_per_row: float) -> float:
        """Rows (windows) the model holds at once: two batches per instance, plus its bounded queue."""
        batch = self.max_batch_size
        if self.max_batch_tokens is not None:
            batch = max(1, min(batch, int(self.max_batch_tokens // max(tokens_per_row, 1.0))))
        return 2 * self.instances * batch + self.max_queue_size


# -- the ASGI middleware ---------------------------------------------------------------------------------

SCOPE_DEADLINE = "logicd.deadline"
"""The scope key under which the middleware leaves an admitted request's deadline (``time.monotonic()``)."""
SCOPE_GATE = "logicd.gate"


class Admission:
    """The gates of an app's routes, and the middleware that applies them."""

    def __init__(
        self,
        config: AdmissionConfig,
        window: int,
        on_refusal: Callable[[str, int, str], None],
        default_wait_s: float = 30.0,
    ) -> None:
        self.config = config
        self.window = window
        self.default_wait_s = default_wait_s
        """``max_wait_s: auto`` without a model queue timeout: the model call timeout (``model_service.timeout_s``)."""
        self.capacity: Capacity | None = None
        """The tightest of the service's models (the one that holds the fewest rows), once connected."""
        self.gates: dict[str, RouteGate] = {}
        self._on_refusal = on_refusal

    def set_models(self, configs: Sequence[Mapping[str, Any] | None]) -> None:
        capacities = [Capacity.from_config(c) for c in configs]
        self.capacity = min(capacities, key=lambda c: c.rows(self.window)) if capacities else None

    def gate(self, route: str) -> RouteGate:
        return self.gates.setdefault(
            route, RouteGate(route, self.config, lambda: self.capacity, self.window, self.default_wait_s)
        )

    def middleware(self, route: str) -> Callable[[Any], Any]:
        """The route's ASGI middleware: deadline header read, slot taken (or the request refused), released."""
        gate = self.gate(route)

        def factory(app: Any) -> Any:
            async def admit(scope: dict[str, Any], receive: Any, send: Any) -> None:
                if scope["type"] != "http":
                    await app(scope, receive, send)
                    return
                headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
                try:
                    seconds = parse_deadline(headers)
                except DeadlineError as exc:
                    self._on_refusal(route, 400, "deadline header")
                    await _problem(send, 400, str(exc), scope["path"])
                    return
                deadline = None if seconds is None else time.monotonic() + seconds
                size = _content_length(headers)
                refused = await gate.acquire(deadline, size)
                if refused is not None:
                    await self._refuse(send, gate, refused, scope["path"])
                    return
                scope[SCOPE_DEADLINE] = deadline
                scope[SCOPE_GATE] = gate
                try:
                    await app(scope, receive, send)
                finally:
                    gate.release(size)

            return admit

        return factory

    async def _refuse(self, send: Any, gate: RouteGate, why: str, path: str) -> None:
        if why == "deadline":
            self._on_refusal(gate.route, 504, why)
            await _problem(send, 504, "the request's deadline passed while it waited for a slot", path)
            return
        self._on_refusal(gate.route, 503, why)
        expected = gate.expected_wait_s()
        ahead = f"; expected wait {expected:.2f} s" if expected is not None else ""
        detail = {
            "full": f"at capacity: {gate.in_flight} requests in progress and {gate.waiting} waiting on this "
            f"route{ahead}",
            "late": f"at capacity: the request would not start before its deadline{ahead}",
        }.get(why, "at capacity: no slot came free within the longest wait")
        await _problem(send, 503, detail, path, retry_after=self.config.retry_after_s)


def _content_length(headers: Mapping[str, str]) -> int | None:
    """The body's declared size (what the gate weighs a request by), or None (chunked, or unreadable)."""
    text = headers.get("content-length", "").strip()
    return int(text) if text.isdigit() and len(text) < 16 else None


async def _problem(send: Any, status: int, detail: str, path: str, *, retry_after: int | None = None) -> None:
    title = {400: "Bad Request", 503: "Service Unavailable", 504: "Gateway Timeout"}[status]
    body = msgspec.json.encode(
        {"type": "about:blank", "title": title, "status": status, "detail": detail, "instance": path}
    )
    headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
