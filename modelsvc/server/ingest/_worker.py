"""An ingest worker process: the public HTTP and gRPC doors, sharing their ports with the other workers.

It does each inference's protocol work (read, parse, decode, check the framing, encode, write) and sends the
request to the engine over its channel; everything else goes to the engine's own doors (``_proxy``). It exits when
the engine's channel closes (the engine is gone: the pod ends), and drains on SIGTERM or SIGINT as ``modelsvc
serve`` does: it stops accepting, and the requests it has read get their answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import signal
from pathlib import Path
from typing import Any, cast

from ..grpc import GrpcServer
from ..http import HttpServer, InferEndpoint
from ._arena import ArenaView, OwnedArena
from ._pool import WorkerSpec
from ._proxy import ProxyService, http_proxy
from ._remote import EngineLink, ForwardTracing, RemoteDataPlane
from ._wire import Listening

logger = logging.getLogger("modelsvc.ingest")


async def run_worker(spec: WorkerSpec, index: int, inputs_fd: int, outputs_fd: int) -> int:
    """Serve as worker ``index``, with the arenas the engine made for it: inputs written here, outputs read here."""
    arena = OwnedArena(spec.arena_bytes, inputs_fd)
    engine_arena = ArenaView(outputs_fd, spec.arena_bytes)
    try:
        link = await EngineLink.connect(spec.channel, arena, engine_arena, index)
    except (OSError, ConnectionError) as exc:
        logger.error("ingest worker %d: cannot reach the engine: %s", index, exc)
        return 1
    plane = cast(Any, RemoteDataPlane(link, ForwardTracing() if spec.tracing else None))
    return await _serve(spec, index, plane, link)


async def _serve(spec: WorkerSpec, index: int, plane: Any, link: EngineLink) -> int:
    options = spec.options
    http: HttpServer | None = None
    grpc_server: GrpcServer | None = None
    service: ProxyService | None = None
    try:
        if options.allow_grpc:
            service = ProxyService(plane, f"unix:{spec.grpc_socket}", options.grpc_max_message_size)
            grpc_server = GrpcServer(
                plane,
                max_message_size=options.grpc_max_message_size,
                restricted=options.grpc_restricted,
                engine=options.grpc_engine,
                limits=options.grpc_limits,
                service=service,
            )
            await grpc_server.start(options.grpc_address, options.grpc_port, reuse_port=True)
        if options.allow_http:
            app = http_proxy(spec.http_socket)
            endpoint = InferEndpoint(plane, options.http_restricted)
            http = HttpServer(app, infer=endpoint, max_body_size=options.http_max_input_size)
            await http.start(options.http_address, options.http_port, reuse_port=True)
    except OSError as exc:
        logger.error("ingest worker %d: cannot open an endpoint: %s", index, exc)
        return 1
    link.send(Listening())
    logger.debug("ingest worker %d serving", index)

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    stop: asyncio.Future[Any] = asyncio.ensure_future(stopping.wait())
    lost: asyncio.Future[Any] = link.lost
    done, _ = await asyncio.wait([stop, lost], return_when=asyncio.FIRST_COMPLETED)
    if stop not in done:
        logger.error("ingest worker %d: the engine's channel closed; exiting", index)
        stop.cancel()
        if http is not None:
            for conn in list(http.connections):
                conn.abort()
        if grpc_server is not None:
            grpc_server.stop_now()
        return 1
    waits = []
    if http is not None:
        waits.append(http.shutdown(options.exit_timeout_secs))
    if grpc_server is not None:
        waits.append(grpc_server.shutdown(options.exit_timeout_secs))
    await asyncio.gather(*waits)
    if service is not None:
        await service.close()
    with contextlib.suppress(Exception):
        if http is not None:
            await http.app.client.aclose()  # type: ignore[attr-defined]
    return 0


def main(argv: list[str]) -> int:
    spec_path, index, inputs_fd, outputs_fd = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    spec: WorkerSpec = pickle.loads(spec_path.read_bytes())
    logging.basicConfig(
        level=logging.DEBUG if spec.options.log_verbose > 0 else logging.INFO,
        format=f"%(asctime)s %(levelname).1s %(name)s] [worker {index}] %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per forwarded request otherwise
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop comes with litestar[standard]
        runner = asyncio.Runner()
    with runner:
        return int(runner.run(run_worker(spec, index, inputs_fd, outputs_fd)))
