"""``logicd serve``: load a service and serve it with uvicorn until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
import sys
import traceback
from collections.abc import Coroutine
from types import FrameType
from typing import Any

from .._config import ConfigError
from ._loading import RUN_ERROR, USAGE_ERROR, import_service, load

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname).1s %(name)s] %(message)s",
    )
    if args.log_level != "debug":  # a line per model-service call (each readiness probe makes some) is noise
        logging.getLogger("httpx").setLevel(logging.WARNING)
    loaded = load(args, "serve", model_url=args.model_url)
    if isinstance(loaded, int):
        return loaded
    path, config = loaded
    service = import_service(config, path.parent, "serve")
    if isinstance(service, int):
        return service

    import uvicorn

    from .._app import create_app

    try:
        app = create_app(service, config)
    except ConfigError as exc:
        print(f"logicd serve: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except Exception:
        print(f"logicd serve: the service's app could not be built:\n{traceback.format_exc()}", file=sys.stderr)
        return USAGE_ERROR
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.server.host,
            port=config.server.port,
            log_config=None,
            access_log=args.access_log,
            lifespan="on",
            timeout_graceful_shutdown=math.ceil(args.exit_timeout_secs),  # never below what was asked
            server_header=False,
        )
    )

    # uvicorn takes SIGTERM/SIGINT while it serves, stops gracefully, then raises the signal again to whatever
    # handler was there before: this one, so that a requested stop ends in exit status 0 (not death by signal).
    def stop(sig: int, frame: FrameType | None) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS}
    try:
        _run(server.serve())
    except SystemExit as exc:  # uvicorn exits (1 or 3) when start-up fails: the lifespan raised, the port is taken
        print(f"logicd serve: the server could not start ({exc.code}); see the log above", file=sys.stderr)
        return RUN_ERROR
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _run(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop comes with litestar[standard]
        runner = asyncio.Runner()
    with runner:
        runner.run(coro)
