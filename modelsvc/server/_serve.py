"""Running the server: load the repository, open the gRPC, HTTP and metrics endpoints, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Coroutine
from typing import Any

from litestar import Litestar, Response, get

from ..engine import DataPlane, ModelControlMode, ModelManager, RepositoryPoller, ResponseCache
from ..repository import ModelRepository, RemoteRepository, RemoteRepositoryError, is_remote
from ._options import ServeOptions
from .grpc import GrpcServer
from .http import HttpServer, InferEndpoint, create_http_app
from .ingest import Ingest
from .observe import Metrics, NvmlReader, SystemMetrics, start_tracing

logger = logging.getLogger("modelsvc")


def create_metrics_app(metrics: Metrics) -> Litestar:
    @get("/metrics", sync_to_thread=False)
    def scrape() -> Response[bytes]:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return Litestar(route_handlers=[scrape], openapi_config=None, logging_config=None)


async def serve(options: ServeOptions) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit status."""
    root = options.model_repository
    remote = None
    if isinstance(root, str) and is_remote(root):
        try:
            remote = RemoteRepository(root)
            result = await asyncio.to_thread(remote.sync)
        except RemoteRepositoryError as exc:
            logger.error("cannot serve the model repository: %s", exc)
            return 1
        logger.info("model repository %s copied to %s (%d files)", remote.url, remote.path, result.files_downloaded)
        root = remote.path
    repository = ModelRepository(
        root,
        strict_model_config=options.strict_model_config,
        autocomplete=not options.disable_auto_complete_config,
    )
    models = ModelManager(repository, mode=options.model_control_mode, remote=remote)
    models.cache = ResponseCache.from_settings(options.cache)
    errors = await _load_at_start(models, options)
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
    servers: list[HttpServer] = []
    ingest = Ingest(options) if options.workers > 0 else None
    dataplane.accepting = True
    dataplane.doors_open = ingest is None  # with workers: ready once every worker serves the ports
    grpc_server: GrpcServer | None = None
    system = None
    if options.allow_metrics:  # sampled from before the endpoints open: the first scrape has the values
        system = await SystemMetrics.start_for(
            options.metrics_interval_ms,
            allow_cpu=options.allow_cpu_metrics,
            allow_gpu=options.allow_gpu_metrics,
            open_gpu=NvmlReader.open,
        )
    try:
        if options.allow_grpc:  # first: once HTTP says ready, gRPC listens too
            grpc_server = GrpcServer(
                dataplane,
                max_message_size=options.grpc_max_message_size,
                restricted=options.grpc_restricted,
                engine=options.grpc_engine,
                limits=options.grpc_limits if ingest is None else ingest.door_limits,
            )
            if ingest is not None:
                await grpc_server.start_unix(ingest.grpc_socket)
            else:
                await grpc_server.start(options.grpc_address, options.grpc_port)
                logger.info("gRPC v2 endpoint on %s:%d (engine %s)", *grpc_server.address, options.grpc_engine)
        if options.allow_http:
            restricted = options.http_restricted
            app = create_http_app(dataplane, max_body_size=options.http_max_input_size, restricted=restricted)
            endpoint = InferEndpoint(dataplane, restricted)
            http = HttpServer(app, infer=endpoint, max_body_size=options.http_max_input_size)
            servers.append(http)
            if ingest is not None:
                await http.start_unix(ingest.http_socket)
            else:
                await http.start(options.http_address, options.http_port)
                logger.info("HTTP v2 endpoint on %s:%d", *http.address)
        if options.allow_metrics:
            metrics = HttpServer(create_metrics_app(Metrics(models, system, [ingest.families] if ingest else ())))
            await metrics.start(options.metrics_address, options.metrics_port)
            servers.append(metrics)
            logger.info("metrics on %s:%d/metrics", *metrics.address)
        if ingest is not None:
            await ingest.start(dataplane)
            dataplane.doors_open = True
            logger.info(
                "HTTP v2 endpoint on %s:%d, gRPC on %s:%d (engine %s): %d ingest workers",
                options.http_address, options.http_port, options.grpc_address, options.grpc_port,
                options.grpc_engine, ingest.count,
            )  # fmt: skip
    except OSError as exc:
        logger.error("cannot open an endpoint: %s", exc)
        if ingest is not None:
            await ingest.stop(0)
        await asyncio.gather(*(s.shutdown(0) for s in servers), *_grpc_shutdown(grpc_server, 0))
        if system is not None:
            await system.stop()
        await models.close()
        return 1

    poller = None
    if options.model_control_mode is ModelControlMode.POLL and options.repository_poll_secs > 0:
        poller = RepositoryPoller(models, options.repository_poll_secs, models.remote)
        poller.start()
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
            if grpc_server is not None:
                grpc_server.stop_now()
            if ingest is not None:
                ingest.kill()
            return
        logger.info("%s received: draining in-flight requests, then exiting", sig.name)
        dataplane.draining = True
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    try:
        await stopping.wait()
        if poller is not None:
            await poller.stop()
        # Together: the schedulers run what is queued now (no batch delay waits any longer), and the
        # endpoints (the ingest workers' too) let every request already read get its answer.
        await asyncio.gather(
            models.close(),
            *(s.shutdown(options.exit_timeout_secs) for s in servers),
            *_grpc_shutdown(grpc_server, options.exit_timeout_secs),
            *([] if ingest is None else [ingest.stop(options.exit_timeout_secs)]),
        )
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if poller is not None:
            await poller.stop()
        if system is not None:
            await system.stop()
        await models.close()
    logger.info("modelsvc stopped")
    return 0


async def _load_at_start(models: ModelManager, options: ServeOptions) -> list[str]:
    """EXPLICIT mode loads the ``--load-model`` models (``*``: all); the other modes load every model."""
    if options.model_control_mode is ModelControlMode.EXPLICIT and "*" not in options.load_models:
        return await models.load_startup(options.load_models)
    return await models.load_all()


def _grpc_shutdown(server: GrpcServer | None, grace_s: float) -> list[Coroutine[Any, Any, None]]:
    return [] if server is None else [server.shutdown(grace_s)]
