"""One HTTP server variant over a model repository, in this process, until SIGTERM:

    python -m loadtests.http_servers._run SERVER REPOSITORY PORT

SERVER is one of ``SERVERS``. Every variant loads the repository the same way (``Loaded.load``, as
``modelsvc serve`` does) and serves on 127.0.0.1:PORT with one event loop (uvloop unless the name says asyncio).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from loadtests.http_servers._apps import MAX_BODY, Loaded, RsgiApp, asgi_app

#: name -> what it is (the benchmark's table prints these)
SERVERS = {
    "ours": "modelsvc HttpServer (httptools, hand-written), uvloop: as `modelsvc serve`",
    "uvicorn": "uvicorn 0.54, http=httptools, uvloop; ASGI infer route -> InferEndpoint",
    "uvicorn-asyncio": "uvicorn 0.54, http=httptools, asyncio loop; ASGI infer route -> InferEndpoint",
    "uvicorn-bare": "uvicorn as `uvicorn`, without its proxy-headers middleware and Date/Server headers",
    "uvicorn-litestar": "uvicorn 0.54, httptools, uvloop; every route (infer too) through Litestar",
    "granian": "Granian 2.8.7 embedded, RSGI, HTTP/1, 1 runtime thread, asyncio tasks, uvloop",
    "granian-rt2": "Granian as above, 2 runtime threads",
    "granian-rust": "Granian as above, 1 runtime thread, task_impl=rust",
    "granian-cli": "Granian 2.8.7 as `granian --interface rsgi --workers 1 --loop uvloop --http 1` (a worker process)",
    "hypercorn": "Hypercorn 0.18 (h11), uvloop; ASGI infer route -> InferEndpoint",
}


async def _until_sigterm() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _ours(loaded: Loaded, port: int) -> None:
    from modelsvc.server.http._server import HttpServer

    server = HttpServer(loaded.app, infer=loaded.endpoint, max_body_size=MAX_BODY)
    await server.start("127.0.0.1", port)
    await _until_sigterm()
    await server.shutdown(5)


def _uvicorn(litestar_only: bool, bare: bool = False) -> Callable[[Loaded, int], Coroutine[Any, Any, None]]:
    async def run(loaded: Loaded, port: int) -> None:
        import uvicorn

        app = loaded.app if litestar_only else asgi_app(loaded)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, http="httptools", loop="none", lifespan="off",
            log_level="warning", access_log=False, backlog=4096,
            proxy_headers=not bare, server_header=not bare, date_header=not bare,
        )  # fmt: skip
        await uvicorn.Server(config).serve()  # handles SIGTERM itself

    return run


def _granian(runtime_threads: int, rust_tasks: bool) -> Callable[[Loaded, int], Coroutine[Any, Any, None]]:
    async def run(loaded: Loaded, port: int) -> None:
        from granian.constants import HTTPModes, Interfaces, TaskImpl
        from granian.server.embed import Server

        server = Server(
            RsgiApp(loaded), address="127.0.0.1", port=port, interface=Interfaces.RSGI, http=HTTPModes.http1,
            runtime_threads=runtime_threads, task_impl=TaskImpl.rust if rust_tasks else TaskImpl.asyncio,
            websockets=False, backlog=4096, log_level="warning",  # type: ignore[arg-type]
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.signal_handler_interrupt)
        await server.serve()

    return run


async def _hypercorn(loaded: Loaded, port: int) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.backlog = 4096
    config.accesslog = None
    config.errorlog = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(asgi_app(loaded), config, shutdown_trigger=stop.wait)


class _GranianTarget:
    """The RSGI target a Granian worker process imports: loads the repository (``BENCH_HTTP_REPO``) at init."""

    def __init__(self) -> None:
        self.app: RsgiApp | None = None
        self.loaded: Loaded | None = None

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loaded = loop.run_until_complete(Loaded.load(Path(os.environ["BENCH_HTTP_REPO"])))
        self.app = RsgiApp(self.loaded)

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        assert self.app is not None
        await self.app.__rsgi__(scope, proto)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.loaded is not None:
            loop.run_until_complete(self.loaded.models.close())


granian_target = _GranianTarget()


def _granian_cli(repo: Path, port: int) -> None:
    """Granian's own process model, as its command line runs it: this process supervises one worker process."""
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops

    os.environ["BENCH_HTTP_REPO"] = str(repo)
    Granian(
        "loadtests.http_servers._run:granian_target", address="127.0.0.1", port=port, interface=Interfaces.RSGI,
        workers=1, loop=Loops.uvloop, http=HTTPModes.http1, websockets=False, backlog=4096,
        log_level="warning",  # type: ignore[arg-type]
    ).serve()  # fmt: skip


RUNNERS: dict[str, Callable[[Loaded, int], Coroutine[Any, Any, None]]] = {
    "ours": _ours,
    "uvicorn": _uvicorn(False),
    "uvicorn-asyncio": _uvicorn(False),
    "uvicorn-bare": _uvicorn(False, bare=True),
    "uvicorn-litestar": _uvicorn(True),
    "granian": _granian(1, False),
    "granian-rt2": _granian(2, False),
    "granian-rust": _granian(1, True),
    "hypercorn": _hypercorn,
}


async def main(server: str, repo: Path, port: int) -> None:
    loaded = await Loaded.load(repo)
    try:
        await RUNNERS[server](loaded, port)
    finally:
        await loaded.models.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    name, folder, port_text = sys.argv[1:4]
    if name == "granian-cli":
        _granian_cli(Path(folder), int(port_text))
        sys.exit(0)
    if name not in RUNNERS:
        sys.exit(f"unknown server {name!r}; one of: {', '.join(RUNNERS)}")
    coro = main(name, Path(folder), int(port_text))
    if name.endswith("asyncio"):
        asyncio.run(coro)
    else:
        import uvloop

        uvloop.run(coro)
