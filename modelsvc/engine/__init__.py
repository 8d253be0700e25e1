"""The engine: the model service without a socket. Every door binds to it; it imports no door.

A request comes in through a door (``modelsvc.server``'s HTTP and gRPC transports, embedded mode in the logic
server's process, a python model's BLS call) and goes to the one :class:`DataPlane`: its checks, the response
cache, the model version's scheduler, and back. The rest of the engine is what keeps models there to serve:

- ``_dataplane``: the data plane (health, metadata, statistics, ``infer`` and ``infer_stream``);
- the model lifecycle: ``_models`` (:class:`ModelManager`: load, reload without downtime, unload), ``_registry``
  (the model table), ``_version`` (a loaded version: its instances and scheduler), ``_loading`` (reading model
  folders), ``_control`` (polling the repository), ``_warmup`` (a config's ``model_warmup``);
- ``_ensemble``: the ensemble scheduler, whose steps go back through the data plane;
- ``_cache`` (the response cache), ``_spec`` (tensor specs), ``_stream_stats`` (decoupled response statistics);
- ``_errors``: error kinds to HTTP status, the table the HTTP door and embedded mode share;
- ``_trace``: what the engine asks of tracing (:class:`Tracing`, :class:`Trace`), implemented by
  ``modelsvc.server.observe``.
"""

from ._cache import CacheSettings, ResponseCache
from ._control import RepositoryPoller
from ._dataplane import DataPlane, DecoupledRefused
from ._errors import http_error
from ._models import ModelControlMode, ModelManager
from ._registry import ModelEntry
from ._spec import TensorSpec
from ._trace import Trace, Tracing
from ._version import ModelVersion

__all__ = [
    "CacheSettings",
    "DataPlane",
    "DecoupledRefused",
    "ModelControlMode",
    "ModelEntry",
    "ModelManager",
    "ModelVersion",
    "RepositoryPoller",
    "ResponseCache",
    "TensorSpec",
    "Trace",
    "Tracing",
    "http_error",
]
