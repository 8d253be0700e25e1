"""Running the server: load the repository, open the HTTP and metrics endpoints, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

from litestar import Litestar, Response, get

from ..repository import ModelRepository
from ._dataplane import DataPlane
from ._http import InferEndpoint, create_http_app
from ._httpserver import HttpServer
from ._metrics import Metrics
from ._models import ModelManager
from ._tracing import TraceSettings, start_tracing

logger = logging.getLogger("modelsvc")


@dataclass(slots=True)
class ServeOptions:
    """What ``modelsvc serve`` takes; names follow tritonserver's flags."""

    model_repository: Path
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    strict_model_config: bool = False
    disable_auto_complete_config: bool = False
    exit_on_error: bool = True
    http_max_input_size: int = 64 * 1024 * 1024
    exit_timeout_secs: int = 30
    log_verbose: int = 0
    trace: TraceSettings = field(default_factory=TraceSettings)
    """``--trace-config`` flags, parsed (off by default)."""


def create_metrics_app(metrics: Metrics) -> Litestar:
    @get("/metrics", sync_to_thread=False)
    def scrape() -> Response[bytes]:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return Litestar(route_handlers=[scrape], openapi_config=None, logging_config=None)


async def serve(options: ServeOptions) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit status."""
    repository = ModelRepository(
        options.model_repository,
        strict_model_config=options.strict_model_config,
        autocomplete=not options.disable_auto_complete_config,
    )
    models = ModelManager(repository)
    errors = await models.load_all()
    if errors and options.exit_on_error:
        for line in errors:
            logger.error(line)
        logger.error("exiting: models failed to load and --exit-on-error is true")
        await models.close()
        return 1
    # Everything loaded so far lives as long as the server: keep it out of the collector's scans, and
    # collect the young generation less often (the request path allocates many short-lived objects).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    dataplane = DataPlane(models)
    dataplane.tracing = start_tracing(options.trace)
    try:
        return await _serve(options, models, dataplane)
    finally:
        if dataplane.tracing is not None:  # export the spans still buffered
            await asyncio.to_thread(dataplane.tracing.shutdown)


async def _serve(options: ServeOptions, models: ModelManager, dataplane: DataPlane) -> int:
    dataplane.accepting = True
    servers: list[HttpServer] = []
    try:
        if options.allow_http:
            app = create_http_app(dataplane, max_body_size=options.http_max_input_size)
            http = HttpServer(app, infer=InferEndpoint(dataplane), max_body_size=options.http_max_input_size)
            await http.start(options.http_address, options.http_port)
            servers.append(http)
            logger.info("HTTP v2 endpoint on %s:%d", *http.address)
        if options.allow_metrics:
            metrics = HttpServer(create_metrics_app(Metrics(models)))
            await metrics.start(options.metrics_address, options.metrics_port)
            servers.append(metrics)
            logger.info("metrics on %s:%d/metrics", *metrics.address)
    except OSError as exc:
        logger.error("cannot open an endpoint: %s", exc)
        await asyncio.gather(*(s.shutdown(0) for s in servers))
        await models.close()
        return 1
    if options.allow_grpc:
        logger.info("gRPC endpoint is not part of this build yet; --grpc-port %d is not opened", options.grpc_port)

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    signals_seen = 0

    def stop(sig: signal.Signals) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            logger.warning("second %s: closing connections now", sig.name)
            for s in servers:
                for conn in list(s.connections):
                    conn.close()
            return
        logger.info("%s received: draining in-flight requests, then exiting", sig.name)
        dataplane.draining = True
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    try:
        await stopping.wait()
        # Together: the schedulers run what is queued now (no batch delay waits any longer), and the
        # endpoints let every request already read get its answer.
        await asyncio.gather(models.close(), *(s.shutdown(options.exit_timeout_secs) for s in servers))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await models.close()
    logger.info("modelsvc stopped")
    return 0
