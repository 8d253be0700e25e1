"""The whole export: load, export, optimize, check in a scratch folder, then move model.onnx in and write
config.pbtxt. A failed export leaves no half-made model folder (nor a new empty repository) behind.
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

from ..inspect_model import TensorInfo, onnx_tensors
from ._check import check
from ._config import config_mismatches, config_tensor, make_config, write_text
from ._errors import ExportCheckError, ExportUsageError
from ._inputs import SEED, TRACE_SHAPE, random_inputs
from ._load import Torch, import_torch, load, transformers_quiet
from ._onnx import default_opset, quiet_torch_export, torch_export
from ._optimize import optimize
from ._options import ExportOptions, ExportReport, validate
from ._wrapper import Plan, make_plan, wrap

__all__ = ["export_model"]

_MODEL_FILE = "model.onnx"
_CONFIG_FILE = "config.pbtxt"
# ONNX's protobuf limit is 2 GiB; above this, weights go to an external data file next to model.onnx
_EXTERNAL_DATA_BYTES = 1_900_000_000


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


@dataclass(frozen=True)
class _Exported:
    """What the scratch-folder stage hands back."""

    max_abs_diff: dict[str, float]
    fused_operators: dict[str, int]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    opset: int


def _export_into(
    options: ExportOptions,
    mods: Torch,
    model: Any,
    config: Any,
    plan: Plan,
    model_dir: Path,
    timings: dict[str, float],
) -> _Exported:
    """Export, optimize and check in a scratch folder inside ``model_dir``; move model.onnx in when it passes."""
    log = options.log
    version_dir = model_dir / str(options.version)
    with tempfile.TemporaryDirectory(prefix=".export-", dir=model_dir) as scratch:
        work = Path(scratch)
        final_dir = work / "final"
        final_dir.mkdir()
        exported = work / "exported" / _MODEL_FILE if options.optimize else final_dir / _MODEL_FILE
        exported.parent.mkdir(exist_ok=True)

        started = time.monotonic()
        trace = random_inputs(np.random.default_rng(SEED), config, plan, *TRACE_SHAPE, pad=True)
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
            fused = optimize(exported, final_dir / _MODEL_FILE, config, large)
            timings["optimize"] = time.monotonic() - started
            shown = ", ".join(f"{op} {n}" for op, n in sorted(fused.items())) or "nothing"
            log(f"optimized in {timings['optimize']:.1f} s; fused {shown}")
            if not fused.get("Attention") and not fused.get("MultiHeadAttention"):
                log(
                    "warning: ONNX Runtime's optimizer fused no attention: the model's attention subgraph is not "
                    "one its BERT fusion matches; the model is correct, it only runs without the fused kernel"
                )

        started = time.monotonic()
        reference = wrap(mods.torch, model, plan, prepared_mask=False)
        diffs, where = check(mods, reference, final_dir / _MODEL_FILE, config, plan)
        timings["check"] = time.monotonic() - started
        log(f"checked against PyTorch in {timings['check']:.1f} s")
        over = {name: d for name, d in diffs.items() if not d <= options.tolerance}
        if over:
            name, diff = max(over.items(), key=lambda item: item[1])
            raise ExportCheckError(
                f"ONNX Runtime and PyTorch differ on output {name!r}: max abs diff {diff:.3g} > tolerance "
                f"{options.tolerance:g} ({where[name]}); {_MODEL_FILE} not written",
                diffs,
            )

        onnx_model = onnx.load(str(final_dir / _MODEL_FILE), load_external_data=False)
        full_inputs, full_outputs = onnx_tensors(onnx_model)
        batched = options.max_batch_size > 0
        inputs = [config_tensor(t, batched) for t in full_inputs]
        outputs = [config_tensor(t, batched) for t in full_outputs]
        opset = default_opset(onnx_model)
        del onnx_model

        version_dir.mkdir(exist_ok=True)
        for item in final_dir.iterdir():
            os.replace(item, version_dir / item.name)
    return _Exported(diffs, fused, inputs, outputs, opset)


def export_model(options: ExportOptions) -> ExportReport:
    """Export, check and write one model; see ``modelsvc.tools.export`` for the steps."""
    validate(options)
    log = options.log
    mods = import_torch()
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
        done = _export_into(options, mods, model, config, plan, model_dir, timings)
    except BaseException:
        for folder in created:  # leave no half-made model folder (nor a new empty repository) behind
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    model_path = version_dir / _MODEL_FILE

    config_path = model_dir / _CONFIG_FILE
    written = options.overwrite_config or not config_path.exists()
    if written:
        write_text(config_path, make_config(options, done.inputs, done.outputs))
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
        max_abs_diff=done.max_abs_diff,
        fused_operators=done.fused_operators,
        opset=done.opset,
        task=task,
        timings=timings,
    )
