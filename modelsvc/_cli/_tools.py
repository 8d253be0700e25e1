"""The model tools' commands: ``modelsvc export`` (PyTorch to ONNX), ``inspect`` (a model file's tensors) and
``stubgen`` (a typed client module for one model). Their heavy imports happen inside ``run``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._types import non_negative, positive, tolerance

# the choices of `modelsvc export`, as modelsvc.tools.export names them (a test checks that they agree);
# written out here so that building the parser imports neither onnx nor the export code
TASKS = ("auto", "feature-extraction", "sequence-classification", "token-classification")
POOLINGS = ("none", "mean", "cls")
INT_DTYPES = ("int64", "int32")
KINDS = ("KIND_CPU", "KIND_GPU")
FORMATS = ("onnx", "torchscript", "openvino")
PRECISIONS = ("fp32", "bf16", "int8")


def add_export(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = commands.add_parser(
        "export",
        help="export a transformers PyTorch model to ONNX, TorchScript or OpenVINO, check it, write its config",
        description="Export a transformers model to <DIR>/<NAME>/<VERSION>/model.onnx with torch.onnx's dynamo "
        "exporter (dynamic batch and sequence axes), or to model.pt (torch.jit.trace, platform pytorch_libtorch) "
        "or model.xml + model.bin (OpenVINO IR, backend openvino); in fp32, bf16 or int8. Check the model's own "
        "runtime against PyTorch fp32 on random inputs (fp32: max abs diff <= --tolerance; bf16, int8: cosine "
        "similarity >= --min-cosine), and write <DIR>/<NAME>/config.pbtxt (an existing one is kept unless "
        "--overwrite-config). Needs modelsvc[export] (and modelsvc[openvino] for openvino). Exit status: 0 "
        "written, 1 the check or the export failed (nothing written), 2 usage.",
    )
    e.add_argument("model", metavar="MODEL", help="a local model folder, or a hub name already in the cache")
    e.add_argument("--model-repository", required=True, type=Path, metavar="DIR")
    e.add_argument("--model-name", required=True, metavar="NAME")
    e.add_argument("--version", dest="model_version", type=positive, default=1, metavar="N", help="default 1")
    e.add_argument("--task", choices=TASKS, default="auto", help="default: from the model's config")
    e.add_argument(
        "--pooling",
        choices=POOLINGS,
        default="none",
        help="feature-extraction: add output sentence_embedding, the mean over unmasked tokens or the first token",
    )
    e.add_argument("--normalize", action="store_true", help="L2-normalize sentence_embedding")
    e.add_argument("--opset", type=positive, default=18, metavar="N", help="ONNX opset (default 18)")
    e.add_argument(
        "--int-dtype", choices=INT_DTYPES, default="int64", help="datatype of the integer inputs (default int64)"
    )
    e.add_argument(
        "--optimize", action="store_true", help="run ONNX Runtime's transformer optimizer (attention fusion)"
    )
    e.add_argument(
        "--format",
        dest="export_format",
        choices=FORMATS,
        default="onnx",
        help="onnx (onnxruntime), torchscript (pytorch_libtorch) or openvino (default onnx)",
    )
    e.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="fp32 (default); bf16: torchscript bfloat16 weights, openvino HINT_BF16 (f32 runs where the CPU "
        "has no bf16); int8: onnx dynamic quantization, openvino NNCF int8 weights (with --calibration: "
        "activations quantized too)",
    )
    e.add_argument(
        "--calibration",
        metavar="FILE|auto",
        help="int8: quantize the activations too (onnx: static QDQ; openvino: NNCF post-training quantization), "
        "their ranges measured on windows of this text: a .json file's strings, a text file's lines, or auto "
        "(modelsvc's own sample text); checked on held-out windows of it as well as on random inputs",
    )
    e.add_argument(
        "--min-cosine",
        type=float,
        default=None,
        metavar="X",
        help="bf16 and int8: the smallest cosine similarity to PyTorch fp32 accepted for each row of the pooled "
        "output (sentence_embedding; every output without pooling) (default 0.999; 0.99 with --calibration)",
    )
    e.add_argument("--max-batch-size", type=non_negative, default=8, metavar="N", help="default 8; 0: no batching")
    e.add_argument("--no-dynamic-batching", dest="dynamic_batching", action="store_false")
    e.add_argument("--max-queue-delay-microseconds", type=non_negative, default=0, metavar="N")
    e.add_argument("--preferred-batch-size", type=positive, nargs="+", default=[], metavar="N")
    e.add_argument("--instance-count", type=positive, default=1, metavar="N")
    e.add_argument("--kind", choices=KINDS, default="KIND_CPU")
    e.add_argument(
        "--tolerance", type=tolerance, default=1e-4, metavar="X", help="largest max abs difference (default 1e-4)"
    )
    e.add_argument("--overwrite-config", action="store_true", help="replace an existing config.pbtxt")


def add_inspect(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    i = commands.add_parser(
        "inspect",
        help="show a model file's inputs, outputs, datatypes, dims and opsets",
        description="Show what an ONNX model (or, where TensorRT is installed, a .plan/.engine) takes and "
        "gives: tensor names, Triton datatypes, dims (-1 dynamic, with the symbolic name), opsets, IR version, "
        "producer and parameter count.",
    )
    i.add_argument("model_file", type=Path, metavar="MODEL_FILE")
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_stubgen(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def run_export(args: argparse.Namespace) -> int:
    from ..tools.export import ExportCheckError, ExportError, ExportOptions, ExportUsageError, export_model
    from ..tools.inspect_model import format_dims

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
        format=args.export_format,
        precision=args.precision,
        min_cosine=args.min_cosine,
        calibration=args.calibration,
        overwrite_config=args.overwrite_config,
        log=lambda line: print(f"modelsvc export: {line}", file=sys.stderr, flush=True),
    )
    try:
        report = export_model(options)
    except ExportCheckError as exc:
        _print_diffs(exc.max_abs_diff, exc.min_cosine, args)
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
    _print_diffs(report.max_abs_diff, report.min_cosine, args)
    if report.text_min_cosine:
        cosines = ", ".join(f"{name} {value:.6f}" for name, value in report.text_min_cosine.items())
        print(f"on held-out windows of the calibration text ({report.calibration_windows} calibrated on): "
              f"min cosine {cosines}")  # fmt: skip
        print(f"kept in float: {len(report.float_kept_names)} MatMuls, {report.float_kept}")
    if report.fused_operators:
        print("fused: " + ", ".join(f"{op} {n}" for op, n in sorted(report.fused_operators.items())))
    if report.ran_precision and report.precision != "fp32":
        print(f"OpenVINO's CPU plugin ran at {report.ran_precision} (its INFERENCE_PRECISION_HINT, read back)")
    made = f"opset {report.opset}, " if report.opset else ""
    print(f"wrote {report.model_path} ({made}{report.format} {report.precision}, {report.task})")
    if report.config_written:
        print(f"wrote {report.config_path}")
    else:
        print(f"kept {report.config_path} (--overwrite-config replaces it)")
    return 0


def _print_diffs(diffs: dict[str, float], cosines: dict[str, float], args: argparse.Namespace) -> None:
    width = max([len("output"), *(len(name) for name in diffs)])
    from ..tools.export import CALIBRATED_MIN_COSINE

    fp32 = args.precision == "fp32"
    calibrated = CALIBRATED_MIN_COSINE if args.calibration is not None else 0.999
    limit = args.min_cosine if args.min_cosine is not None else calibrated
    bound = f"tolerance {args.tolerance:g}" if fp32 else f"min cosine {limit:g}"
    print(f"{args.export_format} {args.precision} vs PyTorch fp32 on random inputs ({bound}):")
    print(f"  {'output':<{width}}  max abs diff  min cosine")
    for name, diff in diffs.items():
        cosine = cosines.get(name, float("nan"))
        if fp32:
            verdict = "ok" if diff <= args.tolerance else "OVER"
        elif name != "sentence_embedding" and "sentence_embedding" in diffs:
            verdict = "(reported)"  # the bound is on the pooled output
        else:
            verdict = "ok" if cosine >= limit else "UNDER"
        print(f"  {name:<{width}}  {diff:<12.3g}  {cosine:<10.6f}  {verdict}")


def run_inspect(args: argparse.Namespace) -> int:
    import json

    from ..tools.inspect_model import InspectError, inspect_model, render_text, to_json

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


def run_stubgen(args: argparse.Namespace) -> int:
    from ..client import ClientError, ConnectError, ModelNotFound
    from ..client import Timeout as ClientTimeout
    from ..tools.stubgen import generate

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
