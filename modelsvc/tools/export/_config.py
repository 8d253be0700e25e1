"""config.pbtxt for an exported model: written from its tensors and the options, or a kept one checked.

An existing config.pbtxt is the user's (they may have tuned it): export keeps it unless told to overwrite,
and warns where it names tensors or datatypes the new model does not have.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ..inspect_model import TensorInfo
from ._errors import ExportError
from ._options import ExportOptions

__all__ = ["FORMAT_BACKENDS", "config_mismatches", "config_tensor", "make_config", "write_text"]


def config_tensor(tensor: TensorInfo, batched: bool) -> TensorInfo:
    if not batched:
        return tensor
    if not tensor.dims or tensor.dims[0] != -1:
        raise ExportError(f"tensor {tensor.name!r} has dims {list(tensor.dims)}: its first axis is not a dynamic batch")
    return TensorInfo(tensor.name, tensor.datatype, tensor.dims[1:], tensor.names()[1:])


#: per format, the config's backend (or platform, where Triton names the runtime by it)
FORMAT_BACKENDS = {
    "onnx": ("backend", "onnxruntime"),
    "torchscript": ("platform", "pytorch_libtorch"),
    "openvino": ("backend", "openvino"),
}


def make_config(
    options: ExportOptions,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    parameters: dict[str, str] | None = None,
) -> str:
    """The text of config.pbtxt for the model's tensors (as the config declares them) and the options."""
    field_name, runtime = FORMAT_BACKENDS[options.format]
    config = model_config_pb2.ModelConfig(name=options.model_name, max_batch_size=options.max_batch_size)
    setattr(config, field_name, runtime)
    for tensor in inputs:
        config.input.add(
            name=tensor.name, data_type=model_config_pb2.DataType.Value(tensor.datatype), dims=list(tensor.dims)
        )
    for tensor in outputs:
        config.output.add(
            name=tensor.name, data_type=model_config_pb2.DataType.Value(tensor.datatype), dims=list(tensor.dims)
        )
    if options.dynamic_batching and options.max_batch_size > 0:
        batching = config.dynamic_batching
        batching.SetInParent()
        batching.max_queue_delay_microseconds = options.max_queue_delay_microseconds
        batching.preferred_batch_size.extend(options.preferred_batch_size)
    config.instance_group.add(
        count=options.instance_count, kind=model_config_pb2.ModelInstanceGroup.Kind.Value(options.kind)
    )
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = value
    plain = options.format == "onnx" and options.precision == "fp32"
    made = "" if plain else f" ({options.format}, {options.precision})"
    header = (
        f"# Written by `modelsvc export` from {options.model}{made}. Yours to edit: export keeps an existing\n"
        "# config.pbtxt unless given --overwrite-config.\n"
    )
    return header + text_format.MessageToString(config)


def config_mismatches(path: Path, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> list[str]:
    """Where a kept config.pbtxt names tensors or datatypes the new model does not have."""
    try:
        config = text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
    except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
        return [f"it does not parse: {exc}"]
    problems: list[str] = []
    for kind, declared, actual in (("input", config.input, inputs), ("output", config.output, outputs)):
        by_name = {t.name: t for t in actual}
        for entry in declared:
            tensor = by_name.get(entry.name)
            datatype = model_config_pb2.DataType.Name(entry.data_type)
            if tensor is None:
                problems.append(f"{kind} {entry.name!r} is not in the model")
            elif datatype != tensor.datatype:
                problems.append(f"{kind} {entry.name!r} is {datatype} there, {tensor.datatype} in the model")
    return problems


def write_text(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
