"""What ``modelsvc export`` is asked to do and what it reports: the choices, the options and their checks.

``ExportOptions`` carries ``modelsvc export``'s flags (``modelsvc._cli`` spells the same choices out, so
that building its parser imports nothing of the export; a test checks that they agree); ``validate``
refuses a bad combination before anything is loaded; ``ExportReport`` is what ``export_model`` hands back.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..inspect_model import TensorInfo
from ._errors import ExportUsageError

__all__ = [
    "CALIBRATED_MIN_COSINE",
    "FORMATS",
    "INT_DTYPES",
    "KINDS",
    "POOLINGS",
    "PRECISIONS",
    "TASKS",
    "ExportOptions",
    "ExportReport",
    "min_cosine",
    "validate",
]

TASKS = ("auto", "feature-extraction", "sequence-classification", "token-classification")
POOLINGS = ("none", "mean", "cls")
INT_DTYPES = ("int64", "int32")
KINDS = ("KIND_CPU", "KIND_GPU")
#: what is written: model.onnx (onnxruntime), model.pt (TorchScript, pytorch_libtorch), model.xml + model.bin
#: (OpenVINO IR, openvino)
FORMATS = ("onnx", "torchscript", "openvino")
#: fp32 as exported; bf16 (torchscript: bfloat16 weights; openvino: INFERENCE_PRECISION_HINT in the config);
#: int8 (onnx: ONNX Runtime's dynamic quantization; openvino: NNCF's int8 weight compression; with a calibration,
#: activations quantized too: onnx static QDQ, openvino NNCF's post-training quantization)
PRECISIONS = ("fp32", "bf16", "int8")
#: the cosine bound of a calibrated int8 export (its default --min-cosine): int8 activations move a pooled vector
#: further than bf16 does (MiniLM: 0.997 at worst on windows of text)
CALIBRATED_MIN_COSINE = 0.99


def _log_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ExportOptions:
    """What to export, and how; the fields are ``modelsvc export``'s flags."""

    #: a local transformers model folder (config.json and weights) or a hub name already in the cache
    model: str
    #: the Triton model repository to write into
    model_repository: Path
    #: the model's folder and name in the repository
    model_name: str
    #: the numbered version folder that receives model.onnx
    version: int = 1
    #: auto (from the config's ``architectures``), feature-extraction, sequence-classification or
    #: token-classification
    task: str = "auto"
    #: feature-extraction only: none, mean (over tokens whose attention_mask is 1, as sentence-transformers
    #: does) or cls (the first token); adds the output ``sentence_embedding`` [batch, hidden]
    pooling: str = "none"
    #: L2-normalize ``sentence_embedding`` inside the graph
    normalize: bool = False
    #: the ONNX operator set to export with
    opset: int = 18
    #: int64 or int32 for the integer inputs; int32 inputs are cast to int64 inside the graph
    int_dtype: str = "int64"
    #: run ONNX Runtime's transformer optimizer (attention fusion) and report what it fused
    optimize: bool = False
    #: config.pbtxt ``max_batch_size``; 0 writes a model without Triton batching (dims then include the batch)
    max_batch_size: int = 8
    #: write a ``dynamic_batching`` block (needs max_batch_size > 0)
    dynamic_batching: bool = True
    #: ``dynamic_batching.max_queue_delay_microseconds``
    max_queue_delay_microseconds: int = 0
    #: ``dynamic_batching.preferred_batch_size``
    preferred_batch_size: tuple[int, ...] = ()
    #: ``instance_group[0].count``
    instance_count: int = 1
    #: ``instance_group[0].kind``: KIND_CPU or KIND_GPU
    kind: str = "KIND_CPU"
    #: the largest max abs difference between ONNX Runtime and PyTorch accepted for any output
    tolerance: float = 1e-4
    #: the format written: onnx, torchscript or openvino
    format: str = "onnx"
    #: fp32, bf16 or int8; a lower precision is checked by cosine similarity instead of the tolerance
    precision: str = "fp32"
    #: the smallest cosine similarity to PyTorch fp32 accepted for any row of the pooled output (bf16 and int8);
    #: None: 0.999, or CALIBRATED_MIN_COSINE for calibrated int8
    min_cosine: float | None = None
    #: int8 only: quantize the activations too, with ranges measured on this text: a file (``.json``: its strings;
    #: else its lines) or ``auto`` (modelsvc's own sample text); None: weights only (openvino) or dynamic (onnx)
    calibration: str | None = None
    #: replace an existing config.pbtxt; without it an existing one is kept
    overwrite_config: bool = False
    #: where progress lines go (stderr by default)
    log: Callable[[str], None] = field(default=_log_stderr, compare=False, repr=False)


@dataclass(frozen=True)
class ExportReport:
    """What ``export_model`` wrote and measured."""

    model_path: Path
    config_path: Path
    #: False when an existing config.pbtxt was kept
    config_written: bool
    #: the tensors as the config declares them: Triton datatypes, dims without the batch dim when
    #: max_batch_size > 0, -1 for a dynamic dim
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    #: per output, the largest abs difference between ONNX Runtime and PyTorch over the check's inputs
    #: (of the optimized model when optimizing)
    max_abs_diff: dict[str, float]
    #: ONNX Runtime's count of each fused operator it produced (only those it produced); empty unless optimizing
    fused_operators: dict[str, int]
    #: the opset of the written model, and the task that was exported
    opset: int = 0
    task: str = ""
    #: seconds spent exporting, optimizing and checking
    timings: dict[str, float] = field(default_factory=dict)
    #: the format and precision written
    format: str = "onnx"
    precision: str = "fp32"
    #: per output, the smallest cosine similarity to PyTorch fp32 of any row (per token where per-token)
    min_cosine: dict[str, float] = field(default_factory=dict)
    #: what the runtime said it ran at, where it says (OpenVINO's compiled INFERENCE_PRECISION_HINT)
    ran_precision: str = ""
    #: calibrated int8: the number of calibration windows, the layers kept in float (in words and by name), and
    #: the smallest cosine of the pooled output on held-out windows of the calibration text
    calibration_windows: int = 0
    float_kept: str = ""
    float_kept_names: tuple[str, ...] = ()
    text_min_cosine: dict[str, float] = field(default_factory=dict)


def min_cosine(options: ExportOptions) -> float:
    """The cosine bound in force: the one asked for, else 0.999 (CALIBRATED_MIN_COSINE for calibrated int8)."""
    if options.min_cosine is not None:
        return options.min_cosine
    return CALIBRATED_MIN_COSINE if options.calibration is not None else 0.999


def validate(options: ExportOptions) -> None:
    """Refuse options that cannot work together, each with a one-line ExportUsageError."""
    def bad(message: str) -> ExportUsageError:
        return ExportUsageError(message)

    if options.task not in TASKS:
        raise bad(f"task {options.task!r} is not one of {', '.join(TASKS)}")
    if options.pooling not in POOLINGS:
        raise bad(f"pooling {options.pooling!r} is not one of {', '.join(POOLINGS)}")
    if options.pooling != "none" and options.task not in ("auto", "feature-extraction"):
        raise bad(f"pooling applies to feature-extraction, not {options.task}")
    if options.normalize and options.pooling == "none":
        raise bad("normalize needs a pooling (mean or cls): it normalizes sentence_embedding")
    if options.int_dtype not in INT_DTYPES:
        raise bad(f"int dtype {options.int_dtype!r} is not one of {', '.join(INT_DTYPES)}")
    if options.kind not in KINDS:
        raise bad(f"kind {options.kind!r} is not one of {', '.join(KINDS)}")
    name = options.model_name
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise bad(f"model name {name!r} cannot be a folder name in a model repository")
    if options.version < 1:
        raise bad(f"version {options.version} must be at least 1")
    if options.opset < 7:
        raise bad(f"opset {options.opset} is older than ONNX Runtime supports")
    if options.max_batch_size < 0:
        raise bad(f"max batch size {options.max_batch_size} cannot be negative")
    if options.max_queue_delay_microseconds < 0:
        raise bad("max queue delay cannot be negative")
    if options.preferred_batch_size:
        if options.max_batch_size == 0 or not options.dynamic_batching:
            raise bad("preferred batch sizes need dynamic batching and a max batch size above 0")
        wrong = [n for n in options.preferred_batch_size if not 1 <= n <= options.max_batch_size]
        if wrong:
            raise bad(f"preferred batch sizes {wrong} are outside 1..{options.max_batch_size} (the max batch size)")
    if options.instance_count < 1:
        raise bad(f"instance count {options.instance_count} must be at least 1")
    if not math.isfinite(options.tolerance) or options.tolerance < 0:
        raise bad(f"tolerance {options.tolerance} must be a number >= 0")
    _validate_format(options)


def _validate_format(options: ExportOptions) -> None:
    fmt, precision = options.format, options.precision
    if fmt not in FORMATS:
        raise ExportUsageError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    if precision not in PRECISIONS:
        raise ExportUsageError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    bound = options.min_cosine
    if bound is not None and (not math.isfinite(bound) or not 0 < bound <= 1):
        raise ExportUsageError(f"min cosine {bound} must be in (0, 1]")
    if options.calibration is not None:
        if precision != "int8":
            raise ExportUsageError("--calibration goes with --precision int8 (it measures the activations' ranges)")
        if not options.calibration.strip():
            raise ExportUsageError("--calibration needs a file or 'auto'")
    if options.optimize and fmt != "onnx":
        raise ExportUsageError(
            f"--optimize is ONNX Runtime's optimizer, for --format onnx; {fmt} is optimized by its own runtime"
        )
    if options.optimize and precision == "int8":
        raise ExportUsageError(
            "--precision int8 with --optimize: ONNX Runtime's quantization of the fused graph loses too "
            "much (cosine 0.81 on all-MiniLM-L6-v2, dynamic); quantize the unfused graph (leave out --optimize)"
        )
    if (fmt, precision) == ("onnx", "bf16"):
        raise ExportUsageError(
            "--precision bf16 is not offered for --format onnx (ONNX Runtime's CPU provider has no bfloat16 "
            "kernels for these operators); use --format openvino or torchscript"
        )
    if (fmt, precision) == ("torchscript", "int8"):
        raise ExportUsageError("--precision int8 is not offered for --format torchscript; use onnx or openvino")
