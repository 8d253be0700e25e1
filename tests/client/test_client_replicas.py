"""Several real modelsvc replicas behind one AsyncClient (issue 17, part 2): under continuous load, kill -9 of
one replica and a rolling restart fail no call, a restarted replica is readmitted, the least-outstanding choice
sends fewer calls to a slow replica, and DNS discovery adds and removes replicas as the name's answer changes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from loadtests.replicas import echo_repository as repository
from modelsvc.client import AsyncClient, ConnectError, ReplicaState
from tests._server import ModelsvcProcess

pytestmark = pytest.mark.integration


class Replica(ModelsvcProcess):
    """A modelsvc that can be started again on the same address (``again()``), or on another loopback host."""

    def __init__(self, repo: Path, host: str = "127.0.0.1", port: int | None = None) -> None:
        super().__init__(repo)
        self.host = host
        if port is not None:
            self.http_port = port
        self.url = f"{host}:{self.http_port}"
        self.base = f"http://{self.url}"

    @property
    def command(self) -> list[str]:
        return [*super().command, "--http-address", self.host]

    def again(self) -> Replica:
        twin = Replica(self.repository, self.host, self.http_port)
        twin.metrics_port, twin.grpc_port = self.metrics_port, self.grpc_port
        return twin

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def fast_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return repository(tmp_path_factory.mktemp("fast"), 0.0)


@contextmanager
def two_replicas(repo: Path) -> Iterator[list[Replica]]:
    """Two replicas of ``repo``, started together and ready; both stopped at the end."""
    replicas = [Replica(repo).start(), Replica(repo).start()]
    try:
        for r in replicas:
            r.wait_ready()
        yield replicas
    finally:
        for r in replicas:
            r.terminate()


@pytest.fixture(scope="module")
def pair(fast_repo: Path) -> Iterator[list[Replica]]:
    with two_replicas(fast_repo) as replicas:
        yield replicas


class Load:
    """``tasks`` async senders calling ``echo`` without pause until stopped; every failure is kept."""

    def __init__(self, client: AsyncClient, tasks: int = 6) -> None:
        self.client = client
        self.ok = 0
        self.errors: list[BaseException] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._send(i)) for i in range(tasks)]

    async def _send(self, i: int) -> None:
        value = np.array([[float(i)]], np.float32)
        while not self._stop.is_set():
            try:
                out = await self.client.infer("echo", {"IN": value}, timeout=10.0)
                assert out["OUT"].tolist() == [[float(i)]]
                self.ok += 1
            except Exception as exc:  # every failure is a finding
                self.errors.append(exc)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


def state(client: AsyncClient, replica: Replica) -> ReplicaState:
    (found,) = [s for s in client.replicas() if s.url == replica.base]
    return found


async def until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.05)


async def wait_ready(replica: Replica) -> None:
    await asyncio.to_thread(replica.wait_ready)


def urls(replicas: Sequence[Replica]) -> list[str]:
    return [r.base for r in replicas]


def grpc_urls(replicas: Sequence[Replica]) -> list[str]:
    return [f"grpc://127.0.0.1:{r.grpc_port}" for r in replicas]


@pytest.mark.parametrize("scheme", ["http", "grpc"])
async def test_kill_9_fails_no_call_and_the_restarted_replica_is_readmitted(pair: list[Replica], scheme: str) -> None:
    a, b = pair
    listed = urls(pair) if scheme == "http" else grpc_urls(pair)

    def state(client: AsyncClient, replica: Replica) -> ReplicaState:
        (found,) = [s for s in client.replicas() if s.url == listed[pair.index(replica)]]
        return found

    async with AsyncClient(listed) as client:
        load = Load(client)
        await until(lambda: state(client, a).calls > 20 and state(client, b).calls > 20)
        a.kill()
        await until(lambda: state(client, a).ejected)
        before = state(client, b).calls
        await until(lambda: state(client, b).calls > before + 50)  # the survivor takes all
        pair[0] = a = a.again().start()
        await wait_ready(a)
        await until(lambda: not state(client, a).ejected)
        readmitted = state(client, a).calls
        await until(lambda: state(client, a).calls > readmitted + 20)  # calls reach it again
        await load.stop()
    assert load.errors == []
    assert load.ok > 100


async def test_a_rolling_restart_fails_no_call(pair: list[Replica]) -> None:
    async with AsyncClient(urls(pair)) as client:
        load = Load(client)
        await until(lambda: load.ok > 20)
        for i, old in enumerate(list(pair)):
            old.terminate()  # SIGTERM: it drains and exits
            pair[i] = new = old.again().start()
            await wait_ready(new)
            await until(lambda: not state(client, new).ejected)  # noqa: B023 - awaited in this iteration
            done = state(client, new).calls
            await until(lambda: state(client, new).calls > done + 10)  # noqa: B023
        await load.stop()
    assert load.errors == []


async def test_a_slow_replica_receives_fewer_calls(tmp_path: Path, pair: list[Replica]) -> None:
    with Replica(repository(tmp_path, 0.05)) as slow:
        fast = pair[0]
        async with AsyncClient([fast.base, slow.base]) as client:
            load = Load(client, tasks=4)
            await until(lambda: load.ok > 150)
            await load.stop()
            fast_calls, slow_calls = state(client, fast).calls, state(client, slow).calls
        assert load.errors == []
        assert slow_calls > 0
        assert slow_calls * 3 < fast_calls, (fast_calls, slow_calls)
        assert slow.model_stats("echo")["inference_count"] == slow_calls  # the server counted the same calls


async def test_dns_discovery_follows_the_names_answer(fast_repo: Path) -> None:
    one = Replica(fast_repo, "127.0.0.1").start()
    two = Replica(fast_repo, "127.0.0.2", one.http_port).start()
    try:
        await asyncio.gather(wait_ready(one), wait_ready(two))
        answer = ["127.0.0.1"]
        asked: list[tuple[str, int]] = []

        async def resolve(host: str, port: int) -> list[str]:
            asked.append((host, port))
            return list(answer)

        name = f"http://models.headless.test:{one.http_port}"
        async with AsyncClient(name, discovery="dns", resolve=resolve) as client:
            client._t.resolve_interval_s = 0.2  # type: ignore[attr-defined]
            load = Load(client, tasks=4)
            await until(lambda: load.ok > 10)
            assert asked[0] == ("models.headless.test", one.http_port)
            assert [s.url for s in client.replicas()] == [one.base]
            answer[:] = ["127.0.0.1", "127.0.0.2"]  # a new pod
            await until(lambda: len(client.replicas()) == 2)
            await until(lambda: state(client, two).calls > 20)
            answer[:] = ["127.0.0.2"]  # the old pod is gone
            await until(lambda: [s.url for s in client.replicas()] == [two.base])
            served = load.ok
            await until(lambda: load.ok > served + 20)
            answer[:] = []  # an empty answer keeps the replicas known
            await asyncio.sleep(0.5)
            assert [s.url for s in client.replicas()] == [two.base]
            await load.stop()
        assert load.errors == []
    finally:
        one.terminate()
        two.terminate()


async def test_every_replica_down_tries_each_then_fails() -> None:
    from loadtests.harness._servers import free_port

    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    async with AsyncClient(dead, timeout=5.0) as client:
        with pytest.raises(ConnectError):
            await client.infer("echo", {"IN": np.zeros((1, 1), np.float32)})
        assert all(s.ejected and s.calls >= 1 for s in client.replicas())
        assert await client.server_ready() is False


def test_bad_replica_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="one scheme"):
        AsyncClient(["http://a:8000", "grpc://b:8001"])
    with pytest.raises(ValueError, match="listed twice"):
        AsyncClient(["http://a:8000", "http://a:8000"])
    with pytest.raises(ValueError, match="discovery"):
        AsyncClient("http://a:8000", discovery="consul")
    with pytest.raises(ValueError, match="one URL"):
        AsyncClient(["http://a:8000"], discovery="dns")
    assert AsyncClient(["http://a:8000"]).replicas() == []  # one URL: the plain binding
