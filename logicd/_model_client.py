"""The model-service client a logic server's ``model_service`` settings describe: one URL, a list of
replicas, or one URL whose host name DNS resolves to the replicas (``discovery: dns``); and the replicas'
state as Prometheus metrics."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from modelsvc.client import AsyncClient, RetryPolicy

from ._config import ModelServiceConfig

__all__ = ["ReplicaCollector", "model_client"]


def model_client(ms: ModelServiceConfig, retry: RetryPolicy) -> AsyncClient:
    """An ``AsyncClient`` for a remote model service (not ``embedded``: that one is built over its engine).

    One URL is the plain client; several, or ``discovery: dns``, balance over the replicas and fail over
    between them (``AsyncClient.replicas()`` shows their state)."""
    if ms.embedded:
        raise ValueError("model_client is for a remote model service; 'embedded' runs in this process")
    url: str | list[str] = ms.url if isinstance(ms.url, str) else list(ms.url)
    return AsyncClient(url, timeout=ms.timeout_s, retry=retry, discovery=ms.discovery)


class ReplicaCollector(Collector):
    """The model-service replicas as ``client.replicas()`` shows them at each scrape, labelled by URL:
    ``logicd_model_replica_outstanding``, ``_ejected`` (1 while taken out), ``_calls_total`` and
    ``_failures_total``. Nothing for a single model service. ``registry.register(ReplicaCollector(client))``."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        states = self.client.replicas()
        if not states:
            return
        outstanding = GaugeMetricFamily(
            "logicd_model_replica_outstanding", "Model calls sent to the replica, not yet answered", labels=["replica"]
        )
        ejected = GaugeMetricFamily(
            "logicd_model_replica_ejected",
            "1 while the replica is taken out (failed or answered 503; back when ready)",
            labels=["replica"],
        )
        calls = CounterMetricFamily("logicd_model_replica_calls", "Model calls sent to the replica", labels=["replica"])
        failures = CounterMetricFamily(
            "logicd_model_replica_failures",
            "Model calls the replica failed at the connection level or with a 503 (each went to another one)",
            labels=["replica"],
        )
        for s in states:
            outstanding.add_metric([s.url], s.outstanding)
            ejected.add_metric([s.url], 1.0 if s.ejected else 0.0)
            calls.add_metric([s.url], s.calls)
            failures.add_metric([s.url], s.failures)
        yield from (outstanding, ejected, calls, failures)
