"""The gRPC door: Triton's ``GRPCInferenceService``.

- ``_service``: the service (:class:`GrpcServer`) over the data plane, on grpcio or on the engine in ``h2/``;
- ``_calls``: gRPC calls on the HTTP/2 engine (metadata, ``grpc-timeout``, restricted protocols);
- ``_stream``: ``ModelStreamInfer``, decoupled models included;
- ``_codec`` and ``_wire``: protobuf messages to and from the protocol's types (``_wire`` without protobuf);
- ``_status``: modelsvc's error kinds to gRPC status codes;
- ``h2/``: the hand-written HTTP/2 engine (frames, streams, the connection, its bounds: ``H2Limits``), which a
  reader may skip.
"""

from ._service import DEFAULT_MAX_MESSAGE_BYTES, GrpcServer
from .h2._limits import H2Limits

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "GrpcServer", "H2Limits"]
