"""The typed v2 client: sync and async over HTTP, one core without I/O, one exception tree.

from modelsvc.client import Client
with Client("localhost:8000") as client:
    model = client.model("identity")            # metadata read once; inputs checked locally
    out = model.infer(INPUT0=np.ones((1, 16), np.float32))["OUTPUT0"]

Bindings are pluggable: ``AsyncClient(binding=...)`` takes any ``AsyncTransport``, whose ``infer`` takes one
``InferCall`` and gives one ``InferReply``; ``InProcessTransport`` is the binding to a model service running in
this very process (the logic server's embedded mode).
"""

from ._client import AsyncClient, Client
from ._core import InferCall, InferReply, InferResult, ModelMetadata, TensorSpec
from ._deadline import current_deadline, deadline
from ._errors import (
    ClientError,
    ConnectError,
    ConnectionLost,
    InvalidInput,
    ModelNotFound,
    PayloadTooLarge,
    ProtocolError,
    QueueFull,
    ServerError,
    ServerUnavailable,
    Timeout,
)
from ._inprocess import InProcessTransport
from ._model import AsyncModel, Model
from ._replicas import ReplicaState
from ._retry import NO_RETRY, RetryBudget, RetryPolicy
from ._sequence import AsyncInferSequence, InferSequence, SequenceLost
from ._stream import ResponseStream, StreamError, StreamingUnsupported, SyncResponseStream
from ._transport import AsyncTransport, Transport

__all__ = [
    "NO_RETRY",
    "AsyncClient",
    "AsyncInferSequence",
    "AsyncModel",
    "AsyncTransport",
    "Client",
    "ClientError",
    "ConnectError",
    "ConnectionLost",
    "InProcessTransport",
    "InferCall",
    "InferReply",
    "InferResult",
    "InferSequence",
    "InvalidInput",
    "Model",
    "ModelMetadata",
    "ModelNotFound",
    "PayloadTooLarge",
    "ProtocolError",
    "QueueFull",
    "ReplicaState",
    "ResponseStream",
    "RetryBudget",
    "RetryPolicy",
    "SequenceLost",
    "ServerError",
    "ServerUnavailable",
    "StreamError",
    "StreamingUnsupported",
    "SyncResponseStream",
    "TensorSpec",
    "Timeout",
    "Transport",
    "current_deadline",
    "deadline",
]
