"""The service definition API: what a team writes.

    from msgspec import Struct
    from logicd import Context, Service

    class Request(Struct):
        texts: list[str]

    class Answer(Struct):
        labels: list[str]

    service = Service()

    @service.post("/v1/classify")
    async def classify(request: Request, ctx: Context) -> Answer:
        async with ctx.stage("preprocess"):
            chunks = await ctx.chunk(request.texts)
        async with ctx.stage("model"):
            logits = await ctx.infer_chunks("classifier", chunks, "logits")
        ...

A handler takes the request body (a msgspec Struct or dataclass, validated by Litestar and shown in the
OpenAPI schema) and a Context, and returns the response model. ``@service.on_startup`` functions run once,
with a Context, after the models are reachable (to embed label descriptions, say).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from ._config import ServiceConfig

Handler = Callable[..., Awaitable[Any]]
Startup = Callable[..., Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    request_type: Any
    response_type: Any
    summary: str
    name: str


@dataclass
class Service:
    """Routes and start-up hooks of one service; ``create_app`` turns it into a Litestar app."""

    routes: list[Route] = field(default_factory=list)
    startup: list[Startup] = field(default_factory=list)

    def post(self, path: str, *, summary: str | None = None) -> Callable[[Handler], Handler]:
        """Register ``async def handler(request: Model, ctx: Context) -> Response`` for POST ``path``."""

        def register(handler: Handler) -> Handler:
            if not inspect.iscoroutinefunction(handler):
                raise TypeError(f"{handler.__qualname__} must be an async function")
            hints = get_type_hints(handler)
            params = list(inspect.signature(handler).parameters)
            if len(params) != 2:
                raise TypeError(f"{handler.__qualname__} must take (request, ctx), got {params}")
            request_type = hints.get(params[0])
            if request_type is None or "return" not in hints:
                raise TypeError(f"{handler.__qualname__} needs type hints for its request and its return value")
            doc = inspect.getdoc(handler) or ""
            self.routes.append(
                Route(
                    "POST",
                    path,
                    handler,
                    request_type,
                    hints["return"],
                    summary or (doc.splitlines()[0] if doc else handler.__name__),
                    handler.__name__,
                )
            )
            return handler

        return register

    def on_startup(self, hook: Startup) -> Startup:
        """Run ``async def hook(ctx: Context) -> None`` once at start, after the models are reachable."""
        self.startup.append(hook)
        return hook


def load_service(config: ServiceConfig, service_dir: Path) -> Service:
    """Import ``config.service`` (``package.module:attribute``) with ``service_dir`` first on sys.path."""
    module_name, _, attribute = config.service.partition(":")
    folder = str(service_dir.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"service: cannot import {module_name!r} (from {folder}): {exc}") from exc
    service = getattr(module, attribute or "service", None)
    if not isinstance(service, Service):
        raise TypeError(f"service: {config.service!r} is {type(service).__name__}, expected a logicd.Service")
    return service
