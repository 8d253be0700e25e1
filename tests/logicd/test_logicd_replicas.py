"""A logic server over two model-service replicas (issue 17, part 2): ``model_service.url`` takes a list (and
``discovery: dns``), from service.yaml or LOGICD_MODEL_SERVICE__URL; under load through a real ``logicd serve``,
kill -9 of one replica leaves every answer a 200 and the logic server ready."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from logicd import load_config
from logicd._config import ConfigError, ModelServiceConfig
from logicd._model_client import ReplicaCollector, model_client
from modelsvc.client import RetryPolicy
from tests._server import LogicdProcess
from tests.client.test_client_replicas import Replica, repository, two_replicas, until

pytestmark = pytest.mark.integration

SERVICE = """
import msgspec
import numpy as np
from logicd import Context, Service

service = Service()


class Value(msgspec.Struct):
    value: float


@service.post("/v1/echo")
async def echo(request: Value, ctx: Context) -> Value:
    out = await ctx.model("echo").infer(IN=np.array([[request.value]], np.float32))
    return Value(value=float(out["OUT"][0][0]))
"""


def service_dir(folder: Path, url: str, discovery: str = "none") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "echo_service.py").write_text(SERVICE)
    (folder / "service.yaml").write_text(
        f"""name: echo-svc
service: echo_service:service
model_service:
  url: {url}
  discovery: {discovery}
  timeout_s: 10
  retries: 0
models: [echo]
"""
    )
    return folder


class Logic(LogicdProcess):
    """``logicd serve`` with service.yaml's own model_service (no --model-url)."""

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            *("-m", "logicd", "serve", str(self.service)),
            *("--host", "127.0.0.1", "--port", str(self.http_port)),
        ]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    with two_replicas(repository(tmp_path_factory.mktemp("repo"), 0.0)) as replicas:
        yield replicas


def test_url_takes_a_list_and_discovery(tmp_path: Path) -> None:
    folder = service_dir(tmp_path / "a", "[http://m-0:8000, http://m-1:8000]")
    ms = load_config(folder / "service.yaml").model_service
    assert ms.urls == ["http://m-0:8000", "http://m-1:8000"]
    env = {"LOGICD_MODEL_SERVICE__URL": "[grpc://a:8001, grpc://b:8001]"}
    assert load_config(folder / "service.yaml", env).model_service.urls == ["grpc://a:8001", "grpc://b:8001"]
    env = {"LOGICD_MODEL_SERVICE__URL": "http://models-headless:8000", "LOGICD_MODEL_SERVICE__DISCOVERY": "dns"}
    ms = load_config(folder / "service.yaml", env).model_service
    assert (ms.url, ms.discovery) == ("http://models-headless:8000", "dns")
    client = model_client(ms, RetryPolicy())
    assert client._t.server == "models-headless:8000"
    client = model_client(ModelServiceConfig(url=["http://a:1", "http://b:1"]), RetryPolicy())
    assert [s.url for s in client.replicas()] == ["http://a:1", "http://b:1"]


async def test_replica_metrics(pair: list[Replica]) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    a = pair[1]  # the other one is killed in the last test
    client = model_client(ModelServiceConfig(url=[a.base, "http://127.0.0.1:1"]), RetryPolicy(attempts=1))
    registry = CollectorRegistry()
    registry.register(ReplicaCollector(client))
    async with client:
        for _ in range(10):
            await client.server_metadata()  # the dead one is taken out on its first call, the rest go to a
        text = generate_latest(registry).decode()
    assert f'logicd_model_replica_calls_total{{replica="{a.base}"}}' in text
    assert 'logicd_model_replica_ejected{replica="http://127.0.0.1:1"} 1.0' in text
    assert 'logicd_model_replica_failures_total{replica="http://127.0.0.1:1"} 1.0' in text
    assert f'logicd_model_replica_ejected{{replica="{a.base}"}} 0.0' in text
    assert f'logicd_model_replica_outstanding{{replica="{a.base}"}} 0.0' in text
    single = CollectorRegistry()
    single.register(ReplicaCollector(model_client(ModelServiceConfig(url=a.base), RetryPolicy())))
    assert "replica" not in generate_latest(single).decode()


@pytest.mark.parametrize(
    ("url", "discovery", "reason"),
    [
        ("[]", "none", "an empty list"),
        ("[http://a:1, ftp://b]", "none", "must be http(s)://host[:port], grpc://host:port, got 'ftp://b'"),
        ("[http://a:1, grpc://b:2]", "none", "share one scheme"),
        ("[http://a:1, http://a:1]", "none", "listed twice"),
        ("[http://a:1, http://b:1]", "dns", "'dns' takes one model_service.url"),
        ("[embedded, http://b:1]", "none", "got 'embedded'"),
        ("http://a:1", "srv", "discovery"),
    ],
)
def test_bad_replica_settings_name_the_key(tmp_path: Path, url: str, discovery: str, reason: str) -> None:
    folder = service_dir(tmp_path / "b", url, discovery)
    with pytest.raises(ConfigError) as caught:
        load_config(folder / "service.yaml")
    assert reason in str(caught.value)
    assert "model_service." in str(caught.value)


async def test_kill_9_of_one_replica_under_load_every_answer_is_200(tmp_path: Path, pair: list[Replica]) -> None:
    a, b = pair
    folder = service_dir(tmp_path / "svc", f"[{a.base}, {b.base}]")
    statuses: dict[int, int] = {}
    stop = asyncio.Event()

    async def send(http: httpx.AsyncClient, i: int) -> None:
        while not stop.is_set():
            r = await http.post("/v1/echo", json={"value": i})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 200:
                assert r.json() == {"value": i}

    with Logic(folder, "") as logic:
        async with httpx.AsyncClient(base_url=logic.base, timeout=20) as http:
            tasks = [asyncio.create_task(send(http, i)) for i in range(6)]
            await until(lambda: statuses.get(200, 0) >= 50)
            a.kill()
            served = statuses.get(200, 0)
            await until(lambda: statuses.get(200, 0) >= served + 150)
            assert (await http.get("/health/ready")).status_code == 200  # one replica is enough
            stop.set()
            await asyncio.gather(*tasks)
    assert set(statuses) == {200}, statuses
