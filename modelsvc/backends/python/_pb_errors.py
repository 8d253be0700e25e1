"""pb_utils errors: ``TritonError`` (fails one request), ``TritonModelException`` (raised by a model or by
pb_utils), and the two tables between Triton's error codes and the server's error kinds."""

from __future__ import annotations

from modelsvc.protocol import (
    AlreadyExists,
    Cancelled,
    ErrorKind,
    InternalError,
    InvalidArgument,
    ModelsvcError,
    NotFound,
    Unavailable,
    Unknown,
    Unsupported,
)


class TritonError:
    """An error that fails one request (``InferenceResponse(error=...)``) or that a BLS response carries.

    ``code`` is one of the class constants; INTERNAL when not given.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    __slots__ = ("_code", "_message")

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by a model (or by this module) to fail what it was doing, with a message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message


_ERROR_FOR_CODE: dict[int, type[ModelsvcError]] = {
    TritonError.INVALID_ARG: InvalidArgument,
    TritonError.ALREADY_EXISTS: AlreadyExists,
    TritonError.NOT_FOUND: NotFound,
    TritonError.UNAVAILABLE: Unavailable,
    TritonError.CANCELLED: Cancelled,
    TritonError.UNSUPPORTED: Unsupported,
    TritonError.UNKNOWN: Unknown,
}

_CODE_FOR_KIND: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: TritonError.INVALID_ARG,
    ErrorKind.NOT_FOUND: TritonError.NOT_FOUND,
    ErrorKind.UNAVAILABLE: TritonError.UNAVAILABLE,
    ErrorKind.UNSUPPORTED: TritonError.UNSUPPORTED,
    ErrorKind.INTERNAL: TritonError.INTERNAL,
    ErrorKind.ALREADY_EXISTS: TritonError.ALREADY_EXISTS,
    ErrorKind.CANCELLED: TritonError.CANCELLED,
    ErrorKind.UNKNOWN: TritonError.UNKNOWN,
}


def _error_from_triton(error: TritonError) -> ModelsvcError:
    """The server error a response's TritonError fails its request with (INTERNAL and UNKNOWN: InternalError).

    The message goes to the client as the model wrote it, as Triton sends it."""
    return _ERROR_FOR_CODE.get(error.code(), InternalError)(str(error.message()))


def _triton_from_error(exc: ModelsvcError) -> TritonError:
    return TritonError(exc.message, _CODE_FOR_KIND.get(exc.kind, TritonError.INTERNAL))
