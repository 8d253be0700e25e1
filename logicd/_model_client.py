"""The model-service client a logic server's ``model_service`` settings describe: one URL, a list of
replicas, or one URL whose host name DNS resolves to the replicas (``discovery: dns``)."""

from __future__ import annotations

from modelsvc.client import AsyncClient, RetryPolicy

from ._config import ModelServiceConfig

__all__ = ["model_client"]


def model_client(ms: ModelServiceConfig, retry: RetryPolicy) -> AsyncClient:
    """An ``AsyncClient`` for a remote model service (not ``embedded``: that one is built over its engine).

    One URL is the plain client; several, or ``discovery: dns``, balance over the replicas and fail over
    between them (``AsyncClient.replicas()`` shows their state)."""
    if ms.embedded:
        raise ValueError("model_client is for a remote model service; 'embedded' runs in this process")
    url: str | list[str] = ms.url if isinstance(ms.url, str) else list(ms.url)
    return AsyncClient(url, timeout=ms.timeout_s, retry=retry, discovery=ms.discovery)
