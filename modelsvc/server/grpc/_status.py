"""gRPC status codes and the shared ends of a call: the codes for modelsvc's errors (Triton's meaning), aborting a
call with one, closing a call's span. Used by the service (``_service``) and its streams (``_stream``)."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import grpc
import grpc.aio

from ...engine import Trace, http_error
from ...engine._errors import INTERNAL_MESSAGE
from ...protocol import ErrorKind, ModelsvcError

logger = logging.getLogger("modelsvc.grpc")

Context = grpc.aio.ServicerContext[Any, Any]

GRPC_STATUS: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorKind.UNKNOWN: grpc.StatusCode.UNKNOWN,
}

SHUTTING_DOWN = "the server is shutting down"


def _code(exc: BaseException) -> grpc.StatusCode:
    return GRPC_STATUS[exc.kind] if isinstance(exc, ModelsvcError) else grpc.StatusCode.INTERNAL


def grpc_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """Code and client-facing message; an unexpected exception is logged and shows nothing of itself."""
    if isinstance(exc, ModelsvcError):  # its message is written for the client, as over HTTP
        if exc.kind is ErrorKind.INTERNAL:
            logger.error("internal error: %s", exc.message)
        return GRPC_STATUS[exc.kind], exc.message
    logger.error("unexpected error answering a gRPC request", exc_info=exc)
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE


async def _abort(context: Context, exc: BaseException) -> NoReturn:
    code, message = grpc_status(exc)
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


def _end_trace(trace: Trace, error: BaseException | None, code: grpc.StatusCode) -> None:
    """Close a request's span: the HTTP status the same outcome would have had, and the gRPC code."""
    trace.set_attribute("rpc.system", "grpc")
    trace.set_attribute("rpc.grpc.status_code", code.value[0])
    if error is None:
        trace.end(200, None)
    elif isinstance(error, Exception):
        trace.end(http_error(error)[0], error)
    else:  # the caller went away
        trace.end(499, error)
