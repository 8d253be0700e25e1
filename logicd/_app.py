"""The app factory: a Service and its ServiceConfig become a production Litestar app.

What every service gets:
- its routes, with request bodies validated by Litestar (a field named in every 400) and shown in OpenAPI;
- ``/health/live``; ``/health/ready`` (200 only when the model service answers and every model the service
  uses is ready); ``/metrics`` (requests and latency per route, time per stage, model-call errors by kind,
  and in embedded mode the model service's own nv_* metrics);
- a SERVER span per request (the caller's W3C context continued) with a child per stage; model calls made
  through the Context nest under it, so one trace runs into the model service's queue and batch;
- problem+json errors (RFC 9457) with no tracebacks: the model service down or overloaded is 503 with
  Retry-After, too slow is 504, a model refusing an input is 422;
- a request body limit, and API-key or bearer auth on the service routes when configured.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Annotated, Any, cast

from litestar import Litestar, Request, Response, get, post
from litestar.datastructures import State
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException, ValidationException
from litestar.params import BodyKwarg
from opentelemetry import propagate, trace
from prometheus_client import generate_latest

from modelsvc.client import (
    AsyncClient,
    AsyncModel,
    ClientError,
    ModelNotFound,
    RetryPolicy,
    deadline,
)

from ._admission import SCOPE_DEADLINE, SCOPE_GATE, Admission, RouteGate
from ._auth import auth_guard
from ._config import ServiceConfig
from ._context import Context
from ._docs import close_unknown_fields, docs_handlers, openapi_config, problem_responses
from ._infer import Padding
from ._metrics import Metrics
from ._model_client import ReplicaCollector, model_client
from ._problems import ServiceError, client_error_status, problem
from ._service import Route, Service
from .text import Chunker, TokenizerPool, load_tokenizer

logger = logging.getLogger("logicd")
_tracer = trace.get_tracer("logicd")
PROBLEM = "application/problem+json"


def _version(version: int | None) -> str | None:
    return None if version is None else str(version)


class _Runtime:
    """What lives as long as the app: the client (or embedded engine), model handles, tokenizer, metrics."""

    def __init__(self, service: Service, config: ServiceConfig) -> None:
        self.service = service
        self.config = config
        self.metrics = Metrics()
        self.tracer = _tracer
        """The stages' tracer (this module's, read when the app is made)."""
        self.client: AsyncClient | None = None
        self.engine: Any = None
        self.models: dict[str, AsyncModel] = {}
        self.padding: dict[str, Padding | None] = {}
        """Each model's pad_inputs (None: it does not pad), read from its config with its metadata."""
        self.chunker: Chunker | None = None
        self.pool: TokenizerPool | None = None
        self.state: dict[str, Any] = {}
        window = config.chunking.max_tokens if config.tokenizer is not None else 1
        self.admission = Admission(config.admission, window, self.metrics.refusal, config.model_service.timeout_s)
        self._connected = False
        self._replicas: ReplicaCollector | None = None
        self._hooks_done = 0
        self._connecting = asyncio.Lock()

    async def start(self) -> None:
        ms = self.config.model_service
        retry = RetryPolicy(attempts=1 + ms.retries)
        if ms.embedded:
            from ._embedded import EmbeddedModelService

            assert ms.model_repository is not None
            self.engine = EmbeddedModelService(ms.model_repository)
            await self.engine.start()
            self.client = AsyncClient(binding=self.engine.binding(), timeout=ms.timeout_s, retry=retry)
        else:  # one URL, or replicas balanced by the client (a list, or discovery: dns)
            self.client = model_client(ms, retry)
            if self._replicas is None:
                self._replicas = ReplicaCollector(self.client)
                self.metrics.registry.register(self._replicas)
            self._replicas.client = self.client
        if self.config.tokenizer is not None:
            chunking = self.config.chunking
            tokenizer = load_tokenizer(self.config.tokenizer.path)
            self.chunker = Chunker(tokenizer, max_tokens=chunking.max_tokens, stride=chunking.stride)
            self.pool = TokenizerPool()
        try:
            await self.connect()
        except ClientError as exc:  # the model service may come up later: ready turns true when it does
            logger.warning("model service not reachable yet (%s); will retry on demand", exc)

    async def connect(self) -> None:
        """Read every model's metadata, then run the start-up hooks, once; safe to call again after a failure."""
        if self._connected:
            return
        async with self._connecting:
            if self._is_connected():  # another request connected while this one waited
                return
            assert self.client is not None
            models = {}
            configs = []
            for ref in self.config.models:
                models[ref.name] = await self.client.model(ref.name, _version(ref.version))
                configs.append(await self._config(ref.name, ref.version))
                self.padding[ref.name] = Padding.from_config(ref.name, configs[-1])
            self.admission.set_models(configs)
            # hooks that already succeeded are not run again; the models are published only when all have
            while self._hooks_done < len(self.service.startup):
                hook = self.service.startup[self._hooks_done]
                try:
                    await hook(Context(self, "startup", models))
                except Exception:
                    logger.exception("start-up hook %s failed; it runs again on the next attempt", hook.__name__)
                    raise
                self._hooks_done += 1
            self.models = models
            self._connected = True

    async def _config(self, name: str, version: int | None) -> dict[str, Any] | None:
        assert self.client is not None
        try:
            return await self.client.model_config(name, _version(version))
        except ModelNotFound:  # servers without the configuration extension (MLServer): a model that does not pad
            return None

    def _is_connected(self) -> bool:
        return self._connected

    @property
    def connected(self) -> bool:
        return self._connected

    async def ready(self) -> bool:
        if self.client is None:
            return False
        try:
            await self.connect()
        except ClientError:
            return False
        checks = [self.client.model_ready(m.name, _version(m.version)) for m in self.config.models]
        return all(await asyncio.gather(*checks))

    async def stop(self) -> None:
        try:
            if self.client is not None:
                await self.client.close()
        finally:
            if self.engine is not None:
                await self.engine.close()
            if self.pool is not None:
                await asyncio.to_thread(self.pool.shutdown)  # joins its threads: not on the loop


# -- errors as problem+json ----------------------------------------------------------------------------


def _problem(
    status: int,
    detail: str,
    request: Request[Any, Any, Any],
    *,
    headers: dict[str, str] | None = None,
    title: str | None = None,
    **extra: Any,
) -> Response[Any]:
    body = problem(status, detail, title=title)
    body["instance"] = request.url.path
    body.update({k: v for k, v in extra.items() if v is not None})
    return Response(body, status_code=status, media_type=PROBLEM, headers=headers)


def _on_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, UnicodeDecodeError | RecursionError) and _HANDLER_STARTED not in request.scope:
        # raised while Litestar decoded the body, before the handler ran: the caller's mistake
        why = "is not UTF-8" if isinstance(exc, UnicodeDecodeError) else "nests too deeply"
        return _problem(400, f"the request body {why}", request)
    if isinstance(exc, ServiceError):
        return _problem(exc.status, exc.detail, request, title=exc.title, field=exc.field)
    if isinstance(exc, ValidationException):
        return _problem(400, str(exc.detail), request, errors=exc.extra)
    if isinstance(exc, HTTPException):
        return _problem(exc.status_code, str(exc.detail), request, headers=exc.headers)
    if isinstance(exc, ClientError):
        status, detail, headers = client_error_status(exc)
        if status >= 502:
            logger.warning("model call failed on %s: %s", request.url.path, exc)
        return _problem(status, detail, request, headers=headers)
    logger.exception("unhandled error on %s", request.url.path)
    return _problem(500, "internal error; see the server log", request)


# -- the app ---------------------------------------------------------------------------------------------


_HANDLER_STARTED = "logicd.handler_started"
#: the status logged for a request whose caller left before the answer (nginx's convention)
CLIENT_CLOSED = 499


async def _caller_left(request: Request[Any, Any, Any]) -> None:
    """Return once the caller disconnects (the body is already read, so receive() waits for that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_caller_leaves(work: Awaitable[Any], request: Request[Any, Any, Any]) -> tuple[bool, Any]:
    """Run ``work``; cancel it (its model calls with it) if the caller disconnects first. (done, result)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_caller_left(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return False, None


async def _within_deadline(work: Awaitable[Any], request: Request[Any, Any, Any]) -> tuple[bool, Any]:
    """``_unless_caller_leaves`` under the caller's deadline, if it sent one: model calls carry the time left,
    and the handler is cancelled when it passes (504)."""
    at = cast("float | None", request.scope.get(SCOPE_DEADLINE))
    if at is None:
        return await _unless_caller_leaves(work, request)
    try:
        with deadline(at=at):
            async with asyncio.timeout(at - time.monotonic()):
                return await _unless_caller_leaves(work, request)
    except TimeoutError:
        raise ServiceError(504, "the request's deadline (Request-Timeout or grpc-timeout) passed") from None


def _route(route: Route, runtime: _Runtime, guard: Any) -> Any:
    async def endpoint(data: Any, request: Request[Any, Any, Any]) -> Any:
        request.scope[_HANDLER_STARTED] = True  # type: ignore[literal-required]
        start = time.perf_counter()
        status = 500
        context = propagate.extract(dict(request.headers))
        with _tracer.start_as_current_span(
            f"{route.method} {route.path}", context=context, kind=trace.SpanKind.SERVER
        ) as span:
            try:
                if not runtime.connected:  # the model service was away: try again now, 503 if still away
                    await runtime.connect()
                ctx = Context(runtime, route.path)
                done, result = await _within_deadline(route.handler(data, ctx), request)
                gate = cast("RouteGate | None", request.scope.get(SCOPE_GATE))
                if done and gate is not None:
                    gate.cost.observe(ctx.rows, ctx.tokens)
                if not done:  # nobody is waiting: the handler and its model calls were cancelled
                    status = CLIENT_CLOSED
                    return Response(b"", status_code=CLIENT_CLOSED)
                status = 200
                return result
            except ClientError as exc:
                status = client_error_status(exc)[0]
                runtime.metrics.model_errors.labels(route.path, type(exc).__name__).inc()
                span.record_exception(exc)
                raise
            except ServiceError as exc:
                status = exc.status
                raise
            finally:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(trace.Status(trace.StatusCode.ERROR))
                runtime.metrics.requests.labels(route.path, str(status)).inc()
                runtime.metrics.latency.labels(route.path).observe(time.perf_counter() - start)

    endpoint.__annotations__ = {
        "data": Annotated[route.request_type, BodyKwarg(media_type=RequestEncodingType.JSON)],
        "request": Request,
        "return": route.response_type,
    }
    endpoint.__name__ = endpoint.__qualname__ = route.name
    return post(
        route.path,
        summary=route.summary,
        status_code=200,
        operation_id=route.name,
        guards=[guard] if guard else None,
        middleware=[runtime.admission.middleware(route.path)],
        responses=problem_responses(auth=guard is not None),
    )(endpoint)


def create_app(service: Service, config: ServiceConfig) -> Litestar:
    """The Litestar app for ``service`` under ``config``; start-up connects to the model service (or starts
    the embedded engine) and shutdown closes it."""
    runtime = _Runtime(service, config)

    @get("/health/live", include_in_schema=False, sync_to_thread=False)
    def live() -> dict[str, str]:
        return {"status": "live"}

    @get("/health/ready", include_in_schema=False)
    async def ready() -> Response[dict[str, str]]:
        ok = await runtime.ready()
        return Response({"status": "ready" if ok else "not ready"}, status_code=200 if ok else 503)

    @get("/metrics", include_in_schema=False)
    async def metrics() -> Response[bytes]:
        runtime.metrics.gates(list(runtime.admission.gates.values()))
        text = generate_latest(runtime.metrics.registry)
        if runtime.engine is not None:
            text += runtime.engine.metrics.render()
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    guard = auth_guard(config)
    handlers: list[Any] = [live, ready, metrics, *(_route(r, runtime, guard) for r in service.routes)]
    handlers += docs_handlers(title=config.name)  # /docs: Swagger UI served by the app itself, no CDN
    request_types = [route.request_type for route in service.routes]
    return Litestar(
        route_handlers=handlers,
        on_startup=[runtime.start, lambda app: close_unknown_fields(app, request_types)],
        on_shutdown=[runtime.stop],
        exception_handlers={Exception: _on_error},
        request_max_body_size=config.limits.max_body_bytes,
        openapi_config=openapi_config(config.name, "1"),
        logging_config=None,
        debug=False,
        state=State({"logicd": runtime}),
    )
