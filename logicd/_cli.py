"""``logicd`` command line: ``serve`` runs one logic server; ``up`` runs a service's pair locally; ``new`` writes a
new service from a template.

    logicd serve SERVICE_DIR [--host H] [--port P] [--model-url URL]
    logicd up SERVICE_DIR [--host H] [--port P]
    logicd new NAME [--template text-classifier|embedder|blank] [--no-input] [--force] [-o DIR]

SERVICE_DIR is a service's folder (its ``service.yaml`` is read) or the ``.yaml`` file itself; omitted, the
file named by ``$LOGICD_CONFIG`` is read, else ``./service.yaml``. ``LOGICD_`` overrides apply, and the flags
override those. Exit status: 0 after a requested stop, 2 when the configuration or the service's code is
wrong (the message names the key or the import), 1 when a server fails at run time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import msgspec

from modelsvc._cli import port_number

from . import __version__
from ._config import ConfigError, ServerConfig, ServiceConfig, load_config

if TYPE_CHECKING:
    from ._service import Service

CONFIG_FILE = "service.yaml"
CONFIG_ENV = "LOGICD_CONFIG"
EXAMPLE_FILE = "example.json"
"""A request body for the service's first route, shown in ``up``'s curl line."""

USAGE_ERROR = 2
RUN_ERROR = 1
TAIL_LINES = 40
"""How many of a child's last log lines ``up`` shows when the child fails."""

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


# --- arguments ------------------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logicd",
        description="The logic-server framework: the CPU half of an ML service.",
    )
    parser.add_argument("--version", action="version", version=f"logicd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    where = (
        "a service folder holding service.yaml, or the yaml file itself; default: $LOGICD_CONFIG, else ./service.yaml"
    )
    log_levels = ["debug", "info", "warning", "error"]

    s = commands.add_parser(
        "serve",
        help="run a service's logic server",
        description="Load service.yaml, import the service and serve it with uvicorn until SIGTERM or SIGINT.",
    )
    s.add_argument("service_dir", nargs="?", type=Path, metavar="SERVICE_DIR", help=where)
    s.add_argument("--host", metavar="ADDR", help="interface to bind (overrides server.host)")
    s.add_argument("--port", type=port_number, help="port to bind, 0 for a free one (overrides server.port)")
    s.add_argument("--model-url", metavar="URL", help="the model service (overrides model_service.url)")
    s.add_argument(
        "--exit-timeout-secs",
        type=_seconds,
        default=30.0,
        metavar="SECS",
        help="how long a stop waits for in-flight requests (default 30)",
    )
    s.add_argument("--access-log", action="store_true", help="log every request")
    s.add_argument("--log-level", choices=log_levels, default="info")

    u = commands.add_parser(
        "up",
        help="run a service locally: its model service and its logic server",
        description="Start `modelsvc serve` on the service's model repository and `logicd serve` against it, "
        "wait until both are ready, print their URLs and an example request, and run until Ctrl-C or SIGTERM, "
        "which stop both.",
    )
    u.add_argument("service_dir", nargs="?", type=Path, metavar="SERVICE_DIR", help=where)
    u.add_argument("--host", default="127.0.0.1", metavar="ADDR", help="the logic server's interface (127.0.0.1)")
    u.add_argument("--port", type=port_number, help="the logic server's port, 0 for a free one (default: server.port)")
    u.add_argument(
        "--ready-timeout",
        type=_seconds,
        default=120.0,
        metavar="SECS",
        help="how long each server may take to become ready (default 120)",
    )
    u.add_argument(
        "--stop-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECS",
        help="how long each server may take to stop before it is killed (default 30)",
    )
    u.add_argument(
        "--no-example",
        action="store_true",
        help=f"do not send the service's {EXAMPLE_FILE} once both are ready (sent and its answer shown by default)",
    )
    u.add_argument("--quiet", "-q", action="store_true", help="do not echo the servers' logs")
    u.add_argument("--log-level", choices=log_levels, default="info", help="the logic server's log level")

    from ._new import DEFAULT_TEMPLATE, RULE, TEMPLATES

    n = commands.add_parser(
        "new",
        help="write a new service from a template",
        description="Write a complete service into DIR/NAME: its logic module, service.yaml, model repository, "
        "build_model.py, tests (in-process and end to end), a load test, Helm values and the images' build "
        "arguments. On a terminal the template's questions are asked; --no-input takes their defaults. "
        "Exit status: 0 written, 2 a bad NAME, a folder in the way or a bad answer, 1 the template failed.",
        epilog="templates: " + "; ".join(f"{name}: {what}" for name, what in TEMPLATES.items()),
    )
    n.add_argument("name", metavar="NAME", help=RULE)
    n.add_argument(
        "--template", "-t", choices=list(TEMPLATES), default=DEFAULT_TEMPLATE, help=f"default {DEFAULT_TEMPLATE}"
    )
    n.add_argument("--no-input", action="store_true", help="ask nothing: take the defaults (and the -d answers)")
    n.add_argument(
        "--output-dir", "-o", type=Path, default=Path(), metavar="DIR", help="where NAME/ goes (the current folder)"
    )
    n.add_argument(
        "--force",
        action="store_true",
        help="write over an existing DIR/NAME with the answers recorded there: the template's files are replaced "
        "(and listed), anything else is kept",
    )
    n.add_argument(
        "--data", "-d", action="append", default=[], metavar="KEY=VALUE", help="answer a question (port=9000)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "up":
        return _up(args)
    if args.command == "new":
        from ._new import command

        return command(args)
    return _serve(args)


# --- loading a service ----------------------------------------------------------------------------------


def config_path(given: Path | None, env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """The service.yaml that SERVICE_DIR (a folder or a file), ``$LOGICD_CONFIG`` or the current folder names."""
    env = os.environ if env is None else env
    if given is None:
        named = env.get(CONFIG_ENV)
        given = Path(named) if named else Path()
    return given / CONFIG_FILE if given.is_dir() else given


def with_overrides(
    config: ServiceConfig, *, host: str | None = None, port: int | None = None, model_url: str | None = None
) -> ServiceConfig:
    """``config`` with the command line's ``--host``, ``--port`` and ``--model-url``; a bad URL raises
    :class:`ConfigError` naming the flag."""
    server = ServerConfig(
        host=config.server.host if host is None else host,
        port=config.server.port if port is None else port,
    )
    models = config.model_service
    if model_url is not None:
        try:
            models = msgspec.structs.replace(models, url=model_url)
        except ConfigError as exc:
            raise ConfigError(exc.reason, source="--model-url") from exc
    return msgspec.structs.replace(config, server=server, model_service=models)


def _load(args: argparse.Namespace, command: str, model_url: str | None = None) -> tuple[Path, ServiceConfig] | int:
    """The config file and its config with the flags applied, or the exit status after printing why not."""
    path = config_path(args.service_dir)
    try:
        config = with_overrides(load_config(path), host=args.host, port=args.port, model_url=model_url)
    except ConfigError as exc:
        print(f"logicd {command}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    return path, config


def _import_service(config: ServiceConfig, service_dir: Path, command: str) -> Service | int:
    """The service object, or the exit status after printing why it could not be imported."""
    from ._service import load_service

    try:
        return load_service(config, service_dir)
    except (ImportError, TypeError) as exc:
        print(f"logicd {command}: {exc}", file=sys.stderr)
    except Exception:  # the service's module raised on import: show where
        print(f"logicd {command}: importing {config.service!r} failed:\n{traceback.format_exc()}", file=sys.stderr)
    return USAGE_ERROR


# --- serve ----------------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname).1s %(name)s] %(message)s",
    )
    if args.log_level != "debug":  # a line per model-service call (each readiness probe makes some) is noise
        logging.getLogger("httpx").setLevel(logging.WARNING)
    loaded = _load(args, "serve", model_url=args.model_url)
    if isinstance(loaded, int):
        return loaded
    path, config = loaded
    service = _import_service(config, path.parent, "serve")
    if isinstance(service, int):
        return service

    import uvicorn

    from ._app import create_app

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


# --- up -------------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In a child, before exec: be sent SIGTERM if ``up`` dies, even by SIGKILL (Linux), so no server outlives it."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class _Child:
    """One server ``up`` started: its process, and a thread that keeps its last log lines (and echoes them)."""

    name: str
    proc: subprocess.Popen[bytes]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None

    @classmethod
    def start(cls, name: str, tag: str, command: list[str], echo: bool) -> _Child:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop(CONFIG_ENV, None)  # the child is given its file
        # Its own process group: a terminal's Ctrl-C reaches only `up`, which passes it on once, in order.
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            process_group=0,
            preexec_fn=_die_with_parent,
        )
        child = cls(name, proc)
        child.reader = threading.Thread(target=child._pump, args=(tag, echo), name=f"logicd-up-{tag}", daemon=True)
        child.reader.start()
        return child

    def _pump(self, tag: str, echo: bool) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:  # drained to the end, or the child would block on a full pipe
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            if echo:
                try:
                    print(f"[{tag}] {line}", file=sys.stderr, flush=True)
                except (OSError, ValueError):  # our stderr went away: keep the tail only
                    echo = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def stop(self, sig: int, timeout: float) -> bool:
        """Send ``sig`` and wait; kill after ``timeout``. Whether it stopped by itself."""
        self.signal(sig)
        try:
            self.proc.wait(timeout)
            stopped = True
        except subprocess.TimeoutExpired:
            print(f"logicd up: the {self.name} did not stop within {timeout:g}s; killing it", file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
            stopped = False
        if self.reader is not None:
            self.reader.join(5.0)
        return stopped

    def show_tail(self, why: str) -> None:
        if self.reader is not None and not self.alive:
            self.reader.join(5.0)  # the last lines are in the pipe until it is drained
        lines = "\n".join(f"  | {line}" for line in self.tail) or "  | (no output)"
        print(f"logicd up: the {self.name} {why}; its last log lines:\n{lines}", file=sys.stderr, flush=True)


class _Signals:
    """SIGTERM, SIGINT and SIGHUP while ``up`` runs: the first asks for a stop; a later one is passed straight
    on to the children that still run (a second Ctrl-C hurries them)."""

    HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: int | None = None
        self.event = threading.Event()
        self.children: list[_Child] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.HANDLED}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        forward = signal.SIGTERM if sig == signal.SIGHUP else sig
        if self.received is not None:
            for child in self.children:
                child.signal(forward)
            return
        self.received = forward
        self.event.set()


def _wait_ready(child: _Child, url: str, timeout: float, signals: _Signals) -> str:
    """Poll ``url`` until it answers 200: ``ready``, or ``exited``, ``stopped`` (a signal) or ``timeout``."""
    import httpx

    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while True:
            if signals.received is not None:
                return "stopped"
            if not child.alive:
                return "exited"
            try:
                if client.get(url).status_code == 200:
                    return "ready"
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                return "timeout"
            signals.event.wait(0.1)


def _example(service_dir: Path) -> str:
    path = service_dir / EXAMPLE_FILE
    if not path.is_file():
        return "{}"
    try:
        return json.dumps(json.loads(path.read_text(encoding="utf-8")), separators=(",", ":"))
    except (OSError, ValueError) as exc:
        print(f"logicd up: {path} is not JSON ({exc}); showing {{}} instead", file=sys.stderr)
        return "{}"


def _try_example(path: str, service_dir: Path, logic_url: str, max_lines: int = 40) -> str:
    """Send the service's example request to its first route; the answer, shown as the first proof of life."""
    import httpx

    started = time.perf_counter()
    try:
        response = httpx.post(
            f"{logic_url}{path}",
            content=_example(service_dir),
            headers={"content-type": "application/json"},
            timeout=60.0,
        )
    except httpx.HTTPError as exc:
        return f"logicd up: the example request to POST {path} failed: {exc}"
    took = (time.perf_counter() - started) * 1000.0
    try:
        body = json.dumps(response.json(), indent=2, ensure_ascii=False)
    except ValueError:
        body = response.text
    lines = body.splitlines()
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"... ({len(lines) - max_lines} more lines)"]
    shown = "\n".join(f"  {line}" for line in lines)
    return f"logicd up: {EXAMPLE_FILE} sent to POST {path}: {response.status_code} in {took:.0f} ms\n{shown}"


def _model_repository(config: ServiceConfig, service_dir: Path) -> Path:
    return config.model_service.model_repository or service_dir / "model_repository"


def _up(args: argparse.Namespace) -> int:
    loaded = _load(args, "up")
    if isinstance(loaded, int):
        return loaded
    path, config = loaded
    service_dir = path.absolute().parent
    service = _import_service(config, service_dir, "up")  # fails early, and names the first route to try
    if isinstance(service, int):
        return service
    repository = _model_repository(config, service_dir)
    if not repository.is_dir():
        print(
            f"logicd up: no model repository at {repository}; set model_service.model_repository in {path}",
            file=sys.stderr,
        )
        return USAGE_ERROR

    loopback = "127.0.0.1"
    model_port, metrics_port, grpc_port = free_port(), free_port(), free_port()
    port = config.server.port or free_port(args.host if args.host != "0.0.0.0" else loopback)
    if _port_taken(args.host or "0.0.0.0", port):  # else another server's 200 would pass for ours
        print(f"logicd up: port {port} is already in use on {args.host}; choose another with --port", file=sys.stderr)
        return USAGE_ERROR
    shown_host = loopback if args.host in ("0.0.0.0", "") else args.host
    model_url = f"http://{loopback}:{model_port}"
    logic_url = f"http://{shown_host}:{port}"
    model_command = [
        sys.executable,
        "-m",
        "modelsvc",
        "serve",
        "--model-repository",
        str(repository),
        *("--http-address", loopback, "--http-port", str(model_port)),
        *("--metrics-address", loopback, "--metrics-port", str(metrics_port)),
        *("--grpc-address", loopback, "--grpc-port", str(grpc_port)),
    ]
    logic_command = [
        sys.executable,
        "-m",
        "logicd",
        "serve",
        str(path.absolute()),
        *("--host", args.host, "--port", str(port), "--model-url", model_url, "--log-level", args.log_level),
    ]

    children: list[_Child] = []
    with _Signals() as signals:
        signals.children = children
        try:
            for name, tag, command, ready_url in (
                ("model service", "model", model_command, f"{model_url}/v2/health/ready"),
                ("logic server", "logic", logic_command, f"{logic_url}/health/ready"),
            ):
                if signals.received is not None:
                    return _stop(children, signals.received, args.stop_timeout)
                child = _Child.start(name, tag, command, echo=not args.quiet)
                children.append(child)
                _say(f"started the {name}, pid {child.proc.pid}: {shlex.join(command)}")
                state = _wait_ready(child, ready_url, args.ready_timeout, signals)
                if state == "stopped":
                    return _stop(children, signals.received or signal.SIGTERM, args.stop_timeout)
                if state != "ready":
                    _stop(children, signal.SIGTERM, args.stop_timeout)
                    why = (
                        f"exited with status {child.proc.returncode} before it was ready"
                        if state == "exited"
                        else f"was not ready within {args.ready_timeout:g}s"
                    )
                    child.show_tail(why)
                    return RUN_ERROR
            _say(_banner(config, service, service_dir, logic_url, model_url, metrics_port, children))
            if not args.no_example and service.routes and (service_dir / EXAMPLE_FILE).is_file():
                _say(_try_example(service.routes[0].path, service_dir, logic_url))
            print("Ctrl-C stops both.", flush=True)
            while not signals.event.wait(0.2):
                for child in children:
                    if not child.alive:
                        code = child.proc.returncode
                        _stop(children, signal.SIGTERM, args.stop_timeout)
                        child.show_tail(f"exited with status {code}")
                        return RUN_ERROR
            return _stop(children, signals.received or signal.SIGTERM, args.stop_timeout)
        finally:
            for child in children:  # an error in `up` itself: leave nothing behind
                if child.alive:
                    child.stop(signal.SIGTERM, args.stop_timeout)


def _stop(children: list[_Child], sig: int, timeout: float) -> int:
    """Stop the logic server first (its in-flight requests still reach the models), then the model service."""
    running = [child for child in children if child.alive]
    if running:
        _say(f"stopping ({signal.Signals(sig).name})")
    for child in reversed(running):
        child.stop(sig, timeout)
    if running:
        _say("stopped")
    return 0


def _say(text: str) -> None:
    print(text if text.startswith(" ") or "\n" in text else f"logicd up: {text}", flush=True)


def _banner(
    config: ServiceConfig,
    service: Service,
    service_dir: Path,
    logic_url: str,
    model_url: str,
    metrics_port: int,
    children: list[_Child],
) -> str:
    model, logic = children
    model_metrics = f"{model_url.rsplit(':', 1)[0]}:{metrics_port}/metrics"
    lines = [
        f"logicd up: {config.name} is ready",
        f"  logic server   {logic_url}  (pid {logic.proc.pid})",
        f"  API docs       {logic_url}/docs",
        f"  metrics        {logic_url}/metrics",
        f"  model service  {model_url}  (pid {model.proc.pid})",
        f"  model metrics  {model_metrics}",
    ]
    if service.routes:
        route = service.routes[0]
        lines += [
            "try:",
            f"  curl -X {route.method} {logic_url}{route.path} -H 'content-type: application/json'"
            f" -d {shlex.quote(_example(service_dir))}",
        ]
    return "\n".join(lines)
