"""What the PyTorch backend decides without torch: its parameters, how config tensors map onto forward()'s
arguments and returned values (Triton's naming rules), the datatypes it serves, and the checks of a config against
a TorchScript module's signature or against the ``config.pbtxt`` a model file may carry. ``_pytorch`` reads the
signature from the loaded module and hands it over as plain data."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import text_format

from .._base import ConfigMismatchError, ModelConfig, ModelLoadError, complete_dims, data_type_name

logger = logging.getLogger("modelsvc.backends.pytorch")

#: config data_type -> torch dtype name (``torch.<name>``); TYPE_STRING travels as List[str] instead
TORCH_DTYPES: dict[str, str] = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_INT8": "int8",
    "TYPE_INT16": "int16",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_FP16": "float16",
    "TYPE_BF16": "bfloat16",
    "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
}
STRING = "TYPE_STRING"

#: the kinds of a forward() argument or returned value the backend can feed or read
TENSOR, STRINGS = "tensor", "strings"

_TRUE = ("true", "on", "1")
_FALSE = ("false", "off", "0")
#: parameters of Triton's PyTorch backend that apply to its Python (PyTorch 2, model.py) runtime only
_PT2_ONLY = ("NUM_THREADS", "NUM_INTEROP_THREADS", "TORCH_COMPILE_OPTIONAL_PARAMETERS")


def passive_openmp() -> None:
    """Start PyTorch with ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it or torch is already loaded.

    OpenMP's worker threads spin while they wait for work (its ACTIVE policy); on a machine with few cores they take
    the cores from the server's event loop, its batcher and the other instances. Measured on 2 cores with other work
    running, a traced MiniLM-L6 served by modelsvc, 1 x 128 tokens: 111-158 ms per request PASSIVE, 790-1020 ms
    ACTIVE (eager PyTorch alike: 126 ms against 780-1300 ms). OpenMP reads the variable once, when torch loads."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    logger.info("PyTorch starts with OMP_WAIT_POLICY=PASSIVE (set OMP_WAIT_POLICY=ACTIVE to let its threads spin)")


# --- parameters ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PyTorchOptions:
    """Triton's PyTorch backend parameters, read from ``config.parameters``. None: not set (torch's own setting)."""

    optimized_execution: bool = True
    inference_mode: bool = True
    cudnn: bool | None = None
    cache_cleaning: bool = False
    weight_sharing: bool = False
    tensor_fuser: bool | None = None
    jit_profiling: bool | None = None
    jit_executor: bool | None = None
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None


def _raw(config: ModelConfig, key: str) -> str | None:
    if key in config.parameters:
        return str(config.parameters[key].string_value)
    return None


def _bool(config: ModelConfig, key: str) -> bool | None:
    value = _raw(config, key)
    if value is None:
        return None
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ModelLoadError(
        f"model '{config.name}': parameter '{key}' must be \"true\" or \"false\" (or on/off, 1/0), got '{value}'"
    )


def _count(config: ModelConfig, key: str) -> int | None:
    value = _raw(config, key)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        number = -1
    if number < 0:
        raise ModelLoadError(
            f"model '{config.name}': parameter '{key}' must be a thread count (an integer >= 0, 0 for PyTorch's "
            f"default), got '{value}'"
        )
    return number or None


def parse_options(config: ModelConfig) -> PyTorchOptions:
    """The parameters as Triton's PyTorch backend reads them; ModelLoadError names the model and the bad key."""
    for key in _PT2_ONLY:
        if key in config.parameters:
            logger.warning(
                "model '%s': parameter '%s' is for Triton's PyTorch 2 (model.py) runtime; it has no effect on a "
                "TorchScript model",
                config.name,
                key,
            )
    disable_optimized = _bool(config, "DISABLE_OPTIMIZED_EXECUTION")
    inference_mode = _bool(config, "INFERENCE_MODE")
    disable_cudnn = _bool(config, "DISABLE_CUDNN")
    return PyTorchOptions(
        optimized_execution=not disable_optimized if disable_optimized is not None else True,
        inference_mode=inference_mode if inference_mode is not None else True,
        cudnn=None if disable_cudnn is None else not disable_cudnn,
        cache_cleaning=bool(_bool(config, "ENABLE_CACHE_CLEANING")),
        weight_sharing=bool(_bool(config, "ENABLE_WEIGHT_SHARING")),
        tensor_fuser=_bool(config, "ENABLE_TENSOR_FUSER"),
        jit_profiling=_bool(config, "ENABLE_JIT_PROFILING"),
        jit_executor=_bool(config, "ENABLE_JIT_EXECUTOR"),
        intra_op_threads=_count(config, "INTRA_OP_THREAD_COUNT"),
        inter_op_threads=_count(config, "INTER_OP_THREAD_COUNT"),
    )


# --- the module's signature and the config's tensors ---------------------------------------------------------


@dataclass(frozen=True)
class Signature:
    """forward()'s arguments (self left out) and what it returns, as the backend sees them."""

    #: (name, kind): kind is TENSOR, STRINGS (List[str]), "dict" (Dict[str, Tensor]) or the type as torch shows it
    arguments: tuple[tuple[str, str], ...]
    #: the kinds of the returned values: one for a Tensor or List[str], one per element for a tuple
    returns: tuple[str, ...]
    #: whether forward() returns a tuple (values are then indexed), as its schema says
    returns_tuple: bool
    #: the return type as torch shows it, for messages
    return_type: str = ""


@dataclass(frozen=True)
class Plan:
    """Where each config tensor goes: input name -> forward() argument position (or dict key when ``dict_input``),
    output name -> index of the returned value; ``string_inputs`` are fed as List[str]."""

    inputs: dict[str, int]
    outputs: dict[str, int]
    dict_input: bool
    string_inputs: frozenset[str] = field(default_factory=frozenset)
    output_types: dict[str, str] = field(default_factory=dict)


def _named_index(name: str) -> int | None:
    """The index of a ``<name>__<index>`` name (Triton splits at the first ``__``), else None."""
    start = name.find("__")
    rest = name[start + 2 :] if start >= 0 else ""
    return int(rest) if rest.isascii() and rest.isdigit() else None


def _mismatch(message: str, tensor: str | None = None, field_name: str | None = "name") -> ConfigMismatchError:
    return ConfigMismatchError(message, tensor=tensor, field=field_name if tensor is not None else None)


def _check_string_dims(config: ModelConfig, kind: str, entry: Any) -> None:
    dims = list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)
    if len(dims) + (1 if config.max_batch_size > 0 else 0) > 1:
        raise ConfigMismatchError(
            f"{kind} '{entry.name}' of model '{config.name}': a TYPE_STRING tensor travels as a List[str], so it must "
            "have one dimension in all (with a batching model: dims [ 1 ] and reshape { shape: [ ] })",
            tensor=entry.name,
            field="dims",
        )


def _check_data_types(config: ModelConfig) -> None:
    for kind, entries in (("input", config.input), ("output", config.output)):
        for entry in entries:
            name = data_type_name(entry.data_type)
            if name == STRING:
                _check_string_dims(config, kind, entry)
            elif name not in TORCH_DTYPES:
                supported = ", ".join([*TORCH_DTYPES, STRING])
                raise ConfigMismatchError(
                    f"{kind} '{entry.name}' of model '{config.name}': data_type {name} is not supported by the pytorch "
                    f"backend (supported: {supported})",
                    tensor=entry.name,
                    field="data_type",
                )


def _input_positions(config: ModelConfig, names: list[str]) -> dict[str, int]:
    """Triton's rules: every config name is an argument of forward() -> by argument; else every name is
    ``<name>__<index>`` -> by index; else the config's order."""
    inputs = [entry.name for entry in config.input]
    if all(name in names for name in inputs):
        return {name: names.index(name) for name in inputs}
    indexed = {name: _named_index(name) for name in inputs}
    if all(index is not None for index in indexed.values()):
        positions = {name: int(index or 0) for name, index in indexed.items()}
        for name, position in positions.items():
            if position >= len(names):
                raise _mismatch(
                    f"input '{name}' of model '{config.name}' names argument {position} of forward(), which takes "
                    f"{len(names)} ({', '.join(names) or 'none'})",
                    name,
                )
        _no_duplicates(config, "input", positions, "argument")
        return positions
    for position, name in enumerate(inputs):
        if name in names and names.index(name) != position:
            raise _mismatch(
                f"input '{name}' of model '{config.name}' is forward()'s argument {names.index(name)}, but inputs that "
                f"are not all named after forward()'s arguments ({', '.join(names)}) nor all <name>__<index> are fed "
                f"in the configuration's order, which would feed it as argument {position}: name every input after "
                "an argument, or use <name>__<index> names",
                name,
            )
    unnamed = [name for name in inputs if name not in names]
    logger.warning(
        "model '%s': input(s) %s are neither arguments of forward() (%s) nor <name>__<index>: feeding the inputs in "
        "the configuration's order, as Triton does",
        config.name,
        ", ".join(unnamed),
        ", ".join(names),
    )
    return {name: position for position, name in enumerate(inputs)}


def _no_duplicates(config: ModelConfig, kind: str, positions: dict[str, int], what: str) -> None:
    seen: dict[int, str] = {}
    for name, position in positions.items():
        if position in seen:
            raise _mismatch(
                f"{kind}s '{seen[position]}' and '{name}' of model '{config.name}' both name {what} {position}", name
            )
        seen[position] = name


def _output_positions(config: ModelConfig, signature: Signature) -> dict[str, int]:
    """Triton's rules: every output ``<name>__<index>`` -> by index; else the config's order."""
    outputs = [entry.name for entry in config.output]
    indexed = {name: _named_index(name) for name in outputs}
    if all(index is not None for index in indexed.values()):
        positions = {name: int(index or 0) for name, index in indexed.items()}
        _no_duplicates(config, "output", positions, "returned value")
    else:
        positions = {name: position for position, name in enumerate(outputs)}
    count = len(signature.returns)
    for name, position in positions.items():
        if position >= count:
            shown = f"a tuple of {count}" if signature.returns_tuple else "one value"
            raise _mismatch(
                f"output '{name}' of model '{config.name}' is returned value {position}, but forward() returns "
                f"{shown} ({signature.return_type})",
                name,
            )
    return positions


def plan(config: ModelConfig, signature: Signature) -> Plan:
    """Map the config's tensors onto ``signature``; ConfigMismatchError names the model and the tensor."""
    if not config.input:
        raise ModelLoadError(f"model '{config.name}': the configuration must list at least one input")
    if not config.output:
        raise ModelLoadError(f"model '{config.name}': the configuration must list at least one output")
    _check_data_types(config)
    arguments = list(signature.arguments)
    kinds = dict(arguments)
    unsupported = [f"'{n}' ({k})" for n, k in arguments if k not in (TENSOR, STRINGS, "dict")]
    dicts = [n for n, k in arguments if k == "dict"]
    if unsupported or (dicts and len(arguments) > 1):
        raise ModelLoadError(
            f"model '{config.name}': forward() takes {', '.join(unsupported) or 'a Dict(str, Tensor) among others'}; "
            "the pytorch backend feeds Tensor and List[str] arguments, or a single Dict(str, Tensor) argument"
        )
    types = {e.name: data_type_name(e.data_type) for e in [*config.input, *config.output]}
    if dicts:
        strings = [e.name for e in config.input if types[e.name] == STRING]
        if strings:
            raise _mismatch(
                f"input '{strings[0]}' of model '{config.name}' is TYPE_STRING, but forward() takes a "
                "Dict(str, Tensor): its values must be tensors",
                strings[0],
                "data_type",
            )
        inputs = {e.name: 0 for e in config.input}
    else:
        names = [name for name, _ in arguments]
        if len(config.input) != len(names):
            _arity_error(config, names)
        inputs = _input_positions(config, names)
        for name, position in inputs.items():
            _check_kind(config, "input", name, types[name], kinds[names[position]], f"argument '{names[position]}'")
    outputs = _output_positions(config, signature)
    for name, position in outputs.items():
        _check_kind(config, "output", name, types[name], signature.returns[position], f"returned value {position}")
    string_inputs = frozenset(name for name in inputs if types[name] == STRING)
    return Plan(inputs, outputs, bool(dicts), string_inputs, {e.name: types[e.name] for e in config.output})


def _arity_error(config: ModelConfig, names: list[str]) -> None:
    inputs = [entry.name for entry in config.input]
    takes = f"forward() takes {len(names)} ({', '.join(names) or 'none'})"
    if len(inputs) > len(names):
        extra = [n for n in inputs if n not in names] or inputs[len(names) :]
        raise _mismatch(
            f"model '{config.name}': the configuration lists {len(inputs)} inputs, {takes}: input '{extra[0]}' has no "
            "argument",
            extra[0],
        )
    missing = [n for n in names if n not in inputs] or names[len(inputs) :]
    raise ConfigMismatchError(
        f"model '{config.name}': the configuration lists {len(inputs)} inputs, {takes}: argument '{missing[0]}' gets "
        "no input (list one input per argument)",
        field="input",
    )


def _check_kind(config: ModelConfig, kind: str, name: str, data_type: str, model_kind: str, where: str) -> None:
    if (data_type == STRING) == (model_kind == STRINGS):
        return
    wanted = "List[str]" if model_kind == STRINGS else "a Tensor"
    raise _mismatch(
        f"{kind} '{name}' of model '{config.name}': the configuration says {data_type}, but forward()'s {where} is "
        f"{wanted} (TYPE_STRING tensors travel as List[str])",
        name,
        "data_type",
    )


# --- the config.pbtxt a model file may carry -----------------------------------------------------------------

#: the extra file of a TorchScript archive that declares the model's tensors (``torch.jit.save(m, path,
#: _extra_files={EMBEDDED_CONFIG: text})``)
EMBEDDED_CONFIG = "config.pbtxt"
_EMBEDDED_FIELDS = {"name", "max_batch_size", "input", "output"}


def parse_embedded(config: ModelConfig, text: bytes, artifact: str) -> ModelConfig:
    """The ``config.pbtxt`` carried by ``artifact``: a ModelConfig with only max_batch_size, input and output."""
    embedded = ModelConfig()
    where = f"model '{config.name}': the {EMBEDDED_CONFIG} inside '{artifact}'"
    try:
        text_format.Parse(text.decode("utf-8"), embedded)
    except (UnicodeDecodeError, text_format.ParseError) as exc:
        raise ModelLoadError(f"{where} cannot be read: {exc}") from None
    extra = sorted(f.name for f, _ in embedded.ListFields() if f.name not in _EMBEDDED_FIELDS)
    if extra:
        raise ModelLoadError(f"{where} may set only max_batch_size, input and output, not {', '.join(extra)}")
    for entry in [*embedded.input, *embedded.output]:
        if entry.data_type == 0 or (not entry.dims and not entry.HasField("reshape")):
            raise ModelLoadError(f"{where} must give data_type and dims for '{entry.name}'")
    return embedded


def complete_from_embedded(config: ModelConfig, embedded: ModelConfig) -> None:
    """Auto-complete ``config`` from the tensors the model file declares, and check the ones it gives, as the ONNX
    Runtime backend does from an ONNX graph."""
    if (not config.input or not config.output) and config.max_batch_size == 0 and embedded.max_batch_size > 0:
        config.max_batch_size = embedded.max_batch_size
        scheduled = any(config.HasField(f) for f in ("dynamic_batching", "sequence_batching"))
        if config.max_batch_size > 1 and not scheduled:
            config.dynamic_batching.SetInParent()
    for kind, declared, entries in (
        ("input", embedded.input, config.input),
        ("output", embedded.output, config.output),
    ):
        by_name = {entry.name: entry for entry in declared}
        if not entries:
            for source in declared:
                entry = entries.add(name=source.name, data_type=source.data_type)
                _complete_dims(config, embedded, kind, entry, source)
            continue
        for entry in entries:
            source = by_name.get(entry.name)
            if source is None:
                raise _mismatch(
                    f"configuration {kind} '{entry.name}' is not an {kind} of the model '{config.name}' (its "
                    f"{EMBEDDED_CONFIG} declares: {', '.join(by_name) or 'none'})",
                    entry.name,
                )
            if entry.data_type == 0:
                entry.data_type = source.data_type
            elif entry.data_type != source.data_type:
                raise _mismatch(
                    f"{kind} '{entry.name}' of model '{config.name}': configuration says "
                    f"{data_type_name(entry.data_type)}, the model has {data_type_name(source.data_type)}",
                    entry.name,
                    "data_type",
                )
            _complete_dims(config, embedded, kind, entry, source)


def _complete_dims(config: ModelConfig, embedded: ModelConfig, kind: str, entry: Any, source: Any) -> None:
    dims = list(source.reshape.shape) if source.HasField("reshape") else list(source.dims)
    full = ([-1] if embedded.max_batch_size > 0 else []) + dims
    complete_dims(entry, full, kind, entry.name, config.name, config.max_batch_size, f"model's shape {full}")


def require_complete(config: ModelConfig) -> None:
    """A config for a model file that declares nothing must list every tensor with data_type and dims."""
    why = (
        "a TorchScript model carries no tensor names, types or shapes, so the configuration must list every input "
        "and output with data_type and dims (Triton does not auto-complete pytorch models; a model file may declare "
        f"its tensors in an embedded {EMBEDDED_CONFIG})"
    )
    for kind, entries in (("input", config.input), ("output", config.output)):
        if not entries:
            raise ConfigMismatchError(f"model '{config.name}' has no {kind} section: {why}", field=kind)
        for entry in entries:
            if entry.data_type == 0:
                raise ConfigMismatchError(
                    f"{kind} '{entry.name}' of model '{config.name}' has no data_type: {why}",
                    tensor=entry.name,
                    field="data_type",
                )
            if not entry.dims and not entry.HasField("reshape"):
                raise ConfigMismatchError(
                    f"{kind} '{entry.name}' of model '{config.name}' has no dims: {why}",
                    tensor=entry.name,
                    field="dims",
                )
