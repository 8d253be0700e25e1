"""The HTTP door: v2 over HTTP/1.1.

- ``_endpoint``: the inference endpoint (:class:`InferEndpoint`: decode, call the data plane, encode) and the
  Litestar app that answers every other route (:func:`create_http_app`);
- ``_server``: the httptools server (:class:`HttpServer`) that answers infer requests itself and hands the other
  routes to the app through ``_asgi``, a buffering ASGI bridge.
"""

from ._endpoint import InferEndpoint, Reply, create_http_app, infer_target
from ._server import HttpServer

__all__ = ["HttpServer", "InferEndpoint", "Reply", "create_http_app", "infer_target"]
