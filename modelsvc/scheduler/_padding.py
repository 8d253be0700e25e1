"""Padding-aware batching's settings (``PadSpec``), read from the model config, and the pure pad / cut steps.

The keys are ``parameters`` entries with string values, so the same config.pbtxt still loads on Triton:

* ``pad_inputs``: ``NAME:AXIS[=PAD]``, comma-separated: inputs of variable length along AXIS (an index into
  the input's config ``dims``, the batch dimension not counted; that dim must be -1), padded with PAD (default
  0, parsed as the input's datatype). Its presence chooses the padding-aware planner (``_padded``).
* ``pad_outputs``: ``NAME:AXIS``: outputs carrying the padded axis, cut back to each request's own length.
  An output with a -1 dim that is not listed is a load error (list it, or give it fixed dims).
* ``pad_buckets``: ascending lengths; a batch is padded to the smallest bucket >= its longest request, and the
  largest bucket is the longest request accepted. Without buckets a batch is padded to its longest request.
* ``max_batch_tokens``: rows x padded length of a batch is at most this.
* ``pad_call_cost_tokens``: what one call of the model costs, counted in padded tokens (rows x padded length)
  it would compute in the same time: the planner (``_padded``) splits the queue to spend the least on calls
  and padding together. A non-negative integer, default ``CALL_COST_TOKENS`` (96, a CPU: a call costs about
  as much as a request's tokens, so padding stays low); on an accelerator, the time of an empty call over the
  time of one more padded token (5 ms per call / 10 us per token: 500).

Every bad entry fails the load (``ModelLoadError``) naming the key and the tensor; a request whose padded
inputs disagree in length, or that is longer than the largest bucket, is an ``InvalidArgument`` (400).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from ..backends import ModelConfig, ModelLoadError
from ..protocol import InternalError, InvalidArgument, PadEntry, pad_entries
from ..protocol._datatypes import CONFIG_TO_WIRE, NUMPY_DTYPES

Arrays = dict[str, np.ndarray[Any, Any]]

KEYS = ("pad_inputs", "pad_outputs", "pad_buckets", "max_batch_tokens", "pad_call_cost_tokens")

#: what one call costs, in padded tokens, unless ``pad_call_cost_tokens`` says
CALL_COST_TOKENS = 96


@dataclass(frozen=True, slots=True)
class PadInput:
    """One padded input: its name, its axis in the request's array (config axis + 1) and its pad value."""

    name: str
    axis: int
    value: Any


@dataclass(frozen=True, slots=True)
class PadSpec:
    """What padding-aware batching pads and cuts, from a model config (``from_model_config``)."""

    inputs: tuple[PadInput, ...]
    #: output name -> its axis in the output array (config axis + 1)
    outputs: Mapping[str, int]
    buckets: tuple[int, ...] = ()
    #: 0: no token budget
    max_batch_tokens: int = 0
    #: what one call costs, in padded tokens
    call_cost_tokens: int = CALL_COST_TOKENS

    @property
    def max_length(self) -> int | None:
        """The longest request accepted (the largest bucket); None without buckets."""
        return self.buckets[-1] if self.buckets else None

    def padded_length(self, longest: int) -> int:
        """What a batch whose longest request is ``longest`` is padded to: the smallest bucket >= it (0 stays 0:
        requests without a padded input)."""
        if longest <= 0:
            return 0
        for bucket in self.buckets:
            if bucket >= longest:
                return bucket
        return longest

    # -- at request time ------------------------------------------------------------------------------
    def length_of(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> int:
        """The request's length along the padded axis (0 when it has none of the padded inputs); an
        InvalidArgument when its padded inputs disagree or it is longer than the largest bucket."""
        lengths = {
            p.name: inputs[p.name].shape[p.axis]
            for p in self.inputs
            if p.name in inputs and inputs[p.name].ndim > p.axis
        }
        if not lengths:
            return 0
        values = set(lengths.values())
        if len(values) > 1:
            told = ", ".join(f"'{name}' {n}" for name, n in lengths.items())
            raise InvalidArgument(f"the padded inputs of a request must have the same length, got {told}")
        (length,) = values
        limit = self.max_length
        if limit is not None and length > limit:
            name = next(iter(lengths))
            raise InvalidArgument(
                f"input '{name}' has length {length}, longer than the largest of pad_buckets ({limit})"
            )
        return length

    def shape_key(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Hashable:
        """What requests must agree on to share a batch: every input's name and non-batch dims, the padded
        axis left out (-1)."""
        axes = {p.name: p.axis for p in self.inputs}
        key = []
        for name, array in inputs.items():
            dims = list(array.shape[1:])
            axis = axes.get(name)
            if axis is not None and axis < array.ndim:
                dims[axis - 1] = -1
            key.append((name, tuple(dims)))
        return tuple(key)

    # -- on the instance's thread ---------------------------------------------------------------------
    def pad(self, inputs: Arrays, pad_to: int) -> Arrays:
        """``inputs`` with each padded input extended to ``pad_to`` along its axis with its pad value."""
        out = dict(inputs)
        for p in self.inputs:
            array = inputs.get(p.name)
            if array is None or array.ndim <= p.axis or array.shape[p.axis] >= pad_to:
                continue
            shape = list(array.shape)
            shape[p.axis] = pad_to
            padded = np.full(shape, p.value, dtype=array.dtype)
            padded[tuple(slice(0, n) for n in array.shape)] = array
            out[p.name] = padded
        return out

    def cut(self, outputs: Arrays, length: int, pad_to: int) -> Arrays:
        """``outputs`` (of a batch padded to ``pad_to``) with each padded output cut back to ``length``; an
        InternalError naming an output whose axis is not ``pad_to`` long."""
        out = dict(outputs)
        for name, axis in self.outputs.items():
            array = outputs.get(name)
            if array is None:
                continue
            if array.ndim <= axis or array.shape[axis] != pad_to:
                raise InternalError(
                    f"output '{name}' has shape {list(array.shape)}: pad_outputs says axis {axis - 1} (of its dims)"
                    f" carries the padded length {pad_to}"
                )
            if length != pad_to:
                index: list[slice] = [slice(None)] * array.ndim
                index[axis] = slice(0, length)
                out[name] = array[tuple(index)]
        return out

    # -- at load time ---------------------------------------------------------------------------------
    @classmethod
    def from_model_config(cls, config: ModelConfig) -> PadSpec | None:
        """The padding of a config with ``pad_inputs``, None without; ModelLoadError naming the key and the
        tensor for a bad entry."""
        params = {key: config.parameters[key].string_value for key in KEYS if key in config.parameters}
        model = f"model '{config.name}'"
        if "pad_inputs" not in params:
            if params:
                key = next(iter(params))
                raise ModelLoadError(f"{model}: parameter '{key}' needs 'pad_inputs' (padding-aware batching)")
            return None
        if config.max_batch_size <= 0:
            raise ModelLoadError(f"{model}: parameter 'pad_inputs' needs max_batch_size > 0")
        if not config.HasField("dynamic_batching"):
            raise ModelLoadError(f"{model}: parameter 'pad_inputs' needs dynamic_batching (its queue window)")
        inputs = _pad_inputs(config, params["pad_inputs"], model)
        outputs = _pad_outputs(config, params.get("pad_outputs", ""), model)
        buckets = _buckets(params.get("pad_buckets", ""), model)
        budget = _budget(params.get("max_batch_tokens", ""), buckets, model)
        call_cost = _call_cost(params.get("pad_call_cost_tokens", ""), model)
        return cls(inputs, outputs, buckets, budget, call_cost)


def _entries(text: str, key: str, model: str) -> list[str]:
    entries = [e.strip() for e in text.split(",")]
    if not text.strip() or any(not e for e in entries):
        raise ModelLoadError(f"{model}: parameter '{key}' has an empty entry in '{text}'")
    return entries


def _pad_entries(text: str, key: str, model: str) -> list[PadEntry]:
    """The entries of ``pad_inputs``/``pad_outputs`` (modelsvc.protocol's one reading of their syntax)."""
    try:
        return pad_entries(text, key)
    except ValueError as exc:
        raise ModelLoadError(f"{model}: {exc}") from None


def _name_axis(entry: PadEntry, tensors: Mapping[str, Any], kind: str, key: str, model: str) -> tuple[str, int]:
    """``NAME:AXIS`` checked against the config's tensors: the tensor and its axis in the request's array."""
    name, axis_text = entry.name, entry.axis
    tensor = tensors.get(name)
    if tensor is None:
        raise ModelLoadError(f"{model}: parameter '{key}': no {kind} '{name}' in the config")
    dims = list(tensor.dims)
    try:
        axis = int(axis_text)
    except ValueError:
        raise ModelLoadError(
            f"{model}: parameter '{key}': {kind} '{name}': axis '{axis_text}' is not an integer"
        ) from None
    if not 0 <= axis < len(dims):
        raise ModelLoadError(
            f"{model}: parameter '{key}': {kind} '{name}': axis {axis} is out of range for dims {dims}"
        )
    if dims[axis] != -1:
        raise ModelLoadError(
            f"{model}: parameter '{key}': {kind} '{name}': dim {axis} is {dims[axis]}, a padded axis must be -1"
        )
    return name, axis + 1


def _pad_inputs(config: ModelConfig, text: str, model: str) -> tuple[PadInput, ...]:
    tensors = {t.name: t for t in config.input}
    found: dict[str, PadInput] = {}
    for entry in _pad_entries(text, "pad_inputs", model):
        name, axis = _name_axis(entry, tensors, "input", "pad_inputs", model)
        if name in found:
            raise ModelLoadError(f"{model}: parameter 'pad_inputs': input '{name}' is listed twice")
        datatype = CONFIG_TO_WIRE.get(model_config_pb2.DataType.Name(tensors[name].data_type), "")
        value = _pad_value("0" if entry.pad is None else entry.pad, datatype, name, model)
        found[name] = PadInput(name, axis, value)
    return tuple(found.values())


def _pad_value(text: str, datatype: str, name: str, model: str) -> Any:
    """The pad value as the input's datatype."""
    where = f"{model}: parameter 'pad_inputs': input '{name}'"
    if datatype == "BYTES":
        return text.encode()
    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None:
        raise ModelLoadError(f"{where}: datatype {datatype or 'unknown'} cannot be padded")
    try:
        if dtype.kind == "b":
            lowered = text.lower()
            if lowered not in ("0", "1", "true", "false"):
                raise ValueError(text)
            return np.bool_(lowered in ("1", "true"))
        if dtype.kind in "iu":
            number = int(text)
            limits = np.iinfo(dtype)
            if not limits.min <= number <= limits.max:
                raise ValueError(text)
            return dtype.type(number)
        return dtype.type(float(text))
    except ValueError:
        raise ModelLoadError(f"{where}: pad value '{text}' is not a {datatype}") from None


def _pad_outputs(config: ModelConfig, text: str, model: str) -> dict[str, int]:
    tensors = {t.name: t for t in config.output}
    found: dict[str, int] = {}
    if text.strip():
        for entry in _pad_entries(text, "pad_outputs", model):
            if entry.pad is not None:  # an output has no pad value: its axis text was NAME:AXIS=...
                entry = PadEntry(entry.name, f"{entry.axis}={entry.pad}")
            name, axis = _name_axis(entry, tensors, "output", "pad_outputs", model)
            if name in found:
                raise ModelLoadError(f"{model}: parameter 'pad_outputs': output '{name}' is listed twice")
            found[name] = axis
    for output in config.output:
        if output.name not in found and -1 in output.dims:
            raise ModelLoadError(
                f"{model}: parameter 'pad_outputs' does not list output '{output.name}', whose dims"
                f" {list(output.dims)} have a -1 that may carry the padded axis: list it, or give it fixed dims"
            )
    return found


def _buckets(text: str, model: str) -> tuple[int, ...]:
    if not text.strip():
        return ()
    buckets: list[int] = []
    for entry in _entries(text, "pad_buckets", model):
        try:
            bucket = int(entry)
        except ValueError:
            bucket = 0
        if bucket <= 0:
            raise ModelLoadError(f"{model}: parameter 'pad_buckets': '{entry}' is not a positive integer")
        if buckets and bucket <= buckets[-1]:
            raise ModelLoadError(f"{model}: parameter 'pad_buckets' must be ascending, got '{text}'")
        buckets.append(bucket)
    return tuple(buckets)


def _budget(text: str, buckets: tuple[int, ...], model: str) -> int:
    if not text.strip():
        return 0
    try:
        budget = int(text)
    except ValueError:
        budget = 0
    if budget <= 0:
        raise ModelLoadError(f"{model}: parameter 'max_batch_tokens': '{text}' is not a positive integer")
    if buckets and budget < buckets[-1]:
        raise ModelLoadError(
            f"{model}: parameter 'max_batch_tokens' ({budget}) is below one row of the largest of pad_buckets"
            f" ({buckets[-1]})"
        )
    return budget


def _call_cost(text: str, model: str) -> int:
    if not text.strip():
        return CALL_COST_TOKENS
    try:
        cost = int(text)
    except ValueError:
        cost = -1
    if cost < 0:
        raise ModelLoadError(
            f"{model}: parameter 'pad_call_cost_tokens': '{text}' is not a non-negative integer (what one call"
            " costs, in padded tokens)"
        )
    return cost
