"""The ONNX export itself: torch.onnx's dynamo exporter, batch and sequence axes dynamic, quiet.

torch.onnx's older TorchScript exporter gives wrong results for BERT under transformers 5 (checked with
torch 2.13), so only the dynamo exporter is used. The integer inputs have the dtype of the tracing
inputs (int64 or int32; the wrapper casts them to int64 inside the graph).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import onnx

from ._errors import ExportError, first_line
from ._inputs import Feeds
from ._load import Torch
from ._wrapper import Plan

__all__ = ["default_opset", "quiet", "quiet_torch_export", "torch_export"]


@contextmanager
def quiet(*names: str) -> Iterator[None]:
    """Warnings, and the named loggers below ERROR, kept out of the way: the converters' deprecations and hints
    are not the user's to act on."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def quiet_torch_export() -> AbstractContextManager[None]:
    """torch.onnx's deprecations and hints kept out of the way."""
    return quiet("torch.onnx", "torch.export", "torch._export", "onnxscript")


def torch_export(mods: Torch, module: Any, feeds: Feeds, plan: Plan, opset: int) -> Any:
    torch = mods.torch
    args = tuple(torch.from_numpy(feeds[name]) for name in plan.input_names)
    axes = {0: "batch", 1: "sequence"}
    try:
        with quiet_torch_export(), torch.no_grad():
            program = torch.onnx.export(
                module,
                args,
                dynamo=True,
                input_names=list(plan.input_names),
                output_names=list(plan.output_names),
                dynamic_shapes={name: axes for name in plan.input_names},
                opset_version=opset,
                verbose=False,
            )
    except Exception as exc:  # torch.export and the ONNX translation raise many kinds
        raise ExportError(f"torch.onnx could not export the model: {first_line(exc)}") from exc
    if program is None:  # pragma: no cover - dynamo=True always returns a program
        raise ExportError("torch.onnx returned no program")
    return program


def default_opset(model: onnx.ModelProto) -> int:
    return next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0)
