"""``triton_python_backend_utils`` for modelsvc: what a Triton python model imports as ``pb_utils``.

A ``model.py`` written for Triton's python backend starts with ``import triton_python_backend_utils as
pb_utils``. The python backend registers this module under that name in ``sys.modules`` when it loads;
to unit-test a ``model.py`` without a server, call :func:`install` first (or import this module as
``modelsvc.backends.python_utils`` and hand it to the model yourself).

What is here, with Triton's names and behaviour:

- ``Tensor`` (``as_numpy``, ``name``, ``shape``, ``triton_dtype``, ``is_cpu``, ``to_dlpack``,
  ``from_dlpack``, ``__dlpack__``); BYTES tensors are numpy object arrays of ``bytes``.
- ``InferenceRequest``: the requests ``execute`` receives (``inputs``, ``request_id``,
  ``correlation_id``, ``flags``, ``parameters`` as a JSON string, ``requested_output_names``) and the
  requests a model makes of other models (Business Logic Scripting): ``exec()`` and ``async_exec()``.
- ``InferenceResponse``, ``TritonError`` (with its codes), ``TritonModelException``, ``Logger``,
  ``ModelConfig`` (for ``auto_complete_config``), the ``get_*_by_name`` helpers, the type tables and
  ``TRITONSERVER_*`` constants, ``is_model_ready``, ``load_model`` and ``unload_model``.

BLS requests go in-process to the server's data plane (see ``_inprocess``): the target model's checks,
scheduler, batcher and statistics apply, as for a request over HTTP, without a network hop. A BLS
request that fails (unknown model, bad input, full queue) answers with a response whose ``has_error()``
is true, as in Triton; it does not raise.

Decoupled models (``model_transaction_policy { decoupled: true }``): ``request.get_response_sender()``
gives an ``InferenceResponseSender`` (``send(response, flags)``, ``is_cancelled()``; see ``_pb_sender``).

BLS requests to decoupled models: ``exec(decoupled=True)`` iterates their responses (see ``_pb_bls_stream``).

Not supported, refused with a clear error: request rescheduling. Custom metrics
(``MetricFamily``) count in the process but are not exported on ``/metrics``.

Where the code lives, in ``modelsvc/backends/python/``: ``_pb_tensor`` (tensors, type tables), ``_pb_errors``,
``_pb_response`` (responses, flags), ``_pb_request`` (requests), ``_pb_bls`` (BLS and the model API calls to the
server), ``_pb_config`` (``ModelConfig``, config readers) and ``_pb_logging`` (``Logger``, metrics). This module is
the one face.
"""

from __future__ import annotations

import sys

from .python._pb_bls import is_model_ready, load_model, unload_model
from .python._pb_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from .python._pb_errors import TritonError, TritonModelException
from .python._pb_errors import _error_from_triton as _error_from_triton  # the server's error for a TritonError
from .python._pb_errors import _triton_from_error as _triton_from_error  # and back
from .python._pb_logging import Logger, Metric, MetricFamily
from .python._pb_logging import logger as logger  # the models' logger, modelsvc.python_model
from .python._pb_request import InferenceRequest, get_input_tensor_by_name
from .python._pb_response import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceResponse,
    InferenceTrace,
    PreferredMemory,
    get_output_tensor_by_name,
)
from .python._pb_sender import InferenceResponseSender
from .python._pb_tensor import (
    TRITON_STRING_TO_NUMPY,
    Tensor,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

MODULE_NAME = "triton_python_backend_utils"
"""The name Triton's python models import this module by."""


def install() -> None:
    """Make this module importable as ``triton_python_backend_utils``, as Triton's python models import it."""
    sys.modules[MODULE_NAME] = sys.modules[__name__]


__all__ = [
    "MODULE_NAME",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "install",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
