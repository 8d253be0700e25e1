"""Restricted APIs, as tritonserver's ``--http-restricted-api`` and ``--grpc-restricted-protocol`` flags set them.

Each flag value names API categories and the header that opens them::

    --http-restricted-api model-repository,statistics:admin-key=s3cret
    --grpc-restricted-protocol model-repository,statistics:admin-key=s3cret

A request to a restricted category without that header, or with another value, is refused before it reaches
the data plane. HTTP answers 403 ``{"error": "This API is restricted, expecting header 'admin-key'"}``; gRPC
answers UNAVAILABLE, and its header (metadata key) is the key with Triton's prefix:
``triton-grpc-protocol-admin-key``. The categories are Triton's: health (server live and ready, model ready),
metadata (server and model metadata), inference, shared-memory, model-config, model-repository (index, load,
unload), statistics, trace and logging. A category can be named in one group only. The check lives here
once; each transport asks :meth:`RestrictedApis.denied` and answers in its own way.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio


class ApiCategory(enum.Enum):
    """The groups of endpoints a restriction applies to (Triton's names)."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"


GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
"""What Triton puts before a gRPC restriction's key to make the metadata key the client must send."""


class RestrictionError(ValueError):
    """A restriction flag that cannot be used; the message says which part is wrong."""


@dataclass(frozen=True, slots=True)
class Restriction:
    """The header (lower case) that opens a category, and the value it must have."""

    header: str
    value: str


class RestrictedApis:
    """Which categories need which header; empty: nothing is restricted.

    ``message`` is the error text with ``{header}`` in it: Triton says "API" for HTTP and "protocol" for gRPC.
    """

    __slots__ = ("_groups", "_message")

    def __init__(
        self,
        groups: Mapping[ApiCategory, Restriction] | None = None,
        *,
        message: str = "This API is restricted, expecting header '{header}'",
    ) -> None:
        self._groups = dict(groups or {})
        self._message = message

    @classmethod
    def parse_http(cls, values: Sequence[str]) -> RestrictedApis:
        """From ``--http-restricted-api`` values; RestrictionError names the flag's fault."""
        return cls(_parse(values, "api", ""))

    @classmethod
    def parse_grpc(cls, values: Sequence[str]) -> RestrictedApis:
        """From ``--grpc-restricted-protocol`` values (headers get the ``triton-grpc-protocol-`` prefix)."""
        return cls(
            _parse(values, "protocol", GRPC_HEADER_PREFIX),
            message="This protocol is restricted, expecting header '{header}'",
        )

    def __bool__(self) -> bool:
        return bool(self._groups)

    def restricts(self, category: ApiCategory) -> bool:
        return category in self._groups

    def denied(self, category: ApiCategory, headers: Iterable[tuple[str | bytes, str | bytes]]) -> str | None:
        """The error message when a request to ``category`` lacks its header; None when it may go on.

        ``headers``: the request's (name, value) pairs, as text or bytes; names compare without case.
        """
        rule = self._groups.get(category)
        if rule is None:
            return None
        for name, value in headers:
            text = name.decode("latin-1") if isinstance(name, bytes) else name
            if text.lower() == rule.header:
                given = value if isinstance(value, bytes) else value.encode("latin-1", "replace")
                if hmac.compare_digest(given, rule.value.encode("latin-1", "replace")):
                    return None
        return self._message.format(header=rule.header)


def _parse(values: Sequence[str], noun: str, prefix: str) -> dict[ApiCategory, Restriction]:
    groups: dict[ApiCategory, Restriction] = {}
    known = {c.value: c for c in ApiCategory}
    for raw in values:
        names, colon, setting = raw.partition(":")
        key, equals, value = setting.partition("=")
        if not colon or not names or not equals or not key.strip():
            raise RestrictionError(
                f"restricted {noun} setting '{raw}' must read <{noun}>[,<{noun}>...]:<header>=<value>"
            )
        for name in (n.strip() for n in names.split(",")):
            category = known.get(name)
            if category is None:
                listed = ", ".join(known)
                raise RestrictionError(f"unknown restricted {noun} '{name}' (known: {listed})")
            if category in groups:
                raise RestrictionError(f"{noun} '{name}' can not be specified in multiple config groups")
            groups[category] = Restriction(prefix + key.strip().lower(), value)
    return groups


# -- HTTP: which category a path belongs to -------------------------------------------------------------------


def http_category(path: str) -> ApiCategory | None:
    """The category of a v2 HTTP path; None for paths outside the v2 API (they get 404 anyway)."""
    if path in ("/v2", "/v2/"):
        return ApiCategory.METADATA
    if path.startswith("/v2/health/"):
        return ApiCategory.HEALTH
    if path.startswith("/v2/repository/"):
        return ApiCategory.MODEL_REPOSITORY
    if path.startswith(("/v2/systemsharedmemory", "/v2/cudasharedmemory")):
        return ApiCategory.SHARED_MEMORY
    if path.startswith("/v2/trace/") or path.endswith("/trace/setting"):
        return ApiCategory.TRACE
    if path.startswith("/v2/logging"):
        return ApiCategory.LOGGING
    if path.startswith("/v2/models/"):
        return _model_path_category(path[len("/v2/models/") :].strip("/").split("/"))
    return None


_MODEL_SUFFIXES = {
    "ready": ApiCategory.HEALTH,
    "config": ApiCategory.MODEL_CONFIG,
    "infer": ApiCategory.INFERENCE,
    "generate": ApiCategory.INFERENCE,
    "generate_stream": ApiCategory.INFERENCE,
    "stats": ApiCategory.STATISTICS,
    "trace": ApiCategory.TRACE,
}


def _model_path_category(segments: list[str]) -> ApiCategory:
    """``{model}[/versions/{v}][/{suffix}...]``, read as the routes read it: the first segment is the model's
    name whatever it is (a model may be called ``infer`` or ``ready``), then an optional version, then what
    is asked of it; ``/v2/models/stats`` alone is the statistics of every model."""
    if segments == ["stats"]:
        return ApiCategory.STATISTICS
    rest = segments[1:]
    if len(rest) >= 2 and rest[0] == "versions":
        rest = rest[2:]
    if not rest:
        return ApiCategory.METADATA
    return _MODEL_SUFFIXES.get(rest[0], ApiCategory.METADATA)


# -- gRPC: an interceptor over the whole service ------------------------------------------------------------

GRPC_CATEGORIES: dict[str, ApiCategory] = {
    "ServerLive": ApiCategory.HEALTH,
    "ServerReady": ApiCategory.HEALTH,
    "ModelReady": ApiCategory.HEALTH,
    "ServerMetadata": ApiCategory.METADATA,
    "ModelMetadata": ApiCategory.METADATA,
    "ModelInfer": ApiCategory.INFERENCE,
    "ModelStreamInfer": ApiCategory.INFERENCE,
    "ModelConfig": ApiCategory.MODEL_CONFIG,
    "ModelStatistics": ApiCategory.STATISTICS,
    "RepositoryIndex": ApiCategory.MODEL_REPOSITORY,
    "RepositoryModelLoad": ApiCategory.MODEL_REPOSITORY,
    "RepositoryModelUnload": ApiCategory.MODEL_REPOSITORY,
    "SystemSharedMemoryStatus": ApiCategory.SHARED_MEMORY,
    "SystemSharedMemoryRegister": ApiCategory.SHARED_MEMORY,
    "SystemSharedMemoryUnregister": ApiCategory.SHARED_MEMORY,
    "CudaSharedMemoryStatus": ApiCategory.SHARED_MEMORY,
    "CudaSharedMemoryRegister": ApiCategory.SHARED_MEMORY,
    "CudaSharedMemoryUnregister": ApiCategory.SHARED_MEMORY,
    "TraceSetting": ApiCategory.TRACE,
    "LogSettings": ApiCategory.LOGGING,
}
"""``inference.GRPCInferenceService`` method -> category."""


class RestrictionInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls to restricted categories that lack their metadata, with UNAVAILABLE as Triton does.

    Pass it to ``grpc.aio.server(interceptors=[...])``; a call that may go on reaches its handler untouched.
    """

    def __init__(self, restricted: RestrictedApis) -> None:
        self.restricted = restricted

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        category = GRPC_CATEGORIES.get(str(details.method).rsplit("/", 1)[-1])
        if handler is None or category is None or not self.restricted.restricts(category):
            return handler
        message = self.restricted.denied(category, details.invocation_metadata or ())
        if message is None:
            return handler
        return _refusing(handler, message)


def _refusing(handler: Any, message: str) -> Any:
    """A handler of the same shape as ``handler`` that answers every call with UNAVAILABLE and ``message``."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    codec = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse, **codec)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, **codec)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, **codec)
    return grpc.stream_stream_rpc_method_handler(refuse, **codec)
