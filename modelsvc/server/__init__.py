"""The model server: one data plane under the HTTP transport (gRPC follows), metrics, and the runner."""

from ._dataplane import DataPlane
from ._http import InferEndpoint, Reply, create_http_app, infer_target
from ._httpserver import HttpServer
from ._metrics import Metrics
from ._models import ModelEntry, ModelManager, ModelVersion, TensorSpec
from ._serve import ServeOptions, create_metrics_app, serve

__all__ = [
    "DataPlane",
    "HttpServer",
    "InferEndpoint",
    "Metrics",
    "ModelEntry",
    "ModelManager",
    "ModelVersion",
    "Reply",
    "ServeOptions",
    "TensorSpec",
    "create_http_app",
    "create_metrics_app",
    "infer_target",
    "serve",
]
