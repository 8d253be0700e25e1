"""``logicd``'s argument parser and ``main``, which hands the parsed arguments to the command: ``serve``
(``_serve``), ``up`` (``_up``), ``new`` (``logicd._new``) or ``plan`` (``logicd.plan``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from ._serve import serve
from ._up import EXAMPLE_FILE, up


def port_number(text: str) -> int:
    """argparse type for a TCP port (0..65535)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0..65535")
    return port


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

    from .._new import DEFAULT_TEMPLATE, RULE, TEMPLATES

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

    p = commands.add_parser(
        "plan",
        help="capacity and cost planning: nodes, pod packing, $/hour",
        description="Size the services of PLAN.yaml for their peak and average traffic from capacity per pod (a "
        "configuration sweep's results or numbers by hand), pack the pods onto the node types on offer by their "
        "Kubernetes requests, and compare the options side by side in $/hour and $/1M requests, overall and per "
        "service, against traffic and against throughput per pod: cpu-only (before a move to accelerators), "
        "monolith-per-gpu-node (the naive move), split-packed (logic and model apart, CPU pods on accelerator "
        "nodes' spare CPUs), shared-model-service, each once per accelerator a model was measured on. Exit status: "
        "0 planned, 2 bad input (the message names the service or field).",
    )
    p.add_argument("plan", nargs="?", type=Path, metavar="PLAN.yaml", help="the plan file (see --example)")
    p.add_argument(
        "--example",
        nargs="?",
        const="default",
        metavar="NAME",
        help="print an example plan file and exit: default (one accelerated service beside five CPU services) or "
        "accelerators (T4 against Inferentia against CPU only)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")
    p.add_argument("--summary", action="store_true", help="the options' table only, without replicas and nodes")
    p.add_argument("--picture", type=Path, metavar="FILE.svg", help="write the options' nodes and pods as an SVG")
    p.add_argument(
        "--write-values",
        type=Path,
        metavar="DIR",
        help="write DIR/<service>.yaml, helm/ml-service values that place each logic+model pair as the cheapest "
        "split-packed option packed it (DIR/<service>.placement.yaml, a Deployment patch, for other services)",
    )
    p.add_argument(
        "--values-option",
        metavar="OPTION",
        help="with --write-values: the split-packed option to deploy (split-packed@t4-trt), instead of the cheapest",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "up":
        return up(args)
    if args.command == "new":
        from .._new import command

        return command(args)
    if args.command == "plan":
        from ..plan._command import command as plan

        return plan(args)
    return serve(args)
