"""Domain errors of the v2 protocol, free of any transport.

    ModelsvcError                 base; ``kind`` says which
    ├── InvalidArgument           the request is malformed or disagrees with the model (HTTP 400, INVALID_ARGUMENT)
    ├── NotFound                  unknown model or version (HTTP 404, NOT_FOUND)
    ├── Unavailable               not ready, queue full, timeout expired, shutting down (HTTP 503, UNAVAILABLE)
    ├── Unsupported               a feature this server does not offer (HTTP 400, UNIMPLEMENTED)
    ├── AlreadyExists             a model says what it was asked to make exists (HTTP 400, ALREADY_EXISTS)
    ├── Cancelled                 a model reports its request cancelled (HTTP 400, CANCELLED)
    ├── Unknown                   a model reports an error of unknown kind (HTTP 400, UNKNOWN)
    └── InternalError             a fault inside the server or a model (HTTP 500, INTERNAL)

Every message is written for the client (a model's own message, a model name; never a traceback): an exception
that is not a ModelsvcError is what the transports hide behind a fixed message, logging its detail. The three
kinds a python model can report beyond the usual ones map as Triton maps them.

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
    ALREADY_EXISTS = "already_exists"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


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
    """A fault inside the server or a model, with a message fit for the client."""

    kind = ErrorKind.INTERNAL


class AlreadyExists(ModelsvcError):
    kind = ErrorKind.ALREADY_EXISTS


class Cancelled(ModelsvcError):
    kind = ErrorKind.CANCELLED


class Unknown(ModelsvcError):
    kind = ErrorKind.UNKNOWN


#: the error class of each kind, to raise an error again with more context and the same kind
ERROR_TYPES: dict[ErrorKind, type[ModelsvcError]] = {
    cls.kind: cls
    for cls in (InvalidArgument, NotFound, Unavailable, Unsupported, InternalError, AlreadyExists, Cancelled, Unknown)
}
