"""Several replicas of one model service behind one ``AsyncTransport``.

    AsyncClient(["http://10.0.0.5:8000", "http://10.0.0.6:8000"])      # a fixed list
    AsyncClient("http://models-headless:8000", discovery="dns")         # every address the name resolves to

Each replica is its own protocol binding. A call goes to the replica with the fewest calls outstanding (ties at
random). A replica that cannot be reached (``ConnectError``, ``ConnectionLost``) or answers 503
(``ServerUnavailable``, not ``QueueFull``) is ejected and the call goes at once to another one, within the
call's time left (no backoff; the client's retry policy never sees these failovers). A background probe on the
event loop asks each ejected replica ``ready()`` every ``probe_interval_s`` and readmits it when it answers true.
When every replica is ejected they are tried anyway. ``Timeout`` and 4xx answers are not failed over.

Sequences (requests with Triton's ``sequence_id`` parameter) are sticky: the request carrying
``sequence_start`` is placed (and failed over) like any call, and the replica that answers it takes every later
request of that sequence until the one carrying ``sequence_end``. Such a request is never failed over: when its
replica fails at the connection level, answers 503, or was removed, the call raises ``SequenceLost`` (the
sequence's state lived there). A streamed call (``open_stream``) goes to the least busy replica; one that cannot
be reached is ejected and the client's retry policy opens the stream again elsewhere.

With DNS discovery the host name is resolved again every ``resolve_interval_s`` (a headless Service's pods get
new addresses in a rolling update): new addresses become replicas, gone ones are removed (calls in flight to
them finish, then their binding closes). ``https://`` with DNS discovery connects to each address by IP, so the
certificate must name the IP addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ._core import InferCall, InferReply, InferResult
from ._errors import ClientError, ConnectError, ConnectionLost, QueueFull, ServerUnavailable
from ._sequence import SEQUENCE_END, SEQUENCE_START, SequenceLost, sequence_key
from ._stream import StreamCall, StreamingTransport, StreamingUnsupported
from ._transport import AsyncTransport

__all__ = ["AsyncReplicaTransport", "ReplicaState", "Resolver", "resolve_host"]

logger = logging.getLogger("modelsvc.client.replicas")
T = TypeVar("T")
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""``(host, port) -> addresses``: how DNS discovery resolves the name (``resolve_host`` by default)."""

_FAILOVER = (ConnectError, ConnectionLost, ServerUnavailable)
MAX_PINNED_SEQUENCES = 65536
"""Sequences whose replica is remembered; beyond that the oldest pin is dropped (a sequence never ended)."""


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica as the client sees it now (for /metrics and readiness)."""

    url: str
    outstanding: int
    """Calls sent to it and not yet answered."""
    ejected: bool
    """Taken out after a connection failure or a 503; back when its ready probe answers true."""
    calls: int
    """Calls sent to it so far."""
    failures: int
    """Calls it failed at the connection level or with a 503."""


class _Replica:
    __slots__ = ("binding", "calls", "ejected", "failures", "outstanding", "removed", "url")

    def __init__(self, url: str, binding: AsyncTransport) -> None:
        self.url = url
        self.binding = binding
        self.outstanding = 0
        self.calls = 0
        self.failures = 0
        self.ejected = False
        self.removed = False


async def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (IPv4 and IPv6, TCP), in the resolver's order, without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _with_host(url: str, address: str) -> str:
    parts = urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return parts._replace(netloc=netloc).geturl()


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "http"


class AsyncReplicaTransport:
    """An ``AsyncTransport`` over several replicas: least outstanding, ejection, failover, probes, DNS."""

    def __init__(
        self,
        make: Callable[[str], AsyncTransport],
        urls: Sequence[str] = (),
        *,
        dns: str | None = None,
        resolve: Resolver | None = None,
        probe_interval_s: float = 0.3,
        probe_timeout_s: float = 1.0,
        resolve_interval_s: float = 5.0,
    ) -> None:
        """``make`` builds the binding of one replica's URL. Give ``urls`` (a fixed list) or ``dns`` (a URL
        whose host name is resolved to the replicas' addresses), not both."""
        if (dns is None) == (not urls):
            raise ValueError("give a list of replica URLs or one URL to resolve (dns=), not both")
        self._make = make
        self._dns = dns
        self._resolve: Resolver = resolve or resolve_host
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.resolve_interval_s = resolve_interval_s
        self._replicas: list[_Replica] = []
        self._task: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()
        self._started = False
        self._closing: set[asyncio.Task[None]] = set()
        self._sequences: dict[int | str, _Replica] = {}
        """Each live sequence's replica (by sequence id), from its start to its end."""
        if dns is not None:
            parts = urlsplit(dns if "://" in dns else f"http://{dns}")
            if not parts.hostname:
                raise ValueError(f"no host name to resolve in {dns!r}")
            self._host = parts.hostname
            self._port = parts.port or (443 if parts.scheme == "https" else 80)
            self.scheme = _scheme(dns)
            self.server = f"{self._host}:{self._port}"
        else:
            schemes = {_scheme(u) for u in urls}
            if len(schemes) > 1:
                raise ValueError(f"replicas must share one scheme, got {sorted(schemes)}")
            if len(set(urls)) != len(urls):
                raise ValueError(f"a replica URL is listed twice: {list(urls)}")
            self.scheme = schemes.pop()
            self._replicas = [_Replica(u, make(u)) for u in urls]
            self.server = ",".join(r.binding.server for r in self._replicas)

    # -- state ------------------------------------------------------------------------------------
    def states(self) -> list[ReplicaState]:
        return [ReplicaState(r.url, r.outstanding, r.ejected, r.calls, r.failures) for r in self._replicas]

    # -- start, discovery and probes --------------------------------------------------------------
    async def _start(self) -> None:
        if self._started:
            return
        async with self._starting:
            if self._task is not None:  # another call started it while this one waited
                return
            if self._dns is not None:
                try:
                    await self._discover()
                except OSError as exc:
                    raise ConnectError(f"cannot resolve {self._host!r} to model-service replicas: {exc}") from exc
            self._task = asyncio.get_running_loop().create_task(self._background(), name="modelsvc-replicas")
            self._started = True

    async def _discover(self) -> None:
        """Resolve the name once; add new addresses, remove gone ones (an empty answer changes nothing)."""
        assert self._dns is not None
        addresses = await self._resolve(self._host, self._port)
        if not addresses:
            return
        wanted = {_with_host(self._dns, a) for a in addresses}
        have = {r.url for r in self._replicas}
        for url in [_with_host(self._dns, a) for a in addresses]:
            if url not in have:
                logger.info("replica added: %s", url)
                self._replicas.append(_Replica(url, self._make(url)))
                have.add(url)
        for gone in [r for r in self._replicas if r.url not in wanted]:
            logger.info("replica removed: %s", gone.url)
            self._replicas.remove(gone)
            gone.removed = True
            if gone.outstanding == 0:
                await gone.binding.close()

    async def _background(self) -> None:
        next_resolve = time.monotonic() + self.resolve_interval_s
        while True:
            await asyncio.sleep(self.probe_interval_s)
            ejected = [r for r in self._replicas if r.ejected]
            if ejected:
                await asyncio.gather(*(self._probe(r) for r in ejected))
            if self._dns is not None and time.monotonic() >= next_resolve:
                next_resolve = time.monotonic() + self.resolve_interval_s
                try:
                    await self._discover()
                except OSError as exc:  # keep the replicas known; try again next time
                    logger.warning("cannot resolve %r: %s", self._host, exc)

    async def _probe(self, replica: _Replica) -> None:
        try:
            ready = await replica.binding.ready(self.probe_timeout_s)
        except ClientError:
            return
        if ready and replica.ejected:
            logger.info("replica readmitted: %s", replica.url)
            replica.ejected = False

    def _eject(self, replica: _Replica, why: object) -> None:
        replica.failures += 1
        if not replica.ejected:
            logger.warning("replica ejected: %s (%s)", replica.url, why)
            replica.ejected = True

    # -- choosing and failing over ----------------------------------------------------------------
    def _pick(self, tried: set[_Replica]) -> _Replica | None:
        """The admitted replica with the fewest calls outstanding (ties at random); an ejected one only when
        none is admitted; None when all were tried."""
        left = [r for r in self._replicas if r not in tried]
        admitted = [r for r in left if not r.ejected]
        pool = admitted or left
        if not pool:
            return None
        least = min(r.outstanding for r in pool)
        return random.choice([r for r in pool if r.outstanding == least])

    def _release(self, replica: _Replica) -> None:
        replica.outstanding -= 1
        if replica.removed and replica.outstanding == 0:
            task = asyncio.get_running_loop().create_task(replica.binding.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _run(
        self,
        op: Callable[[AsyncTransport, float | None], Awaitable[T]],
        timeout: float | None,
        chosen: list[_Replica] | None = None,
    ) -> T:
        await self._start()
        end = None if timeout is None else time.monotonic() + timeout
        tried: set[_Replica] = set()
        last: ClientError | None = None
        while True:
            replica = self._pick(tried)
            if replica is None:
                raise last or ConnectError(f"no model-service replica known for {self.server}")
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise last or ConnectError(f"no time left to reach a replica of {self.server}")
            replica.outstanding += 1
            replica.calls += 1
            if chosen is not None:
                chosen.append(replica)
            try:
                return await op(replica.binding, left)
            except _FAILOVER as exc:
                if isinstance(exc, QueueFull):  # overloaded, not gone: the retry policy decides
                    raise
                self._eject(replica, exc)
                tried.add(replica)
                last = exc
            finally:
                self._release(replica)

    # -- AsyncTransport ---------------------------------------------------------------------------
    async def live(self, timeout: float | None) -> bool:
        return await self._run(lambda b, t: b.live(t), timeout)

    async def ready(self, timeout: float | None) -> bool:
        """True while at least one replica is ready; a replica that answers not ready is ejected."""

        async def one(binding: AsyncTransport, t: float | None) -> bool:
            if await binding.ready(t):
                return True
            raise ServerUnavailable(f"{binding.server} is not ready", status=503)

        try:
            return await self._run(one, timeout)
        except ServerUnavailable:
            return False

    async def model_ready(self, name: str, version: str | None, timeout: float | None) -> bool:
        return await self._run(lambda b, t: b.model_ready(name, version, t), timeout)

    async def server_metadata(self, timeout: float | None) -> dict[str, Any]:
        return await self._run(lambda b, t: b.server_metadata(t), timeout)

    async def model_metadata(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        return await self._run(lambda b, t: b.model_metadata(name, version, t), timeout)

    async def model_config(self, name: str, version: str | None, timeout: float | None) -> dict[str, Any]:
        return await self._run(lambda b, t: b.model_config(name, version, t), timeout)

    async def infer(self, call: InferCall) -> InferReply:
        def op(b: AsyncTransport, t: float | None) -> Awaitable[InferReply]:
            return b.infer(call if t == call.timeout else replace(call, timeout=t))

        parameters = call.parameters
        key = sequence_key(parameters)
        if key is None:
            return await self._run(op, call.timeout)
        assert parameters is not None
        return await self._sequence_step(
            key, bool(parameters.get(SEQUENCE_START)), bool(parameters.get(SEQUENCE_END)), op, call.timeout
        )

    # -- sequences ----------------------------------------------------------------------------------
    async def _sequence_step(
        self,
        key: int | str,
        start: bool,
        end: bool,
        op: Callable[[AsyncTransport, float | None], Awaitable[T]],
        timeout: float | None,
    ) -> T:
        """One request of sequence ``key``: a start is placed as any call and pins its replica; the others go
        to the pinned replica or raise ``SequenceLost``."""
        if start:
            self._sequences.pop(key, None)
            chosen: list[_Replica] = []
            result = await self._run(op, timeout, chosen)
            if not end:
                self._pin(key, chosen[-1])
            return result
        replica = self._sequences.get(key)
        try:
            if replica is None:
                raise SequenceLost(
                    f"sequence {key!r}: no replica holds it (it was not started through this client, "
                    "or it ended, or its replica was lost earlier)"
                )
            if replica.removed:
                raise SequenceLost(f"sequence {key!r}: its replica {replica.url} left the model service")
            await self._start()
            replica.outstanding += 1
            replica.calls += 1
            try:
                return await op(replica.binding, timeout)
            except _FAILOVER as exc:
                if isinstance(exc, QueueFull):  # overloaded, not gone: the sequence lives on there
                    raise
                self._eject(replica, exc)
                self._sequences.pop(key, None)
                raise SequenceLost(
                    f"sequence {key!r}: its replica {replica.url} failed mid-sequence ({exc}); the sequence's "
                    "state was there: start the sequence again"
                ) from exc
            finally:
                self._release(replica)
        finally:
            if end:
                self._sequences.pop(key, None)

    def _pin(self, key: int | str, replica: _Replica) -> None:
        self._sequences[key] = replica
        while len(self._sequences) > MAX_PINNED_SEQUENCES:
            self._sequences.pop(next(iter(self._sequences)))

    def sequence_replica(self, key: int | str) -> str | None:
        """The URL of the replica that holds sequence ``key``, None when none does."""
        replica = self._sequences.get(key)
        return None if replica is None else replica.url

    # -- streams ------------------------------------------------------------------------------------
    def open_stream(self, call: InferCall) -> StreamCall:
        return _ReplicaStream(self, lambda b: b.open_stream(call))

    async def close(self) -> None:
        self._sequences.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        replicas, self._replicas = self._replicas, []
        for r in replicas:
            await r.binding.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


class _ReplicaStream:
    """A stream on the least busy replica, counted outstanding until it ends; one that cannot be reached before
    its first response is ejected (the retry policy then opens the stream again, elsewhere)."""

    def __init__(self, owner: AsyncReplicaTransport, open_on: Callable[[StreamingTransport], StreamCall]) -> None:
        self._owner = owner
        self._open_on = open_on
        self._replica: _Replica | None = None
        self._call: StreamCall | None = None
        self._received = 0

    async def next(self) -> InferResult | None:
        owner = self._owner
        if self._call is None:
            await owner._start()
            replica = owner._pick(set())
            if replica is None:
                raise ConnectError(f"no model-service replica known for {owner.server}")
            if not isinstance(replica.binding, StreamingTransport):
                raise StreamingUnsupported(f"{replica.url}: streamed responses need grpc:// replicas")
            self._call = self._open_on(replica.binding)
            self._replica = replica
            replica.outstanding += 1
            replica.calls += 1
        try:
            result = await self._call.next()
        except _FAILOVER as exc:
            if self._replica is not None and not self._received and not isinstance(exc, QueueFull):
                owner._eject(self._replica, exc)
            self._done()
            raise
        except BaseException:
            self._done()
            raise
        if result is None:
            self._done()
        else:
            self._received += 1
        return result

    def _done(self) -> None:
        replica, self._replica = self._replica, None
        if replica is not None:
            self._owner._release(replica)

    async def close(self) -> None:
        if self._call is not None:
            await self._call.close()
        self._done()

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()
        replica, self._replica = self._replica, None
        if replica is not None:  # may run outside a task (a dropped stream): release without closing bindings
            replica.outstanding -= 1
