"""Error kinds to HTTP status codes, as Triton maps them: the table the HTTP door and embedded mode share.

The gRPC door keeps its own table (``modelsvc.server.grpc._status``); the kinds are ``modelsvc.protocol``'s."""

from __future__ import annotations

from ..protocol import ErrorKind, ModelsvcError

HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.UNSUPPORTED: 400,
    ErrorKind.INTERNAL: 500,
    # what Triton's HTTP endpoint answers for the kinds with no HTTP status of their own
    ErrorKind.ALREADY_EXISTS: 400,
    ErrorKind.CANCELLED: 400,
    ErrorKind.UNKNOWN: 400,
}

INTERNAL_MESSAGE = "internal server error; see the server log"


def http_error(exc: BaseException) -> tuple[int, str]:
    """Status and client-facing message; unexpected errors never show their detail."""
    if isinstance(exc, ModelsvcError):
        return HTTP_STATUS[exc.kind], exc.message
    return 500, INTERNAL_MESSAGE
