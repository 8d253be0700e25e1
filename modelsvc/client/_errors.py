"""The client's exceptions: one tree, mapped from HTTP status, gRPC code and the model service's own error kinds
(in-process) in one place.

ClientError                  base: ``message``, ``status`` (HTTP) and ``code`` (gRPC) when a server answered
├── InvalidInput             refused before sending (names, datatypes, shapes), or by the server:
│                            400, 422 (MLServer's request validation), INVALID_ARGUMENT
├── ModelNotFound            unknown model or version: 404, NOT_FOUND
├── ServerUnavailable        not ready, shutting down: 503, UNAVAILABLE              (retried)
│   └── QueueFull            the model's queue is full or its queue timeout expired  (retried, within the budget)
├── PayloadTooLarge          the request body is over the server's limit: 413, RESOURCE_EXHAUSTED "larger than max"
├── ServerError              the server failed: 500 and other 5xx, INTERNAL
├── Timeout                  no answer within the call's timeout
├── ConnectError             could not connect: nothing was sent                     (retried)
├── ConnectionLost           the connection broke after the request went out, so the server may have
│                            run it                                                  (not retried)
└── ProtocolError            the answer could not be understood
"""

from __future__ import annotations

from ..protocol import ErrorKind, ModelsvcError


class ClientError(Exception):
    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self) -> str:
        where = f"[{self.status}] " if self.status is not None else f"[{self.code}] " if self.code else ""
        return f"{where}{self.message}"


class InvalidInput(ClientError):
    pass


class ModelNotFound(ClientError):
    pass


class ServerUnavailable(ClientError):
    pass


class QueueFull(ServerUnavailable):
    pass


class PayloadTooLarge(ClientError):
    pass


class ServerError(ClientError):
    pass


class Timeout(ClientError):
    pass


class ConnectError(ClientError):
    pass


class ConnectionLost(ClientError):
    pass


class ProtocolError(ClientError):
    pass


_QUEUE_WORDS = ("queue size", "timeout expired")


def _queue_refused(message: str) -> bool:
    """Whether an "unavailable" answer says the model's queue refused the request (full, or its timeout expired)."""
    lowered = message.lower()
    return any(w in lowered for w in _QUEUE_WORDS)


def error_from_http(status: int, message: str) -> ClientError:
    """The exception for an HTTP error answer (Triton's status mapping)."""
    if status in (400, 422):
        return InvalidInput(message, status=status)
    if status == 404:
        return ModelNotFound(message, status=status)
    if status == 413:
        return PayloadTooLarge(message, status=status)
    if status in (429, 503):
        kind = QueueFull if status == 429 or _queue_refused(message) else ServerUnavailable
        return kind(message, status=status)
    if status >= 500:
        return ServerError(message, status=status)
    return ProtocolError(f"unexpected HTTP status {status}: {message}", status=status)


def error_from_grpc(code: str, message: str) -> ClientError:
    """The exception for a gRPC status code name (``INVALID_ARGUMENT``, ...)."""
    if code == "INVALID_ARGUMENT":
        return InvalidInput(message, code=code)
    if code == "NOT_FOUND":
        return ModelNotFound(message, code=code)
    if code == "RESOURCE_EXHAUSTED" and "larger than max" in message.lower():
        return PayloadTooLarge(message, code=code)
    if code in ("UNAVAILABLE", "RESOURCE_EXHAUSTED"):
        full = (code == "RESOURCE_EXHAUSTED" and "message" not in message.lower()) or _queue_refused(message)
        return (QueueFull if full else ServerUnavailable)(message, code=code)
    if code == "DEADLINE_EXCEEDED":
        return Timeout(message, code=code)
    return ServerError(message, code=code)


#: Each error kind of the model service as the client's exception for it, with the HTTP status the model service
#: answers that kind with (Triton's): an in-process call fails as the same call over HTTP does, ``status`` included.
_KIND_ERRORS: dict[ErrorKind, tuple[type[ClientError], int]] = {
    ErrorKind.INVALID_ARGUMENT: (InvalidInput, 400),
    ErrorKind.NOT_FOUND: (ModelNotFound, 404),
    ErrorKind.UNAVAILABLE: (ServerUnavailable, 503),  # QueueFull when the queue refused the request
    ErrorKind.UNSUPPORTED: (InvalidInput, 400),
    ErrorKind.INTERNAL: (ServerError, 500),
    ErrorKind.ALREADY_EXISTS: (InvalidInput, 400),
    ErrorKind.CANCELLED: (InvalidInput, 400),
    ErrorKind.UNKNOWN: (InvalidInput, 400),
}


def error_from_kind(error: ModelsvcError) -> ClientError:
    """The exception for the model service's own error, raised in this process (the in-process binding)."""
    kind, status = _KIND_ERRORS[error.kind]
    if kind is ServerUnavailable and _queue_refused(error.message):
        kind = QueueFull
    return kind(error.message, status=status)
