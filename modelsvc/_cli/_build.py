"""``modelsvc build``: an ONNX model to a TensorRT plan, with trtexec's flag names where trtexec has them.

Building the parser imports nothing of the build (nor onnx, nor TensorRT); ``run`` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._types import positive, tolerance, whole_number

__all__ = ["TOLERANCE_HELP", "add", "run"]

# modelsvc.tools.trt.DEFAULT_TOLERANCES in words (a test checks that they agree)
TOLERANCE_HELP = (
    "fp32 atol 1e-4 rtol 0 (with --tf32: atol 5e-2 rtol 1e-2); fp16 atol 5e-2 rtol 1e-2; "
    "bf16 atol 2e-1 rtol 5e-2; int8 atol 2e-1 rtol 1e-1"
)


_KEEP = "keeping the I/O types and, in fp32, normalizations, softmax and reductions"
_PRECISION_HELP = {
    "fp16": f"convert the model's weights and activations to fp16 before parsing ({_KEEP}; ONNX Runtime's "
    "float16 converter), then build it as typed, with no precision flag",
    "bf16": f"the same in bf16 ({_KEEP}; NVIDIA ModelOpt's AutoCast: pip install 'modelsvc[autocast]')",
    "int8": "build a model quantized with QuantizeLinear/DequantizeLinear nodes as it is; TensorRT 10 only: "
    "calibrate a model without them on --calib-npz/--calib",
}


def _level(text: str) -> int:
    value = whole_number(text, "expected a whole number 0..5")
    if not 0 <= value <= 5:
        raise argparse.ArgumentTypeError(f"must be 0..5, got {value}")
    return value


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = commands.add_parser(
        "build",
        help="build a TensorRT plan from an ONNX model, check it against ONNX Runtime, and write it",
        description="Build a TensorRT plan from an ONNX model on this machine's GPU, run it and ONNX Runtime on "
        "the same inputs (the min, opt and max shapes of every profile, random; or --npz), and write it only "
        "when every output is within the tolerance (|plan - onnx| <= atol + rtol * |onnx|; defaults: "
        f"{TOLERANCE_HELP}). Either --onnx FILE --save-engine OUT.plan with the shape flags, or --from-config "
        "REPO/NAME: profiles from its config.pbtxt (batch 1..max_batch_size, each other -1 dim "
        "1..--max-sequence-length) and NAME/VERSION/model.plan with a config.pbtxt that says "
        'platform: "tensorrt_plan" in --model-repository. Networks are strongly typed on TensorRT 10 and 11: '
        "the plan computes in the ONNX model's own types, so --fp16/--bf16 convert the model before TensorRT "
        "parses it and --int8 takes a model quantized with Q/DQ nodes. Needs modelsvc[tensorrt] and an NVIDIA "
        "GPU. Exit status: 0 written, 1 the build or the check failed, 2 usage (TensorRT missing included).",
    )
    b.add_argument("--onnx", type=Path, metavar="FILE", help="the ONNX model (default with --from-config: its own)")
    b.add_argument("--save-engine", type=Path, metavar="OUT.plan", help="where the plan goes (trtexec --saveEngine)")
    b.add_argument("--from-config", type=Path, metavar="REPO/NAME", help="derive profiles and the plan's config")
    b.add_argument("--model-repository", type=Path, metavar="DIR", help="with --from-config: where the plan goes")
    b.add_argument("--model-name", metavar="NAME", help="with --from-config: the plan model's name (default NAME)")
    b.add_argument("--version", dest="model_version", type=positive, default=1, metavar="N", help="default 1")
    for which in ("min", "opt", "max"):
        b.add_argument(
            f"--{which}-shapes",
            action="append",
            default=[],
            metavar="NAME:AxB[,NAME:CxD]",
            help="repeat for several profiles: the n-th of each shape flag forms profile n",
        )
    b.add_argument(
        "--max-sequence-length",
        type=positive,
        default=512,
        metavar="N",
        help="--from-config: the largest -1 dim other than the batch (default 512, our services' token limit)",
    )
    precision = b.add_mutually_exclusive_group()
    for name, help_text in _PRECISION_HELP.items():
        precision.add_argument(f"--{name}", dest="precision", action="store_const", const=name, help=help_text)
    b.set_defaults(precision="fp32")
    b.add_argument("--tf32", action="store_true", help="allow TF32 math in fp32 layers (off: fp32 stays fp32)")
    b.add_argument(
        "--calib",
        type=Path,
        metavar="CACHE",
        help="--int8 on TensorRT 10, a model without Q/DQ: calibration cache, read if it exists, else written",
    )
    b.add_argument(
        "--calib-npz",
        type=Path,
        metavar="FILE.npz",
        help="--int8 on TensorRT 10, a model without Q/DQ: real inputs to calibrate on (TensorRT 11 has no "
        "calibrator: quantize to Q/DQ first)",
    )
    b.add_argument("--timing-cache", type=Path, metavar="FILE", help="loaded if it exists, saved after the build")
    b.add_argument("--workspace", type=positive, metavar="MiB", help="workspace memory pool limit")
    b.add_argument("--builder-optimization-level", type=_level, metavar="0..5", help="TensorRT's default is 3")
    b.add_argument("--npz", type=Path, metavar="FILE.npz", help="check on these inputs instead of random ones")
    b.add_argument("--atol", type=tolerance, metavar="X", help="the check's absolute tolerance (default: see above)")
    b.add_argument("--rtol", type=tolerance, metavar="X", help="the check's relative tolerance (default: see above)")


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.1f} KiB"


def _print_checks(checks: list[Any], atol: float, rtol: float) -> None:
    from ..tools.compare import render_table

    print(f"plan vs ONNX Runtime (atol {atol:g}, rtol {rtol:g}):")
    for case in checks:
        print(f"  {case.label()}")
        for line in render_table(case.report).splitlines():
            print(f"    {line}")


def run(args: argparse.Namespace) -> int:
    from ..tools.trt import (
        BuildCheckError,
        BuildError,
        BuildOptions,
        BuildUsageError,
        build_plan,
        format_shape,
        precision_counts,
    )

    options = BuildOptions(
        onnx=args.onnx,
        save_engine=args.save_engine,
        from_config=args.from_config,
        model_repository=args.model_repository,
        model_name=args.model_name,
        version=args.model_version,
        min_shapes=tuple(args.min_shapes),
        opt_shapes=tuple(args.opt_shapes),
        max_shapes=tuple(args.max_shapes),
        max_sequence_length=args.max_sequence_length,
        precision=args.precision,
        tf32=args.tf32,
        calib=args.calib,
        calib_npz=args.calib_npz,
        timing_cache=args.timing_cache,
        workspace=args.workspace,
        builder_optimization_level=args.builder_optimization_level,
        npz=args.npz,
        atol=args.atol,
        rtol=args.rtol,
        log=lambda line: print(f"modelsvc build: {line}", file=sys.stderr, flush=True),
    )
    try:
        report = build_plan(options)
    except BuildUsageError as exc:
        print(f"modelsvc build: {exc}", file=sys.stderr)
        return 2
    except BuildCheckError as exc:
        if exc.comparisons:
            first = exc.comparisons[0].report
            _print_checks(exc.comparisons, first.atol, first.rtol)
        print(f"modelsvc build: {exc}", file=sys.stderr)
        return 1
    except BuildError as exc:
        print(f"modelsvc build: {exc}", file=sys.stderr)
        return 1
    print(
        f"built {report.onnx_path} with TensorRT {report.tensorrt_version} ({report.precision}): "
        f"{_size(report.plan_bytes)} in {report.build_seconds:.1f} s"
    )
    for note in report.notes:
        print(note)
    if report.conversion is not None:
        print(f"{report.conversion.describe()} (the converted model was temporary)")
    for index, profile in enumerate(report.profiles):
        ranges = ", ".join(
            f"{name} {format_shape(r.min)}..{format_shape(r.opt)}..{format_shape(r.max)}" for name, r in profile.items()
        )
        print(f"profile {index} (min..opt..max): {ranges}")
    counts = precision_counts(report.layers)
    if report.layers:
        by_precision = ", ".join(f"{p} {n}" for p, n in counts.items()) or "precisions not given"
        print(f"layers: {len(report.layers)} ({by_precision})")
        for layer in report.layers:
            print(f"  {layer.name}  {layer.layer_type}  {'/'.join(layer.precisions) or '-'}")
    else:
        print("layers: TensorRT's engine inspector gave none")
    _print_checks(report.checks, report.atol, report.rtol)
    if report.timing_cache is not None:
        state = "loaded and " if report.timing_cache_loaded else "new, "
        print(f"timing cache {report.timing_cache}: {state}{'saved' if report.timing_cache_saved else 'not saved'}")
    print(f"wrote {report.plan_path}")
    if report.config_path is not None:
        print(f"wrote {report.config_path}")
    return 0
