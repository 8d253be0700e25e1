"""Domain errors of the v2 protocol, free of any transport.

    ModelsvcError                 base; ``kind`` says which
    ├── InvalidArgument           the request is malformed or disagrees with the model (HTTP 400, INVALID_ARGUMENT)
    ├── NotFound                  unknown model or version (HTTP 404, NOT_FOUND)
    ├── Unavailable               not ready, queue full, timeout expired, shutting down (HTTP 503, UNAVAILABLE)
    ├── Unsupported               a feature this server does not offer (HTTP 400, UNIMPLEMENTED)
    └── InternalError             a fault inside the server; its detail is logged, not sent (HTTP 500, INTERNAL)

The tables that map kinds to HTTP status and gRPC codes live with each transport.
"""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    UNSUPPORTED = "unsupported"
    INTERNAL = "internal"


class ModelsvcError(Exception):
    """Base of every error the data plane reports to a client."""

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(ModelsvcError):
    kind = ErrorKind.INVALID_ARGUMENT


class NotFound(ModelsvcError):
    kind = ErrorKind.NOT_FOUND


class Unavailable(ModelsvcError):
    kind = ErrorKind.UNAVAILABLE


class Unsupported(ModelsvcError):
    kind = ErrorKind.UNSUPPORTED


class InternalError(ModelsvcError):
    """Sent to clients as a fixed message; the detail stays in the server log."""

    kind = ErrorKind.INTERNAL
