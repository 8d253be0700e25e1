"""The model server: the doors onto the engine (``modelsvc.engine``) and the process that runs them.

- ``_serve``: ``modelsvc serve``, the process: the engine, its doors, metrics and tracing, shutdown (``_options``: what
  it takes);
- ``ingest/``: ingest worker processes (``--workers``): the doors in N processes, the engine in this one;
- ``_restricted``: restricted endpoints (``--http-restricted-api``, ``--grpc-restricted-protocol``);
- ``http/``: the HTTP door: the inference endpoint, the httptools server, and the Litestar app for the other routes;
- ``grpc/``: the gRPC door: the service, streams, codec and status codes; ``grpc/h2/`` the HTTP/2 engine;
- ``observe/``: Prometheus metrics, system and GPU (NVML) metrics, OpenTelemetry tracing.

The engine's names are re-exported here for code written against this package before the engine had its own.
"""

from ..engine import DataPlane, ModelControlMode, ModelEntry, ModelManager, ModelVersion, TensorSpec
from ._options import ServeOptions
from ._restricted import ApiCategory, RestrictedApis
from ._serve import create_metrics_app, serve
from .http import HttpServer, InferEndpoint, Reply, create_http_app, infer_target
from .observe import Metrics

__all__ = [
    "ApiCategory",
    "DataPlane",
    "HttpServer",
    "InferEndpoint",
    "Metrics",
    "ModelControlMode",
    "ModelEntry",
    "ModelManager",
    "ModelVersion",
    "Reply",
    "RestrictedApis",
    "ServeOptions",
    "TensorSpec",
    "create_http_app",
    "create_metrics_app",
    "infer_target",
    "serve",
]
