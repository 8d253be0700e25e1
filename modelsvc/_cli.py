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


def _message_size(text: str) -> int:
    """argparse type for a gRPC message size: 1 byte up to grpcio's limit of 2 GiB - 1."""
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size in bytes is a number, got {text!r}") from None
    if not 1 <= size <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"{size} is outside 1..{2**31 - 1} bytes")
    return size


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelsvc", description=__doc__)
    parser.add_argument("--version", action="version", version=f"modelsvc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
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
        type=_non_negative,
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
        "--grpc-max-message-size",
        type=_message_size,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="largest gRPC message taken or sent (default 64 MiB); larger ones get RESOURCE_EXHAUSTED. "
        "modelsvc's own flag: tritonserver has none",
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
    _add_export(commands)
    i = commands.add_parser(
        "inspect",
        help="show a model file's inputs, outputs, datatypes, dims and opsets",
        description="Show what an ONNX model (or, where TensorRT is installed, a .plan/.engine) takes and "
        "gives: tensor names, Triton datatypes, dims (-1 dynamic, with the symbolic name), opsets, IR version, "
        "producer and parameter count.",
    )
    i.add_argument("model_file", type=Path, metavar="MODEL_FILE")
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"cannot be negative, got {value}")
    return value


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


# the choices of `modelsvc export`, as modelsvc.tools.export names them (a test checks that they agree);
# written out here so that building the parser imports neither onnx nor the export code
TASKS = ("auto", "feature-extraction", "sequence-classification", "token-classification")
POOLINGS = ("none", "mean", "cls")
INT_DTYPES = ("int64", "int32")
KINDS = ("KIND_CPU", "KIND_GPU")


def _add_export(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = commands.add_parser(
        "export",
        help="export a transformers PyTorch model to ONNX, check it, and write its config.pbtxt",
        description="Export a transformers model to <DIR>/<NAME>/<VERSION>/model.onnx with torch.onnx's dynamo "
        "exporter (dynamic batch and sequence axes), check ONNX Runtime against PyTorch on random inputs, and "
        "write <DIR>/<NAME>/config.pbtxt (an existing one is kept unless --overwrite-config). Needs "
        "modelsvc[export]. Exit status: 0 written, 1 the check or the export failed, 2 usage.",
    )
    e.add_argument("model", metavar="MODEL", help="a local model folder, or a hub name already in the cache")
    e.add_argument("--model-repository", required=True, type=Path, metavar="DIR")
    e.add_argument("--model-name", required=True, metavar="NAME")
    e.add_argument("--version", dest="model_version", type=_positive, default=1, metavar="N", help="default 1")
    e.add_argument("--task", choices=TASKS, default="auto", help="default: from the model's config")
    e.add_argument(
        "--pooling",
        choices=POOLINGS,
        default="none",
        help="feature-extraction: add output sentence_embedding, the mean over unmasked tokens or the first token",
    )
    e.add_argument("--normalize", action="store_true", help="L2-normalize sentence_embedding")
    e.add_argument("--opset", type=_positive, default=18, metavar="N", help="ONNX opset (default 18)")
    e.add_argument(
        "--int-dtype", choices=INT_DTYPES, default="int64", help="datatype of the integer inputs (default int64)"
    )
    e.add_argument(
        "--optimize", action="store_true", help="run ONNX Runtime's transformer optimizer (attention fusion)"
    )
    e.add_argument("--max-batch-size", type=_non_negative, default=8, metavar="N", help="default 8; 0: no batching")
    e.add_argument("--no-dynamic-batching", dest="dynamic_batching", action="store_false")
    e.add_argument("--max-queue-delay-microseconds", type=_non_negative, default=0, metavar="N")
    e.add_argument("--preferred-batch-size", type=_positive, nargs="+", default=[], metavar="N")
    e.add_argument("--instance-count", type=_positive, default=1, metavar="N")
    e.add_argument("--kind", choices=KINDS, default="KIND_CPU")
    e.add_argument(
        "--tolerance", type=_tolerance, default=1e-4, metavar="X", help="largest max abs difference (default 1e-4)"
    )
    e.add_argument("--overwrite-config", action="store_true", help="replace an existing config.pbtxt")


def _export(args: argparse.Namespace) -> int:
    from .tools.export import ExportCheckError, ExportError, ExportOptions, ExportUsageError, export_model
    from .tools.inspect_model import format_dims

    options = ExportOptions(
        model=args.model,
        model_repository=args.model_repository,
        model_name=args.model_name,
        version=args.model_version,
        task=args.task,
        pooling=args.pooling,
        normalize=args.normalize,
        opset=args.opset,
        int_dtype=args.int_dtype,
        optimize=args.optimize,
        max_batch_size=args.max_batch_size,
        dynamic_batching=args.dynamic_batching,
        max_queue_delay_microseconds=args.max_queue_delay_microseconds,
        preferred_batch_size=tuple(args.preferred_batch_size),
        instance_count=args.instance_count,
        kind=args.kind,
        tolerance=args.tolerance,
        overwrite_config=args.overwrite_config,
        log=lambda line: print(f"modelsvc export: {line}", file=sys.stderr, flush=True),
    )
    try:
        report = export_model(options)
    except ExportCheckError as exc:
        _print_diffs(exc.max_abs_diff, args.tolerance)
        print(f"modelsvc export: {exc}", file=sys.stderr)
        return 1
    except ExportUsageError as exc:
        print(f"modelsvc export: {exc}", file=sys.stderr)
        return 2
    except ExportError as exc:
        print(f"modelsvc export: {exc}", file=sys.stderr)
        return 1
    width = max(len(t.name) for t in (*report.inputs, *report.outputs))
    for title, tensors in (("inputs", report.inputs), ("outputs", report.outputs)):
        print(f"{title}:")
        for t in tensors:
            print(f"  {t.name:<{width}}  {t.datatype:<10}  {format_dims(t)}")
    _print_diffs(report.max_abs_diff, args.tolerance)
    if report.fused_operators:
        print("fused: " + ", ".join(f"{op} {n}" for op, n in sorted(report.fused_operators.items())))
    print(f"wrote {report.model_path} (opset {report.opset}, {report.task})")
    if report.config_written:
        print(f"wrote {report.config_path}")
    else:
        print(f"kept {report.config_path} (--overwrite-config replaces it)")
    return 0


def _print_diffs(diffs: dict[str, float], tolerance: float) -> None:
    width = max([len("output"), *(len(name) for name in diffs)])
    print(f"ONNX Runtime vs PyTorch on random inputs (tolerance {tolerance:g}):")
    print(f"  {'output':<{width}}  max abs diff")
    for name, diff in diffs.items():
        verdict = "ok" if diff <= tolerance else "OVER"
        print(f"  {name:<{width}}  {diff:<12.3g}  {verdict}")


def _inspect(args: argparse.Namespace) -> int:
    import json

    from .tools.inspect_model import InspectError, inspect_model, render_text, to_json

    try:
        info = inspect_model(args.model_file)
    except InspectError as exc:
        print(f"modelsvc inspect: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_json(info), indent=2))
    else:
        sys.stdout.write(render_text(info))
    return 0


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
    if args.command == "export":
        return _export(args)
    if args.command == "inspect":
        return _inspect(args)
    logging.basicConfig(
        level=logging.DEBUG if args.log_verbose > 0 else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s] %(message)s",
    )
    from .repository import is_remote
    from .server import ServeOptions, serve
    from .server._cache import CacheConfigError, parse_cache_config
    from .server._models import ModelControlMode
    from .server._restricted import RestrictedApis, RestrictionError
    from .server._tracing import TraceConfigError, parse_trace_config

    try:
        trace = parse_trace_config(args.trace_config)
        cache = parse_cache_config(args.cache_config)
        http_restricted = RestrictedApis.parse_http(args.http_restricted_api)
        grpc_restricted = RestrictedApis.parse_grpc(args.grpc_restricted_protocol)
    except (TraceConfigError, CacheConfigError, RestrictionError) as exc:
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
    options = ServeOptions(
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
        strict_model_config=args.strict_model_config,
        disable_auto_complete_config=args.disable_auto_complete_config,
        exit_on_error=args.exit_on_error,
        http_max_input_size=args.http_max_input_size,
        grpc_max_message_size=args.grpc_max_message_size,
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
