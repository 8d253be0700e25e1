"""An OpenVINO model as the backend sees it: read from an IR (``model.xml`` + ``model.bin``) or an ONNX file, its
tensors (names, Triton datatypes, partial shapes), reshaped as the config asks (a dynamic or fixed batch
dimension, ``RESHAPE_IO_LAYERS``), and the config completed from it and checked against it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openvino as ov

from .._base import ConfigMismatchError, ModelConfig, ModelLoadError, complete_dims, data_type_name, data_type_value
from ._openvino_options import OV_TO_CONFIG, OpenVINOOptions

logger = logging.getLogger("modelsvc.backends.openvino")


@dataclass(frozen=True)
class Port:
    """One input or output of an OpenVINO model."""

    #: the name the model gives it first (``get_any_name``); ``names`` holds all of them
    name: str
    names: frozenset[str]
    #: the model config DataType name, or ``ov:<type>`` for an element type Triton has no name for
    data_type: str
    #: the partial shape, -1 for a dynamic dimension; None for a dynamic rank
    dims: list[int] | None
    #: the port's layout names a batch dimension (``N``)
    batch_layout: bool


def ports(outputs: Any) -> list[Port]:
    out = []
    for port in outputs:
        shape = port.get_partial_shape()
        dims = None if shape.rank.is_dynamic else [d.get_length() if d.is_static else -1 for d in shape]
        element = port.get_element_type().get_type_name()
        layout = ov.layout_helpers.get_layout(port)
        out.append(
            Port(
                port.get_any_name(),
                frozenset(port.get_names()),
                OV_TO_CONFIG.get(element, f"ov:{element}"),
                dims,
                not layout.empty and ov.layout_helpers.has_batch(layout),
            )
        )
    return out


def read_model(core: ov.Core, artifact: Path, config: ModelConfig) -> ov.Model:
    """The model of ``artifact`` (IR ``.xml`` with its ``.bin`` beside it, or ``.onnx``); ModelLoadError naming
    the model and the file."""
    if not artifact.is_file():
        raise ModelLoadError(f"unable to find '{artifact}' for model '{config.name}'")
    try:
        model = core.read_model(str(artifact))
    except Exception as exc:  # OpenVINO raises RuntimeError subclasses with its own text
        raise ModelLoadError(f"model '{config.name}': OpenVINO cannot read '{artifact}': {exc}") from exc
    for kind, found in (("input", model.inputs), ("output", model.outputs)):
        for index, port in enumerate(found):
            if not port.get_names():  # ov.convert_model of a PyTorch module names no output, and a config needs one
                raise ModelLoadError(
                    f"model '{config.name}': {kind} {index} of '{artifact}' has no tensor name, which the "
                    f"configuration needs: name it before saving the model, e.g. model.{kind}s[{index}].get_tensor()"
                    f'.set_names({{"{kind.upper()}{index}"}})'
                )
    return model


def _find(found: list[Port], name: str) -> Port | None:
    for port in found:
        if name in port.names:
            return port
    return None


def _entry_dims(entry: Any) -> list[int]:
    return list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)


def reshape(model: ov.Model, config: ModelConfig, options: OpenVINOOptions) -> None:
    """Give ``model`` the input shapes the config asks for: with ``RESHAPE_IO_LAYERS`` the config's dims
    (-1 a dynamic dimension), without it a dynamic dimension where the config says -1 and the model has a fixed
    one, and with ``max_batch_size`` > 0 a dynamic batch dimension, or one fixed at
    ``max_batch_size`` with ``SKIP_OV_DYNAMIC_BATCHSIZE``. ConfigMismatchError / ModelLoadError name the tensor."""
    mbs = int(config.max_batch_size)
    new: dict[str, ov.PartialShape] = {}
    for port in ports(model.inputs):
        entry = next((e for e in config.input if e.name in port.names), None)
        dims = None if port.dims is None else list(port.dims)
        changed = False
        if options.reshape_io_layers and entry is not None and (entry.dims or entry.HasField("reshape")):
            given = _entry_dims(entry)
            wanted = ([-1] if mbs > 0 else []) + given
            if dims is not None and len(dims) != len(wanted):
                raise ConfigMismatchError(
                    f"input '{entry.name}' of model '{config.name}': RESHAPE_IO_LAYERS cannot give the model's "
                    f"shape {dims} the configuration's rank ({'[-1] + ' if mbs > 0 else ''}{given})",
                    tensor=entry.name,
                    field="dims",
                )
            if dims is None:
                dims = wanted
            else:
                dims[len(dims) - len(given) :] = given
            changed = True
        elif entry is not None and dims is not None and (entry.dims or entry.HasField("reshape")):
            given = _entry_dims(entry)  # a -1 where the model is static: that dimension becomes dynamic
            offset = len(dims) - len(given)
            if offset == (1 if mbs > 0 else 0):  # else the ranks differ: complete_config says so
                for i, g in enumerate(given):
                    if g == -1 and dims[offset + i] != -1:
                        dims[offset + i] = -1
                        changed = True
        if mbs > 0:
            if not dims:
                name = entry.name if entry is not None else port.name
                raise ConfigMismatchError(
                    f"max_batch_size of model '{config.name}' is {mbs} but its input '{name}' has "
                    f"{'no dimensions' if dims == [] else 'a dynamic rank'}; set max_batch_size: 0",
                    field="max_batch_size",
                )
            batch = mbs if options.skip_dynamic_batch else -1
            if dims[0] != batch:
                dims[0] = batch
                changed = True
        if changed and dims is not None:
            new[port.name] = ov.PartialShape([ov.Dimension() if d == -1 else ov.Dimension(d) for d in dims])
    if not new:
        return
    try:
        model.reshape(new)
    except Exception as exc:
        shapes = ", ".join(f"{name}: {shape}" for name, shape in new.items())
        hint = " (set parameter SKIP_OV_DYNAMIC_BATCHSIZE to YES for a fixed batch)" if mbs > 0 else ""
        raise ModelLoadError(f"model '{config.name}': OpenVINO cannot reshape it to {shapes}{hint}: {exc}") from exc


def _can_batch(found: list[Port]) -> bool:
    return all(p.batch_layout or (p.dims and p.dims[0] == -1) for p in found)


def _complete_tensor(entry: Any, port: Port, kind: str, config: ModelConfig) -> None:
    if port.data_type == "TYPE_STRING" or port.data_type.startswith("ov:"):
        what = "string tensors (BYTES)" if port.data_type == "TYPE_STRING" else f"element type {port.data_type[3:]}"
        raise ModelLoadError(
            f"{kind} '{entry.name}' of model '{config.name}': modelsvc's openvino backend does not serve {what}"
        )
    if entry.data_type == 0:
        entry.data_type = data_type_value(port.data_type)
    elif data_type_name(entry.data_type) != port.data_type:
        raise ConfigMismatchError(
            f"{kind} '{entry.name}' of model '{config.name}': configuration says {data_type_name(entry.data_type)}, "
            f"the model has {port.data_type}",
            tensor=entry.name,
            field="data_type",
        )
    if port.dims is None:
        if not entry.dims and not entry.HasField("reshape"):
            raise ConfigMismatchError(
                f"{kind} '{entry.name}' of model '{config.name}' has a dynamic rank: give its dims in the "
                "configuration (with parameter RESHAPE_IO_LAYERS for an input)",
                tensor=entry.name,
                field="dims",
            )
        return
    mbs = int(config.max_batch_size)
    complete_dims(entry, port.dims, kind, entry.name, config.name, mbs, f"model's shape {port.dims}")


def complete_config(
    config: ModelConfig, model: ov.Model, options: OpenVINOOptions, default_max_batch_size: int
) -> None:
    """Complete ``config`` from ``model`` as Triton's openvino backend does and check what it gives (the rules
    of the ONNX Runtime backend: max_batch_size and dynamic_batching when the model batches and the config lists
    no inputs or outputs, missing inputs added, outputs added when none is listed); reshape ``model`` as the
    config asks. ConfigMismatchError names the model and the tensor."""
    raw_inputs, raw_outputs = ports(model.inputs), ports(model.outputs)
    if len(config.input) == 0 or len(config.output) == 0:
        can_batch = _can_batch([*raw_inputs, *raw_outputs])
        if can_batch and config.max_batch_size == 0:
            config.max_batch_size = default_max_batch_size
            logger.warning(
                "auto-completed max_batch_size to %d for model '%s': the model batches and its configuration "
                "sets no max_batch_size",
                config.max_batch_size,
                config.name,
            )
        scheduled = any(config.HasField(f) for f in ("dynamic_batching", "sequence_batching", "ensemble_scheduling"))
        if can_batch and config.max_batch_size > 1 and not scheduled:
            config.dynamic_batching.SetInParent()
    for kind, found, entries in (("input", raw_inputs, config.input), ("output", raw_outputs, config.output)):
        for entry in entries:
            if _find(found, entry.name) is None:
                names = ", ".join(p.name for p in found) or "none"
                raise ConfigMismatchError(
                    f"configuration {kind} '{entry.name}' is not an {kind} of the model '{config.name}' "
                    f"(the model's {kind}s: {names})",
                    tensor=entry.name,
                    field="name",
                )
    reshape(model, config, options)
    mbs = int(config.max_batch_size)
    batch = mbs if options.skip_dynamic_batch else -1
    add_outputs = len(config.output) == 0
    for kind, found, entries, add in (
        ("input", ports(model.inputs), config.input, True),
        ("output", ports(model.outputs), config.output, add_outputs),
    ):
        listed: set[str] = set()
        for entry in entries:
            port = _find(found, entry.name)
            assert port is not None
            listed |= port.names
            _complete_tensor(entry, port, kind, config)
        for port in found:
            if add and not (port.names & listed):
                _complete_tensor(entries.add(name=port.name), port, kind, config)
        for port in found:
            used = bool(port.names & listed) or add
            if mbs > 0 and used and port.dims is not None and (not port.dims or port.dims[0] not in (batch, -1)):
                raise ConfigMismatchError(
                    f"max_batch_size of model '{config.name}' is {mbs} but the model's {kind} '{port.name}' has "
                    f"shape {port.dims} with no batch first dimension; set max_batch_size: 0 for a model that "
                    "does not batch",
                    field="max_batch_size",
                )
