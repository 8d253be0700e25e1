"""``modelsvc serve``: tritonserver's flags, parsed into ``ServeOptions``, and the server run until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from ._types import boolean, message_size, non_negative, port_number, positive


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = commands.add_parser(
        "serve",
        help="serve a Triton model repository over the v2 protocol",
        description="Serve a Triton model repository. Flags are tritonserver's; BOOL takes true or false.",
    )
    s.add_argument(
        "--model-repository",
        "--model-store",
        required=True,
        metavar="DIR|URL",
        help="a model repository folder, or one in object storage: s3://bucket/prefix, gs://..., az://...",
    )
    s.add_argument(
        "--model-control-mode",
        type=str.lower,
        choices=("none", "poll", "explicit"),
        default="none",
        help="none (default): load every model at start; poll: also follow the repository's changes; "
        "explicit: load --load-model models at start, then load and unload on request",
    )
    s.add_argument(
        "--repository-poll-secs",
        type=non_negative,
        default=15,
        metavar="SECS",
        help="seconds between polls in poll mode (default 15; 0: no polling)",
    )
    s.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="in explicit mode, a model to load at start (repeatable); '*' alone loads every model",
    )
    s.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="HTTP requests to these APIs need header KEY: VALUE, else 403 (repeatable). APIs: health, metadata, "
        "inference, shared-memory, model-config, model-repository, statistics, trace, logging",
    )
    s.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="PROTOCOL[,PROTOCOL...]:KEY=VALUE",
        help="gRPC calls to these protocols need metadata triton-grpc-protocol-KEY: VALUE, else UNAVAILABLE "
        "(repeatable); the same names as --http-restricted-api",
    )
    s.add_argument("--http-address", default="0.0.0.0", metavar="ADDR")
    s.add_argument("--http-port", type=port_number, default=8000)
    s.add_argument("--grpc-address", default="0.0.0.0", metavar="ADDR")
    s.add_argument("--grpc-port", type=port_number, default=8001)
    s.add_argument("--metrics-address", default="0.0.0.0", metavar="ADDR")
    s.add_argument("--metrics-port", type=port_number, default=8002)
    for flag, default in (("--allow-http", True), ("--allow-grpc", True), ("--allow-metrics", True)):
        s.add_argument(flag, type=boolean, default=default, nargs="?", const=True, metavar="BOOL")
    for flag, what in (("--allow-gpu-metrics", "nv_gpu_* (through NVML)"), ("--allow-cpu-metrics", "nv_cpu_*")):
        s.add_argument(
            flag,
            type=boolean,
            default=True,
            nargs="?",
            const=True,
            metavar="BOOL",
            help=f"report the {what} metrics on the metrics endpoint (default true)",
        )
    s.add_argument(
        "--metrics-interval-ms",
        type=positive,
        default=2000,
        metavar="MS",
        help="how often the GPU and CPU metrics are sampled, in milliseconds (default 2000)",
    )
    s.add_argument(
        "--strict-model-config",
        type=boolean,
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
        type=boolean,
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
        "--grpc-max-message-size",
        type=message_size,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="largest gRPC message taken or sent (default 64 MiB); larger ones get RESOURCE_EXHAUSTED. "
        "modelsvc's own flag: tritonserver has none",
    )
    s.add_argument(
        "--grpc-engine",
        choices=("h2", "grpcio"),
        default="h2",
        help="what serves gRPC: h2 (default), HTTP/2 in the server's event loop; grpcio, grpcio's own server (slower: "
        "a thread hand-off per call). modelsvc's own flag",
    )
    for flag, kind, metavar, text in (
        ("--grpc-max-concurrent-streams", positive, "N", "calls one connection may have open (default 100); more "
         "are refused (REFUSED_STREAM). grpc core's grpc.max_concurrent_streams"),
        ("--grpc-stream-window", message_size, "BYTES", "request bytes a call may send ahead of its reading them "
         "(SETTINGS_INITIAL_WINDOW_SIZE, default 65536)"),
        ("--grpc-connection-window", message_size, "BYTES", "window a connection's calls may be given beyond that, "
         "for larger messages, until they are read (default 4 MiB; one larger message when nothing else has it)"),
        ("--grpc-max-metadata-size", positive, "BYTES", "largest header block as it arrives (default 65536); a "
         "larger one closes the connection (ENHANCE_YOUR_CALM)"),
        ("--grpc-buffer-budget", positive, "BYTES", "request bytes all connections may hold unread (default 256 "
         "MiB, and at least one largest message and a window); past it new calls get RESOURCE_EXHAUSTED and the "
         "connection holding the most is closed"),
    ):  # fmt: skip
        s.add_argument(flag, type=kind, default=None, metavar=metavar, help=f"h2 engine: {text}. modelsvc's own flag")
    s.add_argument(
        "--workers",
        type=_workers,
        default="auto",
        metavar="N|auto",
        help="ingest worker processes that share the HTTP and gRPC ports and do each request's protocol work, "
        "sending it to this process, which owns the models (default auto: none with 2 CPUs or fewer, else one per "
        "CPU but this one's; 0: this process serves the ports itself). modelsvc's own flag",
    )
    s.add_argument(
        "--ingest-arena-bytes",
        type=message_size,
        default=None,
        metavar="BYTES",
        help="shared memory per worker and direction for tensors of 64 KiB or more (default 32 MiB; past it they "
        "go through the worker's socket). modelsvc's own flag",
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
        "--cache-config",
        action="append",
        default=[],
        metavar="<CACHE>,<KEY>=<VALUE>",
        help="the response cache, as tritonserver's flag: local,size=BYTES (one LRU cache shared by every model "
        "whose config has response_cache { enable: true }). Off by default.",
    )
    s.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="tracing, as tritonserver's flag (repeatable): mode=opentelemetry, level=TIMESTAMPS|OFF, rate=N, "
        "count=N, opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_*=N; "
        "OTEL_* environment variables apply where a flag is not given. Off by default.",
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.log_verbose > 0 else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s] %(message)s",
    )
    from ..engine import ModelControlMode
    from ..engine._cache import CacheConfigError, parse_cache_config
    from ..repository import is_remote
    from ..server import ServeOptions, serve
    from ..server._restricted import RestrictedApis, RestrictionError
    from ..server.grpc import H2Limits
    from ..server.observe import TraceConfigError, parse_trace_config

    try:
        trace = parse_trace_config(args.trace_config)
        cache = parse_cache_config(args.cache_config)
        http_restricted = RestrictedApis.parse_http(args.http_restricted_api)
        grpc_restricted = RestrictedApis.parse_grpc(args.grpc_restricted_protocol)
        given = {
            "max_concurrent_streams": args.grpc_max_concurrent_streams,
            "connection_window": args.grpc_connection_window,
            "stream_window": args.grpc_stream_window,
            "max_metadata_size": args.grpc_max_metadata_size,
            "buffer_budget": args.grpc_buffer_budget,
        }
        grpc_limits = H2Limits(**{name: value for name, value in given.items() if value is not None})
    except (TraceConfigError, CacheConfigError, RestrictionError, ValueError) as exc:
        print(f"modelsvc: {exc}", file=sys.stderr)
        return 2
    repository: Path | str = args.model_repository
    if not is_remote(args.model_repository):
        repository = Path(args.model_repository)
        if not repository.is_dir():
            print(f"modelsvc: --model-repository {repository} is not a directory", file=sys.stderr)
            return 2
    mode = ModelControlMode(args.model_control_mode)
    load_models = tuple(args.load_model)
    if "*" in load_models and len(load_models) > 1:
        print("modelsvc: --load-model=* must be the only --load-model", file=sys.stderr)
        return 2
    if load_models and mode is not ModelControlMode.EXPLICIT:
        logging.getLogger("modelsvc").warning("--load-model only applies in --model-control-mode explicit")
    from ..server._options import DEFAULT_ARENA_BYTES
    from ..server.ingest import resolve_workers

    workers = resolve_workers(args.workers)
    if workers:
        logging.getLogger("modelsvc").info("--workers %s: %d ingest worker processes", args.workers, workers)
    options = ServeOptions(
        workers=workers,
        ingest_arena_bytes=args.ingest_arena_bytes or DEFAULT_ARENA_BYTES,
        model_repository=repository,
        http_address=args.http_address,
        http_port=args.http_port,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        strict_model_config=args.strict_model_config,
        disable_auto_complete_config=args.disable_auto_complete_config,
        exit_on_error=args.exit_on_error,
        http_max_input_size=args.http_max_input_size,
        grpc_max_message_size=args.grpc_max_message_size,
        grpc_engine=args.grpc_engine,
        grpc_limits=grpc_limits,
        exit_timeout_secs=args.exit_timeout_secs,
        log_verbose=args.log_verbose,
        trace=trace,
        cache=cache,
        model_control_mode=mode,
        repository_poll_secs=args.repository_poll_secs,
        load_models=load_models,
        http_restricted=http_restricted,
        grpc_restricted=grpc_restricted,
    )
    return _run(serve(options))


def _workers(text: str) -> str:
    """``--workers``: ``auto`` or a count of 0 or more."""
    if text == "auto":
        return text
    try:
        if int(text) >= 0:
            return str(int(text))
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a count of 0 or more, or auto, got {text!r}")


def _run(coro: object) -> int:
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop comes with litestar[standard]
        runner = asyncio.Runner()
    with runner:
        return int(runner.run(coro))  # type: ignore[arg-type]
