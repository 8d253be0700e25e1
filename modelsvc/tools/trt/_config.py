"""The config.pbtxt side of ``modelsvc build --from-config``: read the source model's config, find its ONNX
file, and make the plan's config from it.

The plan's config is the source's with what a plan changes: ``platform: "tensorrt_plan"`` (no ``backend``),
the default file name (``model.plan``), instance groups on ``KIND_GPU``; batching, inputs, outputs, warmup
and the rest carry over. ONNX Runtime's own settings (its ``parameters`` and execution accelerators) and the
version policy (the plan is one version) are dropped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ._errors import BuildUsageError

__all__ = ["PLAN_FILENAME", "PLAN_PLATFORM", "config_text", "plan_config", "read_config", "source_onnx", "write_atomic"]

PLAN_PLATFORM = "tensorrt_plan"
PLAN_FILENAME = "model.plan"
_CONFIG_FILENAME = "config.pbtxt"
_ONNX_FILENAME = "model.onnx"


def read_config(model_dir: Path) -> Any:
    """Parse ``model_dir/config.pbtxt``; a missing or unparsable file is a BuildUsageError naming it."""
    path = model_dir / _CONFIG_FILENAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BuildUsageError(
            f"--from-config: {path} does not exist (expected REPO/NAME with a config.pbtxt)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BuildUsageError(f"--from-config: cannot read {path}: {exc}") from exc
    try:
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise BuildUsageError(f"--from-config: {path} does not parse: {exc}") from exc
    if not config.name:
        config.name = model_dir.name
    return config


def source_onnx(model_dir: Path, config: Any) -> Path:
    """The ONNX file of the source model: its ``default_model_filename`` (or model.onnx) in the highest version."""
    filename = config.default_model_filename or _ONNX_FILENAME
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit() and p.is_dir())
    if not versions:
        raise BuildUsageError(f"--from-config: {model_dir} has no version folders (like 1/) holding {filename}")
    path = model_dir / str(versions[-1]) / filename
    if not path.is_file():
        raise BuildUsageError(
            f"--from-config: {path} does not exist; build it first (e.g. `modelsvc export`) or give --onnx FILE"
        )
    return path


def plan_config(source: Any, name: str) -> Any:
    """The plan's ModelConfig, made from the source model's (see the module's docstring)."""
    config = model_config_pb2.ModelConfig()
    config.CopyFrom(source)
    config.name = name
    config.platform = PLAN_PLATFORM
    config.ClearField("backend")
    config.ClearField("runtime")
    config.ClearField("default_model_filename")
    config.ClearField("version_policy")
    config.ClearField("parameters")
    if config.HasField("optimization"):
        config.optimization.ClearField("execution_accelerators")
        if config.optimization == model_config_pb2.ModelOptimizationPolicy():
            config.ClearField("optimization")
    if not config.instance_group:
        config.instance_group.add(count=1)
    for group in config.instance_group:
        group.kind = model_config_pb2.ModelInstanceGroup.Kind.KIND_GPU
    return config


def config_text(config: Any, onnx_path: Path, precision: str) -> str:
    header = (
        f"# Written by `modelsvc build` from {onnx_path} ({precision}). A plan runs only on the GPU model and\n"
        "# TensorRT version that built it: rebuild it for another.\n"
    )
    return header + str(text_format.MessageToString(config))


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name next to it, so that no reader sees half a file."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
