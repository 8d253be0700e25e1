"""The model server: one data plane under the HTTP and gRPC transports, the model lifecycle, metrics, the runner."""

from ._dataplane import DataPlane
from ._http import InferEndpoint, Reply, create_http_app, infer_target
from ._httpserver import HttpServer
from ._metrics import Metrics
from ._models import ModelControlMode, ModelManager
from ._registry import ModelEntry
from ._restricted import ApiCategory, RestrictedApis
from ._serve import ServeOptions, create_metrics_app, serve
from ._spec import TensorSpec
from ._version import ModelVersion

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
