"""Network faults, from real sockets: the client gives the right exception after the right number of tries,
and nothing hangs."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from modelsvc.client import (
    AsyncClient,
    Client,
    ClientError,
    ConnectError,
    ConnectionLost,
    PayloadTooLarge,
    RetryBudget,
    RetryPolicy,
    ServerUnavailable,
    Timeout,
)
from modelsvc.client._errors import error_from_grpc

FAST = RetryPolicy(attempts=3, backoff_s=0.001, max_backoff_s=0.005)
ROW = {"INPUT0": np.ones((1, 16), np.float32)}
OK_BODY = (
    b'{"model_name":"identity","model_version":"1","outputs":'
    b'[{"name":"OUTPUT0","datatype":"FP32","shape":[1,1],"data":[1.0]}]}'
)


class FaultServer:
    """Accepts connections on 127.0.0.1 and misbehaves as told; counts the requests it saw."""

    def __init__(self, mode: str, failures: int = 10**9) -> None:
        self.mode = mode
        self.failures = failures
        self.requests = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.05)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        while len(rest) < length:
            rest += conn.recv(65536)
        return True

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            while self._read_request(conn):
                self.requests += 1
                failing = self.requests <= self.failures
                if self.mode == "close" and failing:
                    return  # drop the connection without an answer
                if self.mode == "stall" and failing:
                    self._stop.wait(30)
                    return
                if self.mode == "dribble":
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n")
                    for _ in range(1000):
                        if self._stop.wait(0.2):
                            return
                        try:
                            conn.sendall(b" ")
                        except OSError:
                            return
                    return
                if self.mode == "503" and failing:
                    body = b'{"error":"the server is not ready"}'
                    conn.sendall(
                        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    continue
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(OK_BODY), OK_BODY)
                )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def fault() -> Iterator[type[FaultServer]]:
    servers: list[FaultServer] = []

    def make(mode: str, failures: int = 10**9) -> FaultServer:
        servers.append(FaultServer(mode, failures))
        return servers[-1]

    yield make  # type: ignore[misc]
    for s in servers:
        s.close()


def test_connection_lost_after_sending_is_not_retried(fault):
    """The server read the request and then closed: it may have run it, so it is not sent again."""
    srv = fault("close")
    with Client(srv.url, retry=FAST, binary=False) as c, pytest.raises(ConnectionLost):
        c.infer("identity", ROW)
    assert srv.requests == 1


def test_refused_connections_are_retried_then_connect_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with Client(f"127.0.0.1:{port}", retry=FAST, binary=False) as c, pytest.raises(ConnectError):
        c.infer("identity", ROW)
    assert time.monotonic() - t0 < 5


def test_a_trickling_answer_is_cut_off_at_the_call_timeout(fault):
    srv = fault("dribble")
    t0 = time.monotonic()
    with Client(srv.url, retry=FAST, binary=False, timeout=1.0) as c, pytest.raises(Timeout):
        c.infer("identity", ROW)
    assert time.monotonic() - t0 < 3  # one byte every 0.2 s would take minutes


@dataclasses.dataclass(frozen=True)
class NoJitter(RetryPolicy):
    """The full backoff every time: no random draw decides what the test sees."""

    def delay_s(self, attempt: int, rand: Callable[[], float] = lambda: 1.0) -> float:
        return super().delay_s(attempt, rand=lambda: 1.0)


def test_budget_is_spent_only_on_retries_that_happen(fault):
    srv = fault("503")
    budget = RetryBudget(ratio=0.0, min_per_s=0.0, burst=3.0)
    slow = NoJitter(attempts=5, backoff_s=10.0, max_backoff_s=10.0)  # every backoff overruns the timeout
    with Client(srv.url, retry=slow, budget=budget, binary=False, timeout=0.5) as c:
        for _ in range(3):
            with pytest.raises(ServerUnavailable):
                c.infer("identity", ROW)
    assert srv.requests == 3
    assert budget.try_spend()  # still there: no retry happened


def test_503_is_retried_until_it_passes(fault):
    srv = fault("503", failures=2)
    with Client(srv.url, retry=FAST, binary=False) as c:
        assert c.infer("identity", ROW)["OUTPUT0"].tolist() == [[1.0]]
    assert srv.requests == 3


def test_503_for_good_gives_server_unavailable_after_all_attempts(fault):
    srv = fault("503")
    with Client(srv.url, retry=FAST, binary=False) as c, pytest.raises(ServerUnavailable) as info:
        c.infer("identity", ROW)
    assert info.value.status == 503
    assert srv.requests == 3


def test_stalled_server_times_out_once_and_nothing_hangs(fault):
    srv = fault("stall")
    t0 = time.monotonic()
    with Client(srv.url, retry=FAST, binary=False, timeout=0.3) as c, pytest.raises(Timeout):
        c.infer("identity", ROW)
    assert time.monotonic() - t0 < 5
    assert srv.requests == 1  # a timeout is not retried: the call's time is spent


def test_retry_budget_caps_retries(fault):
    srv = fault("503")
    empty = RetryBudget(ratio=0.0, min_per_s=0.0, burst=0.0)
    with Client(srv.url, retry=FAST, budget=empty, binary=False) as c, pytest.raises(ServerUnavailable):
        c.infer("identity", ROW)
    assert srv.requests == 1


def test_budget_spends_and_earns():
    budget = RetryBudget(ratio=0.5, min_per_s=0.0, burst=2.0)
    assert budget.try_spend()
    assert budget.try_spend()
    assert not budget.try_spend()
    budget.record_call()
    budget.record_call()
    assert budget.try_spend()
    assert not budget.try_spend()


def test_backoff_grows_and_is_capped():
    policy = RetryPolicy(attempts=10, backoff_s=0.1, max_backoff_s=0.5)
    assert [policy.delay_s(n, rand=lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert policy.delay_s(3, rand=lambda: 0.0) == 0.0


async def test_async_client_retries_the_same_way(fault):
    srv = fault("503", failures=2)
    async with AsyncClient(srv.url, retry=FAST, binary=False) as c:
        result = await c.infer("identity", ROW)
    assert result["OUTPUT0"].tolist() == [[1.0]]
    assert srv.requests == 3
    closing = fault("close")
    async with AsyncClient(closing.url, retry=FAST, binary=False) as c:
        with pytest.raises(ConnectionLost):
            await c.infer("identity", ROW)
    assert closing.requests == 1
    trickle = fault("dribble")
    async with AsyncClient(trickle.url, retry=FAST, binary=False, timeout=1.0) as c:
        with pytest.raises(Timeout):
            await c.infer("identity", ROW)


def test_an_async_client_stays_on_its_event_loop(fault):
    srv = fault("503", failures=0)
    client = AsyncClient(srv.url, retry=FAST, binary=False)

    async def first() -> None:
        await client.infer("identity", ROW)
        await client.close()  # its connections die with this loop

    async def second() -> None:
        await client.infer("identity", ROW)

    asyncio.run(first())
    with pytest.raises(ClientError, match="one AsyncClient per event loop"):
        asyncio.run(second())


def test_grpc_message_too_large_is_payload_too_large_not_retried():
    error = error_from_grpc("RESOURCE_EXHAUSTED", "Received message larger than max (4021 vs. 1000)")
    assert isinstance(error, PayloadTooLarge)
    assert not RetryPolicy().should_retry(error, 1)
