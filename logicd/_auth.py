"""API-key or bearer-token auth on a service's routes (health, metrics and docs stay open)."""

import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler

from ._config import ServiceConfig


def auth_guard(config: ServiceConfig) -> Any:
    auth = config.auth
    if auth.mode == "none":
        return None
    secrets = [s.encode() for s in (auth.api_keys if auth.mode == "api_key" else auth.tokens)]

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        if auth.mode == "api_key":
            given = connection.headers.get("x-api-key", "")
        else:
            header = connection.headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else ""
        if not given or not any(hmac.compare_digest(given.encode(), s) for s in secrets):
            raise NotAuthorizedException(
                detail="an API key is needed (X-API-Key)" if auth.mode == "api_key" else "a bearer token is needed",
                headers={"WWW-Authenticate": "Bearer"} if auth.mode == "bearer" else None,
            )

    return guard
