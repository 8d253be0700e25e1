"""Running the server: load the repository, open the HTTP and metrics endpoints, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from litestar import Litestar, Response, get

from ..repository import ModelRepository
from ._dataplane import DataPlane
from ._http import create_http_app
from ._metrics import Metrics
from ._models import ModelManager

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


class _Server(uvicorn.Server):
    """A uvicorn server whose signals are handled by ``serve`` for all endpoints together."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def create_metrics_app(metrics: Metrics) -> Litestar:
    @get("/metrics", sync_to_thread=False)
    def scrape() -> Response[bytes]:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return Litestar(route_handlers=[scrape], openapi_config=None, logging_config=None)


def _uvicorn(app: Any, host: str, port: int, options: ServeOptions) -> _Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
        http="httptools",
        timeout_graceful_shutdown=options.exit_timeout_secs,
        timeout_keep_alive=75,
        backlog=4096,
        proxy_headers=False,
        server_header=False,
    )
    return _Server(config)


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
    dataplane.accepting = True
    servers: list[_Server] = []
    if options.allow_http:
        app = create_http_app(dataplane, max_body_size=options.http_max_input_size)
        servers.append(_uvicorn(app, options.http_address, options.http_port, options))
    if options.allow_metrics:
        metrics_app = create_metrics_app(Metrics(models))
        servers.append(_uvicorn(metrics_app, options.metrics_address, options.metrics_port, options))
    if options.allow_grpc:
        logger.info("gRPC endpoint is not part of this build yet; --grpc-port %d is not opened", options.grpc_port)

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def stop(sig: signal.Signals) -> None:
        if stopping.is_set():
            logger.warning("second %s: closing connections now", sig.name)
            for s in servers:
                s.force_exit = True
            return
        logger.info("%s received: draining in-flight requests, then exiting", sig.name)
        stopping.set()
        dataplane.draining = True
        for s in servers:
            s.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    try:
        await asyncio.gather(*(s.serve() for s in servers))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await models.close()
    logger.info("modelsvc stopped")
    return 0
