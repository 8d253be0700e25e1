"""``modelsvc`` command line. ``serve`` takes tritonserver's flag names, so manifests carry over."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def port_number(text: str) -> int:
    """argparse type for a TCP port (0..65535)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0..65535")
    return port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelsvc", description=__doc__)
    parser.add_argument("--version", action="version", version=f"modelsvc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser(
        "serve",
        help="serve a Triton model repository over the v2 protocol",
        description="Serve a Triton model repository. Flags are tritonserver's; BOOL takes true or false.",
    )
    s.add_argument("--model-repository", "--model-store", required=True, type=Path, metavar="DIR")
    s.add_argument("--http-address", default="0.0.0.0", metavar="ADDR")
    s.add_argument("--http-port", type=port_number, default=8000)
    s.add_argument("--grpc-address", default="0.0.0.0", metavar="ADDR")
    s.add_argument("--grpc-port", type=port_number, default=8001)
    s.add_argument("--metrics-address", default="0.0.0.0", metavar="ADDR")
    s.add_argument("--metrics-port", type=port_number, default=8002)
    for flag, default in (("--allow-http", True), ("--allow-grpc", True), ("--allow-metrics", True)):
        s.add_argument(flag, type=_bool, default=default, nargs="?", const=True, metavar="BOOL")
    s.add_argument(
        "--strict-model-config",
        type=_bool,
        default=False,
        nargs="?",
        const=True,
        metavar="BOOL",
        help="require a complete config.pbtxt (no auto-complete)",
    )
    s.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="never fill a model's config from its file",
    )
    s.add_argument(
        "--exit-on-error",
        type=_bool,
        default=True,
        nargs="?",
        const=True,
        metavar="BOOL",
        help="exit when a model fails to load (default true)",
    )
    s.add_argument(
        "--http-max-input-size",
        type=int,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="largest request body taken; larger ones get 413",
    )
    s.add_argument(
        "--exit-timeout-secs",
        type=int,
        default=30,
        metavar="SECS",
        help="how long shutdown waits for in-flight requests",
    )
    s.add_argument("--log-verbose", type=int, default=0, metavar="N")
    s.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="tracing, as tritonserver's flag (repeatable): mode=opentelemetry, level=TIMESTAMPS|OFF, rate=N, "
        "count=N, opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_*=N; "
        "OTEL_* environment variables apply where a flag is not given. Off by default.",
    )
    g = commands.add_parser(
        "stubgen",
        help="write a typed Python module for one model, from its metadata",
        description="Read one model's v2 metadata and write a mypy-checkable module: an <Model>Outputs "
        "NamedTuple, a <Model> wrapper over modelsvc.client.Client and an Async<Model> twin.",
    )
    g.add_argument("--url", default="localhost:8000", help="the server's HTTP (or grpc://) address")
    g.add_argument("--model", "-m", required=True, metavar="NAME")
    g.add_argument("--version", dest="model_version", default=None, metavar="V", help="default: the server's choice")
    g.add_argument("-o", "--output", required=True, type=Path, metavar="FILE.py", help="where to write; - for stdout")
    return parser


def _stubgen(args: argparse.Namespace) -> int:
    from .client import ClientError, ConnectError, ModelNotFound
    from .client import Timeout as ClientTimeout
    from .tools.stubgen import generate

    url = args.url if "://" in args.url else f"http://{args.url}"
    try:
        source = generate(url, args.model, args.model_version)
    except ModelNotFound as exc:
        version = f" version {args.model_version!r}" if args.model_version else ""
        print(f"modelsvc stubgen: model {args.model!r}{version} not found at {url}: {exc}", file=sys.stderr)
        return 1
    except (ConnectError, ClientTimeout) as exc:
        print(f"modelsvc stubgen: cannot reach the server at {url}: {exc}", file=sys.stderr)
        return 1
    except ClientError as exc:
        print(f"modelsvc stubgen: reading model {args.model!r} from {url} failed: {exc}", file=sys.stderr)
        return 1
    if str(args.output) == "-":
        sys.stdout.write(source)
        return 0
    try:
        args.output.write_text(source, encoding="utf-8")
    except OSError as exc:
        print(f"modelsvc stubgen: cannot write {args.output}: {exc}", file=sys.stderr)
        return 1
    print(f"modelsvc stubgen: wrote {args.output} for model {args.model!r} from {url}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "stubgen":
        return _stubgen(args)
    logging.basicConfig(
        level=logging.DEBUG if args.log_verbose > 0 else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s] %(message)s",
    )
    from .server import ServeOptions, serve
    from .server._tracing import TraceConfigError, parse_trace_config

    try:
        trace = parse_trace_config(args.trace_config)
    except TraceConfigError as exc:
        print(f"modelsvc: {exc}", file=sys.stderr)
        return 2
    if not args.model_repository.is_dir():
        print(f"modelsvc: --model-repository {args.model_repository} is not a directory", file=sys.stderr)
        return 2
    options = ServeOptions(
        model_repository=args.model_repository,
        http_address=args.http_address,
        http_port=args.http_port,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        strict_model_config=args.strict_model_config,
        disable_auto_complete_config=args.disable_auto_complete_config,
        exit_on_error=args.exit_on_error,
        http_max_input_size=args.http_max_input_size,
        exit_timeout_secs=args.exit_timeout_secs,
        log_verbose=args.log_verbose,
        trace=trace,
    )
    return _run(serve(options))


def _run(coro: object) -> int:
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop comes with litestar[standard]
        runner = asyncio.Runner()
    with runner:
        return int(runner.run(coro))  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
