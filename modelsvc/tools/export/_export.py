"""The whole export: load, export (ONNX, then optimize, quantize or convert to OpenVINO; or trace to
TorchScript), check in a scratch folder, then move the model files in and write config.pbtxt. A failed
export leaves no half-made model folder (nor a new empty repository) behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .._inspect_formats import openvino_tensors
from ..inspect_model import TensorInfo, onnx_tensors
from ._calibrate import CALIBRATION_WINDOWS, CHECK_WINDOWS, calibration_texts, padded_batches, text_windows
from ._check import Comparison, Run, check
from ._config import config_mismatches, config_tensor, make_config, write_text
from ._errors import ExportCheckError, ExportUsageError
from ._formats import (
    BF16_PARAMETER,
    OPENVINO_HINT,
    import_openvino,
    onnx_int8,
    onnx_runner,
    openvino_convert,
    openvino_runner,
    torchscript_export,
    torchscript_runner,
)
from ._inputs import SEED, TRACE_SHAPE, Feeds, random_inputs
from ._load import Torch, import_torch, load, transformers_quiet
from ._onnx import default_opset, quiet_torch_export, torch_export
from ._optimize import optimize
from ._options import ExportOptions, ExportReport, min_cosine, validate
from ._quantize import FLOAT_KEPT, float_kept_onnx, float_kept_openvino, onnx_int8_static, openvino_int8_static
from ._wrapper import Plan, make_plan, wrap

__all__ = ["export_model"]

_MODEL_FILES = {"onnx": "model.onnx", "torchscript": "model.pt", "openvino": "model.xml"}
_RUNTIMES = {"onnx": "ONNX Runtime", "torchscript": "TorchScript", "openvino": "OpenVINO"}
_ONNX_FILE = "model.onnx"
_CONFIG_FILE = "config.pbtxt"
# ONNX's protobuf limit is 2 GiB; above this, weights go to an external data file next to model.onnx
_EXTERNAL_DATA_BYTES = 1_900_000_000


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


@dataclass(frozen=True)
class _Exported:
    """What the scratch-folder stage hands back."""

    comparison: Comparison
    fused_operators: dict[str, int]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    opset: int
    ran_precision: str
    parameters: dict[str, str]
    #: calibrated int8: the comparison on held-out windows of the calibration text, the layers kept in float
    text: Comparison | None = None
    float_kept: tuple[str, ...] = ()


def _onnx_stage(
    options: ExportOptions, mods: Torch, model: Any, config: Any, plan: Plan, work: Path, final: Path,
    trace: Feeds, timings: dict[str, float], windows: list[Feeds],
) -> tuple[dict[str, int], int]:
    """Export to ONNX at ``final`` (optimized when asked), plain at ``work/exported`` otherwise kept there."""
    log = options.log
    direct = options.format == "onnx" and not options.optimize and options.precision == "fp32"
    exported = final if direct else work / "exported" / _ONNX_FILE
    exported.parent.mkdir(exist_ok=True)
    started = time.monotonic()
    module = wrap(mods.torch, model, plan, prepared_mask=options.optimize)
    program = torch_export(mods, module, trace, plan, options.opset)
    produced = default_opset(program.model_proto)
    if produced != options.opset:
        raise ExportUsageError(
            f"torch.onnx wrote opset {produced}, not the {options.opset} asked for "
            "(its converter could not take this model there); choose another opset, 18 is the exporter's own"
        )
    with quiet_torch_export():
        program.save(str(exported))
    del program
    timings["export"] = time.monotonic() - started
    log(f"exported with opset {produced} in {timings['export']:.1f} s")

    fused: dict[str, int] = {}
    if options.optimize:
        started = time.monotonic()
        large = _folder_bytes(exported.parent) > _EXTERNAL_DATA_BYTES
        fused = optimize(exported, final, config, large)
        timings["optimize"] = time.monotonic() - started
        shown = ", ".join(f"{op} {n}" for op, n in sorted(fused.items())) or "nothing"
        log(f"optimized in {timings['optimize']:.1f} s; fused {shown}")
        if not fused.get("Attention") and not fused.get("MultiHeadAttention"):
            log(
                "warning: ONNX Runtime's optimizer fused no attention: the model's attention subgraph is not "
                "one its BERT fusion matches; the model is correct, it only runs without the fused kernel"
            )
    elif options.format == "onnx" and windows:
        started = time.monotonic()
        onnx_int8_static(exported, final, windows, log)
        timings["quantize"] = time.monotonic() - started
        log(f"quantized (calibrated int8, ONNX Runtime static QDQ) in {timings['quantize']:.1f} s")
    elif options.format == "onnx" and options.precision == "int8":
        started = time.monotonic()
        onnx_int8(exported, final)
        timings["quantize"] = time.monotonic() - started
        log(f"quantized (ONNX Runtime dynamic int8, per channel) in {timings['quantize']:.1f} s")
    return fused, produced


def _tensors_of_run(plan: Plan, run: Run, trace: Feeds) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """TorchScript records no datatypes nor shapes: the inputs as traced, the outputs as a run gives them."""
    int_type = "TYPE_INT32" if plan.int_dtype == "int32" else "TYPE_INT64"
    axes = ("batch", "sequence")
    inputs = [TensorInfo(name, int_type, (-1, -1), axes) for name in plan.input_names]
    outputs = []
    for name, value in zip(plan.output_names, run(trace), strict=True):
        lead = 2 if name in plan.per_token else 1
        dims = (-1,) * lead + tuple(int(d) for d in value.shape[lead:])
        outputs.append(TensorInfo(name, "TYPE_FP32", dims, axes[:lead]))
    return inputs, outputs


def _export_into(
    options: ExportOptions,
    mods: Torch,
    model: Any,
    config: Any,
    plan: Plan,
    model_dir: Path,
    timings: dict[str, float],
    texts: list[str] | None = None,
) -> _Exported:
    """Export (and optimize, quantize, convert) and check in a scratch folder inside ``model_dir``; move the
    model files into the version folder when the check passes."""
    log = options.log
    version_dir = model_dir / str(options.version)
    model_file = _MODEL_FILES[options.format]
    ov = import_openvino(options.precision) if options.format == "openvino" else None
    with tempfile.TemporaryDirectory(prefix=".export-", dir=model_dir) as scratch:
        work = Path(scratch)
        final_dir = work / "final"
        final_dir.mkdir()
        final = final_dir / model_file
        trace = random_inputs(np.random.default_rng(SEED), config, plan, *TRACE_SHAPE, pad=True)
        fused: dict[str, int] = {}
        opset = 0
        ran = ""
        parameters: dict[str, str] = {}
        windows: list[Feeds] = []
        held_out: list[Feeds] = []
        kept: tuple[str, ...] = ()
        if texts is not None:
            started = time.monotonic()
            counts = (CALIBRATION_WINDOWS, CHECK_WINDOWS)
            windows, held_out = text_windows(mods.transformers, _source(options), config, plan, texts, counts)
            timings["calibration_text"] = time.monotonic() - started
        if options.format == "torchscript":
            started = time.monotonic()
            torchscript_export(mods, model, plan, trace, final, options.precision)
            timings["export"] = time.monotonic() - started
            log(f"traced to TorchScript ({options.precision}) in {timings['export']:.1f} s")
            run = torchscript_runner(mods, final, plan)
        else:
            fused, opset = _onnx_stage(options, mods, model, config, plan, work, final, trace, timings, windows)
            if ov is not None:
                started = time.monotonic()
                quantized: list[str] = []

                def calibrate(ir: Any) -> Any:
                    quantized.extend(float_kept_openvino(ir))
                    return openvino_int8_static(ov, ir, windows, log)

                openvino_convert(ov, work / "exported" / _ONNX_FILE, final, options.precision,
                                 calibrate if windows else None)  # fmt: skip
                kept = tuple(quantized)
                timings["convert"] = time.monotonic() - started
                what = "calibrated int8" if windows else options.precision
                log(f"converted to OpenVINO IR ({what}) in {timings['convert']:.1f} s")
                run, ran = openvino_runner(ov, final, plan, options.precision, calibrated=bool(windows))
                if options.precision == "bf16":
                    parameters[BF16_PARAMETER[0]] = BF16_PARAMETER[1]
                    if ran != "bf16":
                        log(
                            f"note: this CPU's OpenVINO plugin runs {ran} for {OPENVINO_HINT} bf16 (no native "
                            "bf16: AVX-512 BF16 or AMX); the check measured what it ran"
                        )
            else:
                run = onnx_runner(final, plan)
                if windows:
                    kept = tuple(float_kept_onnx(onnx.load(str(work / "exported" / _ONNX_FILE))))

        started = time.monotonic()
        reference = wrap(mods.torch, model, plan, prepared_mask=False)
        comparison = check(mods, reference, run, config, plan)
        text = check(mods, reference, run, config, plan, padded_batches(held_out, 4)) if held_out else None
        timings["check"] = time.monotonic() - started
        log(f"checked against PyTorch in {timings['check']:.1f} s")
        _verdict(options, comparison, model_file, text)

        if options.format == "onnx":
            onnx_model = onnx.load(str(final), load_external_data=False)
            full_inputs, full_outputs = onnx_tensors(onnx_model)
            opset = default_opset(onnx_model)
            del onnx_model
        elif ov is not None:
            full_inputs, full_outputs = openvino_tensors(ov.Core().read_model(str(final)))
        else:
            ran_inputs, ran_outputs = _tensors_of_run(plan, run, trace)
            full_inputs, full_outputs = tuple(ran_inputs), tuple(ran_outputs)
        batched = options.max_batch_size > 0
        inputs = [config_tensor(t, batched) for t in full_inputs]
        outputs = [config_tensor(t, batched) for t in full_outputs]

        version_dir.mkdir(exist_ok=True)
        for item in final_dir.iterdir():
            os.replace(item, version_dir / item.name)
    return _Exported(comparison, fused, inputs, outputs, opset, ran, parameters, text, kept)


def _source(options: ExportOptions) -> str:
    return str(Path(options.model).expanduser()) if options.model.startswith("~") else options.model


def _verdict(options: ExportOptions, comparison: Comparison, model_file: str, text: Comparison | None) -> None:
    """Raise ExportCheckError where an output is over the tolerance (fp32) or under the cosine (bf16, int8; for
    calibrated int8, on the held-out windows of its calibration text)."""
    if options.precision == "fp32":
        over = {n: d for n, d in comparison.max_abs_diff.items() if not d <= options.tolerance}
        if over:
            name, diff = max(over.items(), key=lambda item: item[1])
            raise ExportCheckError(
                f"{_RUNTIMES[options.format]} and PyTorch differ on output {name!r}: max abs diff {diff:.3g} > "
                f"tolerance {options.tolerance:g} ({comparison.where[name]}); {model_file} not written",
                comparison.max_abs_diff,
                comparison.min_cosine,
            )
        return
    bound = min_cosine(options)
    # calibrated int8 is bounded on held-out windows of its calibration text: random token ids make activations no
    # text makes, outside the ranges measured (MiniLM: 0.948 on random ids, 0.9976 on text); they are reported
    checked = [("windows of the calibration text", text)] if text is not None else [("random inputs", comparison)]
    for inputs, measured in checked:
        # the bound is on what a service uses: the pooled output where there is one (a token's vector moves more
        # than the mean of its sentence); every output's cosine is reported
        cosines = measured.min_cosine
        bounded = [n for n in cosines if n == "sentence_embedding"] or list(cosines)
        under = {n: cosines[n] for n in bounded if not cosines[n] >= bound}
        if under:
            name, cosine = min(under.items(), key=lambda item: item[1])
            raise ExportCheckError(
                f"the {options.format} {options.precision} model is too far from PyTorch fp32 on output {name!r} "
                f"({inputs}): cosine similarity {cosine:.5f} < {bound:g} (--min-cosine); {model_file} not written",
                measured.max_abs_diff,
                measured.min_cosine,
            )


def export_model(options: ExportOptions) -> ExportReport:
    """Export, check and write one model; see ``modelsvc.tools.export`` for the steps."""
    validate(options)
    log = options.log
    texts = calibration_texts(options.calibration) if options.calibration is not None else None
    mods = import_torch()
    if options.format == "openvino":  # before the model is loaded: a missing extra is a usage error at once
        import_openvino(options.precision)
    timings: dict[str, float] = {}
    started = time.monotonic()
    with transformers_quiet(mods.transformers):
        loaded = load(mods, options)
    timings["load"] = time.monotonic() - started
    model, config, task = loaded.model, loaded.config, loaded.task
    plan = make_plan(options, model, config, task, loaded.tokenizer_inputs)
    log(f"loaded {options.model} for {task} in {timings['load']:.1f} s; inputs {', '.join(plan.input_names)}")

    model_dir = options.model_repository / options.model_name
    version_dir = model_dir / str(options.version)
    # the folders this export creates (the repository too when it is new), deepest first
    created = [p for p in (model_dir, *model_dir.parents) if not p.exists()]
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportUsageError(f"cannot create {model_dir}: {exc}") from None
    try:
        done = _export_into(options, mods, model, config, plan, model_dir, timings, texts)
    except BaseException:
        for folder in created:  # leave no half-made model folder (nor a new empty repository) behind
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    model_path = version_dir / _MODEL_FILES[options.format]

    config_path = model_dir / _CONFIG_FILE
    written = options.overwrite_config or not config_path.exists()
    if written:
        write_text(config_path, make_config(options, done.inputs, done.outputs, done.parameters))
    else:
        log(f"kept the existing {config_path} (--overwrite-config replaces it)")
        for problem in config_mismatches(config_path, done.inputs, done.outputs):
            log(f"warning: the kept {config_path} does not fit the new model: {problem}")
    if options.max_batch_size == 0 and options.dynamic_batching:
        log("no dynamic_batching written: it needs max_batch_size > 0")
    return ExportReport(
        model_path=model_path,
        config_path=config_path,
        config_written=written,
        inputs=done.inputs,
        outputs=done.outputs,
        max_abs_diff=done.comparison.max_abs_diff,
        fused_operators=done.fused_operators,
        opset=done.opset,
        task=task,
        timings=timings,
        format=options.format,
        precision=options.precision,
        min_cosine=done.comparison.min_cosine,
        ran_precision=done.ran_precision,
        calibration_windows=CALIBRATION_WINDOWS if texts is not None else 0,
        float_kept=FLOAT_KEPT if texts is not None else "",
        float_kept_names=done.float_kept,
        text_min_cosine=done.text.min_cosine if done.text is not None else {},
    )
