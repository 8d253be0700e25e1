"""``logicd up``: run a service locally, ``modelsvc serve`` on its model repository and ``logicd serve`` against
it, until Ctrl-C or SIGTERM stops both."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .._config import ServiceConfig
from ._children import Child, Signals
from ._loading import RUN_ERROR, USAGE_ERROR, import_service, load

if TYPE_CHECKING:
    from .._service import Service

EXAMPLE_FILE = "example.json"
"""A request body for the service's first route, shown in ``up``'s curl line."""


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


def _wait_ready(child: Child, url: str, timeout: float, signals: Signals) -> str:
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


def up(args: argparse.Namespace) -> int:
    loaded = load(args, "up")
    if isinstance(loaded, int):
        return loaded
    path, config = loaded
    service_dir = path.absolute().parent
    service = import_service(config, service_dir, "up")  # fails early, and names the first route to try
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

    children: list[Child] = []
    with Signals() as signals:
        signals.children = children
        try:
            for name, tag, command, ready_url in (
                ("model service", "model", model_command, f"{model_url}/v2/health/ready"),
                ("logic server", "logic", logic_command, f"{logic_url}/health/ready"),
            ):
                if signals.received is not None:
                    return _stop(children, signals.received, args.stop_timeout)
                child = Child.start(name, tag, command, echo=not args.quiet)
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


def _stop(children: list[Child], sig: int, timeout: float) -> int:
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
    children: list[Child],
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
