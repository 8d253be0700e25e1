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
from collections.abc import AsyncIterator, Awaitable, Sequence
from http import HTTPStatus
from typing import Annotated, Any, cast

import numpy as np
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
    ConnectError,
    ConnectionLost,
    InvalidInput,
    ModelNotFound,
    PayloadTooLarge,
    RetryPolicy,
    ServerUnavailable,
    Timeout,
    deadline,
)

from ._admission import SCOPE_DEADLINE, SCOPE_GATE, Admission, RouteGate
from ._auth import auth_guard
from ._config import ServiceConfig
from ._docs import close_unknown_fields, docs_handlers, openapi_config, problem_responses
from ._infer import Padding, infer_chunks
from ._metrics import Metrics
from ._model_client import ReplicaCollector, model_client
from ._service import Route, Service
from .text import Chunker, Chunks, TokenizerPool, load_tokenizer

logger = logging.getLogger("logicd")
_tracer = trace.get_tracer("logicd")
PROBLEM = "application/problem+json"


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Client Error" if 400 <= status < 500 else "Error"


class ServiceError(Exception):
    """Raise from a handler to answer with a problem+json of your choosing (4xx for the caller's mistakes)."""

    def __init__(self, status: int, detail: str, *, field: str | None = None, title: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.field = field
        self.title = title or _phrase(status)


def _version(version: int | None) -> str | None:
    return None if version is None else str(version)


class _Runtime:
    """What lives as long as the app: the client (or embedded engine), model handles, tokenizer, metrics."""

    def __init__(self, service: Service, config: ServiceConfig) -> None:
        self.service = service
        self.config = config
        self.metrics = Metrics()
        self.client: AsyncClient | None = None
        self.engine: Any = None
        self.models: dict[str, AsyncModel] = {}
        self.padding: dict[str, Padding | None] = {}
        """Each model's pad_inputs (None: it does not pad), read from its config with its metadata."""
        self.chunker: Chunker | None = None
        self.pool: TokenizerPool | None = None
        self.state: dict[str, Any] = {}
        window = config.chunking.max_tokens if config.tokenizer is not None else 1
        self.admission = Admission(config.admission, window, self.metrics.refusal)
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


class Context:
    """What a handler works with: the config, the models, the tokenizer, timed stages, shared state."""

    def __init__(self, runtime: _Runtime, route: str, models: dict[str, AsyncModel] | None = None) -> None:
        self._runtime = runtime
        self.route = route
        self._models = models if models is not None else runtime.models
        self.timings: dict[str, float] = {}
        """Seconds spent in each `stage` of this request so far (a stage entered twice adds up)."""
        self.rows = 0
        self.tokens = 0
        """Windows and tokens this request sent through `infer_chunks` (what admission learns a request costs)."""

    @property
    def config(self) -> ServiceConfig:
        return self._runtime.config

    @property
    def state(self) -> dict[str, Any]:
        """Shared by every request (fill it in an on_startup hook)."""
        return self._runtime.state

    def model(self, name: str) -> AsyncModel:
        """The checked handle of a model listed in service.yaml."""
        handle = self._models.get(name)
        if handle is None:
            if name not in {m.name for m in self.config.models}:
                raise KeyError(f"model {name!r} is not listed under models in service.yaml")
            raise ServerUnavailable(f"model {name!r} is not reachable yet")
        return handle

    @property
    def chunker(self) -> Chunker:
        if self._runtime.chunker is None:
            raise RuntimeError("no tokenizer: set tokenizer.path in service.yaml")
        return self._runtime.chunker

    async def chunk(self, texts: Sequence[str], field: str = "texts") -> Chunks:
        """Tokenize and cut into windows off the event loop (a long document never stalls other requests).

        Refuses with 422 naming ``field[i]`` a text with no token the model reads (only whitespace, control or
        format characters), and a request cut into more than ``limits.max_chunks`` windows."""
        pool = self._runtime.pool
        if pool is None:
            raise RuntimeError("no tokenizer: set tokenizer.path in service.yaml")
        chunks = await pool.chunk(self.chunker, list(texts))
        empty = np.flatnonzero(chunks.doc_token_counts == 0)
        if empty.size:
            raise ServiceError(
                422,
                "text has no token the model reads (only whitespace, control or format characters)",
                field=f"{field}[{int(empty[0])}]",
            )
        limit = self.config.limits.max_chunks
        if len(chunks) > limit:
            sizes = [len(span) for span in chunks.spans]
            biggest = int(np.argmax(sizes))
            window = f"windows of at most {self.chunker.max_tokens} tokens"
            if sizes[biggest] > limit:
                raise ServiceError(
                    422,
                    f"text of {int(chunks.doc_token_counts[biggest])} tokens is cut into {sizes[biggest]} {window}; "
                    f"at most {limit} windows in one request",
                    field=f"{field}[{biggest}]",
                )
            raise ServiceError(
                422, f"the texts are cut into {len(chunks)} {window}; at most {limit} in one request", field=field
            )
        return chunks

    def check_texts(self, texts: Sequence[str], field: str = "texts") -> None:
        """Refuse what the limits in service.yaml forbid, naming the field: empty text, too long, too many."""
        limits = self.config.limits
        if not texts:
            raise ServiceError(422, "at least one text is needed", field=field)
        if len(texts) > limits.max_documents:
            raise ServiceError(422, f"{len(texts)} texts, at most {limits.max_documents} in one request", field=field)
        for i, text in enumerate(texts):
            if not text.strip():
                raise ServiceError(422, "text is empty", field=f"{field}[{i}]")
            if len(text) > limits.max_text_chars:
                raise ServiceError(
                    422, f"text has {len(text)} characters, at most {limits.max_text_chars}", field=f"{field}[{i}]"
                )

    async def infer_chunks(
        self, model: str, chunks: Chunks, output: str, *, max_batch_size: int | None = None
    ) -> np.ndarray[Any, Any]:
        """Run every chunk through ``model``, concurrently; one row of ``output`` per chunk, in chunk order.

        In as few calls as its max_batch_size allows, each padded to its longest chunk; or, when the model's
        config has ``pad_inputs`` (the server pads), one call per chunk at its own length, at most twice
        max_batch_size in flight, which the server batches. An output with the token axis then comes back
        zero-filled past each chunk's length."""
        handle = self.model(model)
        padding = self._runtime.padding.get(model)
        self.rows += len(chunks)
        self.tokens += sum(len(ids) for ids in chunks.input_ids)
        return await infer_chunks(handle, chunks, output, max_batch_size=max_batch_size, padding=padding)

    @contextlib.asynccontextmanager
    async def stage(self, name: str) -> AsyncIterator[None]:
        """Time a stage (pre-process, model, post-process...): a span, a metric and an entry in `timings`."""
        start = time.perf_counter()
        with _tracer.start_as_current_span(name):
            try:
                yield
            finally:
                elapsed = time.perf_counter() - start
                self.timings[name] = self.timings.get(name, 0.0) + elapsed
                self._runtime.metrics.stages.labels(self.route, name).observe(elapsed)


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
    body = {"type": "about:blank", "title": title or _phrase(status), "status": status, "detail": detail}
    body["instance"] = request.url.path
    body.update({k: v for k, v in extra.items() if v is not None})
    return Response(body, status_code=status, media_type=PROBLEM, headers=headers)


def _client_error_status(exc: ClientError) -> tuple[int, str, dict[str, str] | None]:
    if isinstance(exc, Timeout):
        return 504, "the model service did not answer in time", None
    if isinstance(exc, ServerUnavailable | ConnectError | ConnectionLost | ModelNotFound):
        return 503, f"the model service is unavailable: {exc.message}", {"Retry-After": "1"}
    if isinstance(exc, InvalidInput):
        return 422, f"the model refused the input: {exc.message}", None
    if isinstance(exc, PayloadTooLarge):
        return 413, "the request is too large for the model service", None
    return 502, "the model service failed", None


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
        status, detail, headers = _client_error_status(exc)
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
                status = _client_error_status(exc)[0]
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
