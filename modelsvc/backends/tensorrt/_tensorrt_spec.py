"""What the TensorRT backend decides without TensorRT: engine descriptions as data, and the functions over them.

An :class:`EngineDescription` is what ``_tensorrt_engine.describe_engine`` reads from a deserialized engine
through TensorRT's name-based tensor API (names, I/O mode, datatype, shape with -1 for dynamic dimensions, and
each optimization profile's min/opt/max shapes). Everything decided from it lives here, pure and tested on
machines without a GPU:

- :func:`autocomplete_config` completes a config as Triton does for plans (names, datatypes, dims,
  ``max_batch_size`` from the profiles' batch dimension) and :func:`check_config` checks one at load time;
  both raise ConfigMismatchError / ModelLoadError naming the model and the tensor;
- :func:`choose_profiles` gives each instance its optimization profile (Triton's ``instance_group.profile``);
- :func:`check_request_shapes` is the request-time check (``InvalidArgument``, HTTP 400) that a request's
  shapes lie within the instance's profile, before anything reaches the GPU;
- :func:`deserialize_failure_message` says why a plan did not deserialize (TensorRT version and GPU compute
  capability on each side, where known).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelsvc.protocol import InvalidArgument

from .._base import ConfigMismatchError, ModelConfig, ModelLoadError, complete_dims, data_type_name, data_type_value
from .._devices import Placement

Shape = tuple[int, ...]

#: TensorRT ``DataType`` member name -> Triton config datatype (the types a plan's I/O tensors can have)
TRT_TO_CONFIG: dict[str, str] = {
    "FLOAT": "TYPE_FP32",
    "HALF": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "INT8": "TYPE_INT8",
    "UINT8": "TYPE_UINT8",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "BOOL": "TYPE_BOOL",
}


class InputShapesRejected(ValueError):
    """TensorRT's shape inference rejects the inputs' shapes together (``IExecutionContext.infer_shapes`` raised:
    "shape inference fails due to reasons other than insufficiently specified tensors"), e.g. an elementwise layer
    given [2,3] and [2,4], or two inputs of one named ONNX dimension given two sizes. The message is TensorRT's
    own logged error."""


def config_datatype(trt_name: str) -> str:
    """The Triton datatype of a TensorRT ``DataType`` name; a type Triton cannot carry keeps TensorRT's name
    (``FP8``, ``INT4``), which the load-time checks then refuse naming the tensor."""
    return TRT_TO_CONFIG.get(trt_name, trt_name)


@dataclass(frozen=True, slots=True)
class EngineTensor:
    """One I/O tensor of an engine."""

    name: str
    is_input: bool
    #: Triton config type, e.g. "TYPE_FP32" (TensorRT's own name where Triton has none)
    datatype: str
    #: the engine's shape, batch dimension included; -1 for a dynamic dimension
    dims: Shape


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One optimization profile: input name -> (min, opt, max) shapes."""

    shapes: dict[str, tuple[Shape, Shape, Shape]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineDescription:
    """An engine's I/O tensors and optimization profiles, and the TensorRT version that read it."""

    tensors: tuple[EngineTensor, ...]
    profiles: tuple[EngineProfile, ...]
    trt_version: str

    @property
    def inputs(self) -> tuple[EngineTensor, ...]:
        return tuple(t for t in self.tensors if t.is_input)

    @property
    def outputs(self) -> tuple[EngineTensor, ...]:
        return tuple(t for t in self.tensors if not t.is_input)


# --- batching -------------------------------------------------------------------------------------------------


def engine_batches(desc: EngineDescription) -> bool:
    """True when every I/O tensor has a dynamic first dimension (the batch) and the engine has a profile."""
    return bool(desc.profiles) and bool(desc.tensors) and all(t.dims and t.dims[0] == -1 for t in desc.tensors)


def engine_max_batch_size(desc: EngineDescription) -> int:
    """The largest batch some profile accepts for every input at once (0 when the engine does not batch)."""
    if not engine_batches(desc):
        return 0
    best = 0
    for profile in desc.profiles:
        maxima = [shapes[2][0] for name, shapes in profile.shapes.items() if shapes[2]]
        if maxima:
            best = max(best, min(maxima))
    return best


# --- auto-complete and load-time checks -----------------------------------------------------------------------


def _shape(dims: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _ranges(desc: EngineDescription, name: str) -> str:
    parts = []
    for index, profile in enumerate(desc.profiles):
        if name in profile.shapes:
            low, _, high = profile.shapes[name]
            parts.append(f"profile {index}: {_shape(low)}..{_shape(high)}")
    return "; ".join(parts) or "no profile lists it"


def _fits(shape: Sequence[int], low: Sequence[int], high: Sequence[int]) -> bool:
    """A config shape (-1 for any) fits min..max where every fixed dimension lies in its range."""
    return len(shape) == len(low) == len(high) and all(
        d == -1 or lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True)
    )


def _check_datatype(model: str, kind: str, entry: Any, tensor: EngineTensor) -> None:
    if not tensor.datatype.startswith("TYPE_"):
        raise ConfigMismatchError(
            f"{kind} '{tensor.name}' of model '{model}': the engine has TensorRT type {tensor.datatype}, which "
            "modelsvc cannot serve (I/O tensors must be one of "
            f"{', '.join(sorted(TRT_TO_CONFIG.values()))}); rebuild the plan with another I/O type",
            tensor=tensor.name,
            field="data_type",
        )
    if entry.data_type == 0:
        entry.data_type = data_type_value(tensor.datatype)
        return
    given = data_type_name(entry.data_type)
    if given == tensor.datatype:
        return
    message = f"{kind} '{tensor.name}' of model '{model}': configuration says {given}, the engine has {tensor.datatype}"
    if given == "TYPE_INT64" and tensor.datatype == "TYPE_INT32":
        message += (
            ". This is the classic pitfall after an int32 export: the plan was built from an ONNX model whose "
            "integer inputs are INT32 (as exporters for TensorRT often make them), while config.pbtxt still says "
            "TYPE_INT64. Set data_type: TYPE_INT32 in config.pbtxt (and send INT32 tensors), or rebuild the plan "
            "from a model with INT64 inputs"
        )
    raise ConfigMismatchError(message, tensor=tensor.name, field="data_type")


def _check_dims(
    model: str, kind: str, entry: Any, tensor: EngineTensor, max_batch_size: int, desc: EngineDescription
) -> None:
    shown = f"engine's shape {_shape(tensor.dims)}"
    given = complete_dims(entry, tensor.dims, kind, tensor.name, model, max_batch_size, shown)
    if given is None or not tensor.is_input or not desc.profiles:
        return
    full = ([-1] if max_batch_size > 0 else []) + given
    accepted = [
        p
        for p in desc.profiles
        if tensor.name not in p.shapes or _fits(full, p.shapes[tensor.name][0], p.shapes[tensor.name][2])
    ]
    if not accepted:
        raise ConfigMismatchError(
            f"input '{tensor.name}' of model '{model}': configuration dims {_shape(full)} fit none of the "
            f"engine's optimization profiles ({_ranges(desc, tensor.name)}); change dims in config.pbtxt or "
            "rebuild the plan with profiles that cover them",
            tensor=tensor.name,
            field="dims",
        )


def _check_batching(config: ModelConfig, desc: EngineDescription, tensors: Sequence[EngineTensor]) -> None:
    max_batch_size = int(config.max_batch_size)
    if max_batch_size <= 0:
        return
    for tensor in tensors:
        if not (tensor.dims and tensor.dims[0] == -1):
            kind = "input" if tensor.is_input else "output"
            raise ConfigMismatchError(
                f"max_batch_size of model '{config.name}' is {max_batch_size} but the engine's {kind} "
                f"'{tensor.name}' has shape {_shape(tensor.dims)} with no dynamic first (batch) dimension; set "
                "max_batch_size: 0 for an engine that does not batch",
                field="max_batch_size",
            )
    allowed = engine_max_batch_size(desc)
    if max_batch_size > allowed:
        ranges = "; ".join(f"input '{t.name}': {_ranges(desc, t.name)}" for t in desc.inputs)
        raise ConfigMismatchError(
            f"max_batch_size of model '{config.name}' is {max_batch_size} but the engine's optimization "
            f"profiles accept batches of at most {allowed} ({ranges}); lower max_batch_size or rebuild the plan",
            field="max_batch_size",
        )


def _match_entries(config: ModelConfig, desc: EngineDescription, kind: str, entries: Any) -> dict[str, EngineTensor]:
    engine = {t.name: t for t in (desc.inputs if kind == "input" else desc.outputs)}
    for entry in entries:
        if entry.name not in engine:
            raise ConfigMismatchError(
                f"configuration {kind} '{entry.name}' is not an {kind} of the engine of model '{config.name}' "
                f"(the engine's {kind}s: {', '.join(engine) or 'none'})",
                tensor=entry.name,
                field="name",
            )
    return engine


def autocomplete_config(config: ModelConfig, desc: EngineDescription) -> None:
    """Complete ``config`` from the engine as Triton does for plans, and check what it gives.

    - the config lists no inputs or no outputs, sets no ``max_batch_size`` and the engine batches (every tensor
      has a dynamic first dimension): ``max_batch_size`` becomes the largest batch the profiles accept, and with
      ``max_batch_size`` > 1 and no scheduler an empty ``dynamic_batching {}`` is added;
    - inputs the config leaves out are added, outputs too when it lists none; listed tensors without
      ``data_type`` or ``dims`` are completed (dims without the batch dimension, -1 where dynamic);
    - a listed tensor the engine lacks, a datatype or dims that disagree with the engine, dims that no profile
      accepts, or a ``max_batch_size`` the engine cannot batch: ConfigMismatchError naming model and tensor.
    """
    if (len(config.input) == 0 or len(config.output) == 0) and config.max_batch_size == 0 and engine_batches(desc):
        config.max_batch_size = engine_max_batch_size(desc)
        scheduled = any(config.HasField(f) for f in ("dynamic_batching", "sequence_batching", "ensemble_scheduling"))
        if config.max_batch_size > 1 and not scheduled:
            config.dynamic_batching.SetInParent()
    add_outputs = len(config.output) == 0
    inputs = _match_entries(config, desc, "input", config.input)
    outputs = _match_entries(config, desc, "output", config.output)
    listed = {e.name for e in config.input} | {e.name for e in config.output}
    _check_batching(config, desc, [t for t in desc.tensors if t.is_input or add_outputs or t.name in listed])
    for kind, engine, entries, add in (
        ("input", inputs, config.input, True),
        ("output", outputs, config.output, add_outputs),
    ):
        names = {e.name for e in entries}
        if add:
            for name in engine:
                if name not in names:
                    entries.add(name=name)
        for entry in entries:
            _check_datatype(config.name, kind, entry, engine[entry.name])
            _check_dims(config.name, kind, entry, engine[entry.name], config.max_batch_size, desc)


def check_config(config: ModelConfig, desc: EngineDescription) -> None:
    """The load-time checks of a complete config against the engine (auto-complete off or done): every
    listed tensor exists with the engine's datatype and compatible dims that some profile accepts, every engine
    input is listed, and ``max_batch_size`` is one the engine can batch. Raises ConfigMismatchError."""
    inputs = _match_entries(config, desc, "input", config.input)
    outputs = _match_entries(config, desc, "output", config.output)
    missing = [name for name in inputs if name not in {e.name for e in config.input}]
    if missing:
        raise ConfigMismatchError(
            f"the configuration of model '{config.name}' does not list the engine's input(s) {', '.join(missing)}",
            tensor=missing[0],
        )
    listed = {e.name for e in config.input} | {e.name for e in config.output}
    _check_batching(config, desc, [t for t in desc.tensors if t.name in listed])
    for kind, engine, entries in (("input", inputs, config.input), ("output", outputs, config.output)):
        for entry in entries:
            if entry.data_type == 0:
                raise ConfigMismatchError(
                    f"{kind} '{entry.name}' of model '{config.name}' has no data_type",
                    tensor=entry.name,
                    field="data_type",
                )
            _check_datatype(config.name, kind, entry, engine[entry.name])
            _check_dims(config.name, kind, entry, engine[entry.name], config.max_batch_size, desc)


# --- optimization profiles of instances -----------------------------------------------------------------------


def choose_profiles(config: ModelConfig, where: Sequence[Placement], profile_count: int) -> list[int]:
    """The optimization profile of each instance in ``where`` (one entry per placement, in order).

    An instance group that sets Triton's ``profile`` (a list of profile indices as strings) hands them to its
    instances in turn; without ``profile``, the instances on one GPU take the engine's profiles in turn, so
    that with several profiles they take different ones. A profile the engine lacks: ModelLoadError.
    """
    if profile_count < 1:
        raise ModelLoadError(f"the engine of model '{config.name}' has no optimization profile")
    listed: dict[str, list[int]] = {}
    for index, group in enumerate(config.instance_group):
        name = group.name or f"{config.name}_{index}"
        chosen = []
        for text in group.profile:
            value = text.strip()
            if not value.isdigit() or int(value) >= profile_count:
                raise ModelLoadError(
                    f"instance group '{name}' of model '{config.name}': profile '{text}' is not an optimization "
                    f"profile of the engine (it has {profile_count}: 0..{profile_count - 1})"
                )
            chosen.append(int(value))
        listed[name] = chosen
    next_on_gpu: dict[int | None, int] = {}
    out = []
    for place in where:
        chosen = listed.get(place.group, [])
        if chosen:
            out.append(chosen[place.number % len(chosen)])
        else:
            turn = next_on_gpu.get(place.gpu, 0)
            next_on_gpu[place.gpu] = turn + 1
            out.append(turn % profile_count)
    return out


# --- request time ---------------------------------------------------------------------------------------------


def check_request_shapes(
    model: str, profile_index: int, profile: EngineProfile, shapes: Mapping[str, Sequence[int]]
) -> None:
    """InvalidArgument (HTTP 400) naming the input and the profile's range when a request's shape lies outside
    the profile's min..max; called before anything is copied to the GPU."""
    for name, shape in shapes.items():
        ranges = profile.shapes.get(name)
        if ranges is None:
            continue
        low, _, high = ranges
        if not _fits(list(shape), low, high) or any(d < 0 for d in shape):
            if len(shape) != len(low):
                why = f"it has {len(shape)} dimensions, the engine {len(low)}"
            else:
                axis = next(i for i, (d, lo, hi) in enumerate(zip(shape, low, high, strict=True)) if not lo <= d <= hi)
                why = f"dimension {axis} is {shape[axis]}, outside {low[axis]}..{high[axis]}"
            raise InvalidArgument(
                f"input '{name}' of model '{model}' has shape {_shape(shape)}, outside the range of the engine's "
                f"optimization profile {profile_index}: {_shape(low)}..{_shape(high)} ({why})"
            )


# --- deserialization ------------------------------------------------------------------------------------------

_LIBRARY = re.compile(r"expecting library version\s+([\w.]+)\s+got\s+([\w.]+)", re.IGNORECASE)
_COMPUTE = re.compile(r"expecting compute\s+([\d.]+)\s+got compute\s+([\d.]+)", re.IGNORECASE)
_TAG = re.compile(r"Current Version:\s*(\d+),\s*Serialized Engine Version:\s*(\d+)", re.IGNORECASE)


def _capability(value: tuple[int, int] | str | None) -> str:
    if value is None:
        return "unknown"
    return value if isinstance(value, str) else f"{value[0]}.{value[1]}"


def deserialize_failure_message(
    *,
    trt_version: str,
    device: int,
    compute_capability: tuple[int, int] | None,
    log: Sequence[str] = (),
    plan_trt_version: str | None = None,
    plan_compute_capability: tuple[int, int] | None = None,
) -> str:
    """Why ``deserialize_cuda_engine`` returned None, with what is known of each side.

    The plan's side comes from the arguments or, where TensorRT says it, from its log lines ("expecting library
    version A got B", "expecting compute X got compute Y", "Current Version: N, Serialized Engine Version: M").
    """
    text = "\n".join(log)
    plan_version: str | None = plan_trt_version
    plan_cc: str | None = _capability(plan_compute_capability) if plan_compute_capability else None
    if (match := _LIBRARY.search(text)) and plan_version is None:
        plan_version = match.group(2)
    if (match := _TAG.search(text)) and plan_version is None:
        plan_version = f"serialization tag {match.group(2)} (this TensorRT has {match.group(1)})"
    if (match := _COMPUTE.search(text)) and plan_cc is None:
        plan_cc = match.group(2)
    lines = [
        "TensorRT could not deserialize the plan (deserialize_cuda_engine returned None). A plan runs only with "
        "the TensorRT version and on the GPU compute capability it was built for.",
        f"This server: TensorRT {trt_version}, GPU {device} of compute capability {_capability(compute_capability)}.",
        f"The plan: TensorRT {plan_version or 'unknown'}, compute capability {plan_cc or 'unknown'}.",
        "Rebuild the plan on a machine with this TensorRT and this GPU (modelsvc build), or serve it where it was "
        "built.",
    ]
    if log:
        lines.append("TensorRT said: " + " | ".join(line.strip() for line in log[-5:]))
    return " ".join(lines)


__all__ = [
    "TRT_TO_CONFIG",
    "EngineDescription",
    "EngineProfile",
    "EngineTensor",
    "autocomplete_config",
    "check_config",
    "check_request_shapes",
    "choose_profiles",
    "config_datatype",
    "deserialize_failure_message",
    "engine_batches",
    "engine_max_batch_size",
]
