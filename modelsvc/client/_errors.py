"""The client's exceptions: one tree, mapped from HTTP status and gRPC code in one place.

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


def error_from_http(status: int, message: str) -> ClientError:
    """The exception for an HTTP error answer (Triton's status mapping)."""
    if status in (400, 422):
        return InvalidInput(message, status=status)
    if status == 404:
        return ModelNotFound(message, status=status)
    if status == 413:
        return PayloadTooLarge(message, status=status)
    if status in (429, 503):
        lowered = message.lower()
        kind = QueueFull if status == 429 or any(w in lowered for w in _QUEUE_WORDS) else ServerUnavailable
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
        lowered = message.lower()
        full = (code == "RESOURCE_EXHAUSTED" and "message" not in lowered) or any(w in lowered for w in _QUEUE_WORDS)
        return (QueueFull if full else ServerUnavailable)(message, code=code)
    if code == "DEADLINE_EXCEEDED":
        return Timeout(message, code=code)
    return ServerError(message, code=code)
