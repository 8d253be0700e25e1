"""Errors as HTTP answers: ``ServiceError`` (what a handler raises), and the status, detail and headers a
model-service failure maps to (``client_error_status``)."""

from __future__ import annotations

from http import HTTPStatus

from modelsvc.client import (
    ClientError,
    ConnectError,
    ConnectionLost,
    InvalidInput,
    ModelNotFound,
    PayloadTooLarge,
    ServerUnavailable,
    Timeout,
)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Client Error" if 400 <= status < 500 else "Error"


def problem(status: int, detail: str, *, title: str | None = None) -> dict[str, object]:
    """The RFC 9457 problem object (``type``, ``title``, ``status``, ``detail``) of an error answer."""
    return {"type": "about:blank", "title": title or _phrase(status), "status": status, "detail": detail}


class ServiceError(Exception):
    """Raise from a handler to answer with a problem+json of your choosing (4xx for the caller's mistakes)."""

    def __init__(self, status: int, detail: str, *, field: str | None = None, title: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.field = field
        self.title = title or _phrase(status)


def client_error_status(exc: ClientError) -> tuple[int, str, dict[str, str] | None]:
    if isinstance(exc, Timeout):
        return 504, "the model service did not answer in time", None
    if isinstance(exc, ServerUnavailable | ConnectError | ConnectionLost | ModelNotFound):
        return 503, f"the model service is unavailable: {exc.message}", {"Retry-After": "1"}
    if isinstance(exc, InvalidInput):
        return 422, f"the model refused the input: {exc.message}", None
    if isinstance(exc, PayloadTooLarge):
        return 413, "the request is too large for the model service", None
    return 502, "the model service failed", None
