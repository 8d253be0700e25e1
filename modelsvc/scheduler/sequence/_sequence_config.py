"""Triton's ``sequence_batching`` read from a model config: the strategy, the control inputs, implicit state.

``SequenceSettings.from_model_config(config)`` checks what Triton checks at load and raises
``SequenceConfigError`` naming the field; ``load_initial_states(settings, model_dir)`` reads the ``data_file``
initial states from the model's ``initial_state/`` folder (a ``ModelLoadError`` when one is missing or short).

Defaults as in Triton: strategy ``direct``; ``max_sequence_idle_microseconds`` 1 s; each instance has
``max(1, max_batch_size)`` sequence slots, or ``oldest.max_candidate_sequences`` when set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from ...backends import ModelConfig, ModelLoadError
from ...protocol import CONFIG_TO_WIRE, NUMPY_DTYPES

_Control = model_config_pb2.ModelSequenceBatching.Control
START = "START"
END = "END"
READY = "READY"
CORRID = "CORRID"
_KINDS = {
    _Control.CONTROL_SEQUENCE_START: START,
    _Control.CONTROL_SEQUENCE_END: END,
    _Control.CONTROL_SEQUENCE_READY: READY,
    _Control.CONTROL_SEQUENCE_CORRID: CORRID,
}
_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
DEFAULT_IDLE_US = 1_000_000
"""Triton's ``max_sequence_idle_microseconds`` when the config leaves it 0."""
INITIAL_STATE_FOLDER = "initial_state"
"""Where ``initial_state { data_file }`` names are looked up, inside the model directory (Triton's place)."""


class SequenceConfigError(ValueError):
    """A ``sequence_batching`` the server cannot run; ``field`` names the config field where known."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _type_name(value: int) -> str:
    return str(model_config_pb2.DataType.Name(value))


def _numpy_dtype(type_name: str) -> np.dtype[Any]:
    wire = CONFIG_TO_WIRE.get(type_name, type_name)
    dtype = NUMPY_DTYPES.get(wire)
    return np.dtype(object) if dtype is None else np.dtype(dtype)


@dataclass(frozen=True, slots=True)
class ControlTensor:
    """One control input: the tensor ``name`` of ``kind`` (START, END, READY, CORRID)."""

    kind: str
    name: str
    dtype: np.dtype[Any]
    false_value: Any = 0
    true_value: Any = 1

    def value(self, on: bool) -> Any:
        return self.true_value if on else self.false_value


@dataclass(slots=True)
class StateTensor:
    """One implicit state: fed as ``input_name``, replaced by the model's ``output_name`` after each request."""

    input_name: str
    output_name: str
    datatype: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    initial_dims: tuple[int, ...] | None = None
    data_file: str | None = None
    initial: np.ndarray[Any, Any] | None = None
    """The initial state of one sequence without the batch dimension (zeros or the data file)."""

    def start_value(self) -> np.ndarray[Any, Any]:
        if self.initial is not None:
            return self.initial
        shape = tuple(0 if d == -1 else d for d in (self.initial_dims or self.dims))
        if self.dtype == np.dtype(object):
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=self.dtype)


@dataclass(slots=True)
class SequenceSettings:
    strategy: str
    """``direct`` or ``oldest``."""
    max_batch_size: int
    slots: int
    """Sequence slots per instance (``direct``: max(1, max_batch_size); ``oldest``: max_candidate_sequences)."""
    idle_ns: int
    max_queue_delay_ns: int = 0
    minimum_slot_utilization: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    controls: dict[str, ControlTensor] = field(default_factory=dict)
    states: list[StateTensor] = field(default_factory=list)

    @property
    def corrid(self) -> ControlTensor | None:
        return self.controls.get(CORRID)

    @property
    def input_names(self) -> set[str]:
        """Tensors the server feeds the model besides the client's inputs."""
        return {c.name for c in self.controls.values()} | {s.input_name for s in self.states}

    @property
    def state_outputs(self) -> tuple[str, ...]:
        return tuple(s.output_name for s in self.states)

    @classmethod
    def from_model_config(cls, config: ModelConfig) -> SequenceSettings | None:
        """The settings of a config with ``sequence_batching``, else None; SequenceConfigError for a bad one."""
        if not config.HasField("sequence_batching"):
            return None
        sb = config.sequence_batching
        if sb.iterative_sequence:
            raise SequenceConfigError(
                "sequence_batching iterative_sequence is not supported by modelsvc", "iterative_sequence"
            )
        mbs = int(config.max_batch_size)
        idle_us = sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US
        settings = cls("direct", mbs, max(1, mbs), idle_us * 1000)
        if sb.HasField("oldest"):
            old = sb.oldest
            settings.strategy = "oldest"
            if old.max_candidate_sequences > 0:
                settings.slots = int(old.max_candidate_sequences)
            settings.max_queue_delay_ns = int(old.max_queue_delay_microseconds) * 1000
            settings.preserve_ordering = bool(old.preserve_ordering)
            for size in old.preferred_batch_size:
                if not 1 <= size <= max(1, mbs):
                    raise SequenceConfigError(
                        f"sequence_batching oldest preferred_batch_size {size} must be between 1 and "
                        f"max_batch_size ({mbs})",
                        "preferred_batch_size",
                    )
            settings.preferred_batch_sizes = tuple(sorted(set(old.preferred_batch_size)))
        elif sb.HasField("direct"):
            direct = sb.direct
            settings.max_queue_delay_ns = int(direct.max_queue_delay_microseconds) * 1000
            util = float(direct.minimum_slot_utilization)
            if not 0.0 <= util <= 1.0:
                raise SequenceConfigError(
                    f"sequence_batching direct minimum_slot_utilization must be between 0 and 1, got {util}",
                    "minimum_slot_utilization",
                )
            settings.minimum_slot_utilization = util
        settings.controls = _controls(sb)
        settings.states = _states(sb, settings.controls)
        inputs = {entry.name for entry in config.input}
        for name in settings.input_names & inputs:
            raise SequenceConfigError(
                f"sequence_batching feeds input '{name}' (a control or state input); remove it from the "
                "model's input list",
                "input",
            )
        # a state output may also be listed in ``output``: a client may then ask for it (for debugging, as in Triton)
        return settings


def _controls(sb: Any) -> dict[str, ControlTensor]:
    controls: dict[str, ControlTensor] = {}
    names: set[str] = set()
    for entry in sb.control_input:
        if not entry.name:
            raise SequenceConfigError("sequence_batching control_input has no name", "control_input")
        if entry.name in names:
            raise SequenceConfigError(
                f"sequence_batching control_input '{entry.name}' is listed more than once", "control_input"
            )
        names.add(entry.name)
        if len(entry.control) != 1:
            raise SequenceConfigError(
                f"sequence_batching control_input '{entry.name}' must have exactly one control, it has "
                f"{len(entry.control)}",
                "control",
            )
        control = entry.control[0]
        kind = _KINDS.get(control.kind)
        if kind is None:
            raise SequenceConfigError(
                f"sequence_batching control_input '{entry.name}' has kind {_Control.Kind.Name(control.kind)}; "
                "modelsvc supports CONTROL_SEQUENCE_START, _END, _READY and _CORRID",
                "kind",
            )
        if kind in controls:
            raise SequenceConfigError(
                f"sequence_batching has more than one CONTROL_SEQUENCE_{kind} control "
                f"('{controls[kind].name}' and '{entry.name}')",
                "kind",
            )
        controls[kind] = _control(entry.name, kind, control)
    return controls


def _control(name: str, kind: str, control: Any) -> ControlTensor:
    pairs = [
        ("int32_false_true", "TYPE_INT32", list(control.int32_false_true)),
        ("fp32_false_true", "TYPE_FP32", list(control.fp32_false_true)),
        ("bool_false_true", "TYPE_BOOL", list(control.bool_false_true)),
    ]
    given = [(f, t, v) for f, t, v in pairs if v]
    if kind == CORRID:
        if given:
            raise SequenceConfigError(
                f"sequence_batching control '{name}' (CONTROL_SEQUENCE_CORRID) takes data_type, not {given[0][0]}",
                given[0][0],
            )
        type_name = _type_name(control.data_type)
        if type_name not in _CORRID_TYPES:
            raise SequenceConfigError(
                f"sequence_batching control '{name}' (CONTROL_SEQUENCE_CORRID) has data_type {type_name}; "
                f"it must be one of {', '.join(_CORRID_TYPES)}",
                "data_type",
            )
        return ControlTensor(kind, name, _numpy_dtype(type_name))
    if control.data_type != model_config_pb2.TYPE_INVALID:
        raise SequenceConfigError(
            f"sequence_batching control '{name}' (CONTROL_SEQUENCE_{kind}) takes int32_false_true, "
            "fp32_false_true or bool_false_true, not data_type",
            "data_type",
        )
    if len(given) != 1:
        raise SequenceConfigError(
            f"sequence_batching control '{name}' (CONTROL_SEQUENCE_{kind}) must set exactly one of "
            "int32_false_true, fp32_false_true or bool_false_true",
            "control",
        )
    field_name, type_name, values = given[0]
    if len(values) != 2:
        raise SequenceConfigError(
            f"sequence_batching control '{name}' (CONTROL_SEQUENCE_{kind}) {field_name} must have exactly 2 "
            f"values (false, true), got {len(values)}",
            field_name,
        )
    dtype = _numpy_dtype(type_name)
    return ControlTensor(kind, name, dtype, values[0], values[1])


def _states(sb: Any, controls: dict[str, ControlTensor]) -> list[StateTensor]:
    states: list[StateTensor] = []
    taken = {c.name for c in controls.values()}
    outputs: set[str] = set()
    for entry in sb.state:
        if not entry.input_name or not entry.output_name:
            raise SequenceConfigError("sequence_batching state needs both input_name and output_name", "state")
        if entry.input_name in taken:
            raise SequenceConfigError(
                f"sequence_batching state input '{entry.input_name}' is already a control or state input",
                "input_name",
            )
        if entry.output_name in outputs:
            raise SequenceConfigError(
                f"sequence_batching state output '{entry.output_name}' is listed more than once", "output_name"
            )
        taken.add(entry.input_name)
        outputs.add(entry.output_name)
        type_name = _type_name(entry.data_type)
        if entry.data_type == model_config_pb2.TYPE_INVALID:
            raise SequenceConfigError(f"sequence_batching state '{entry.input_name}' has no data_type", "data_type")
        dims = tuple(int(d) for d in entry.dims)
        if not dims or any(d < 1 and d != -1 for d in dims):
            raise SequenceConfigError(
                f"sequence_batching state '{entry.input_name}' has dims {list(dims)}: give at least one "
                "dimension, each at least 1 or -1",
                "dims",
            )
        state = StateTensor(
            entry.input_name,
            entry.output_name,
            CONFIG_TO_WIRE.get(type_name, type_name),
            _numpy_dtype(type_name),
            dims,
        )
        if len(entry.initial_state) > 1:
            raise SequenceConfigError(
                f"initial_state field for state input '{entry.input_name}' must contain exactly one or zero "
                f"element. Found '{len(entry.initial_state)}' elements.",
                "initial_state",
            )
        if entry.initial_state:
            _initial(state, entry.initial_state[0], entry.data_type)
        states.append(state)
    return states


def _initial(state: StateTensor, initial: Any, data_type: int) -> None:
    """Triton's checks of an ``initial_state``; zero data is made here, a data file read at load."""
    name = state.input_name
    if initial.data_type != data_type:
        raise SequenceConfigError(
            f"The data type used for 'initial_state' field of state '{name}' does not match the state data type.",
            "initial_state",
        )
    if not initial.name:
        raise SequenceConfigError(
            f"Field 'name' must be set when using initial_state for state input '{name}'.", "initial_state"
        )
    dims = tuple(int(d) for d in initial.dims)
    if len(dims) != len(state.dims):
        raise SequenceConfigError(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state "
            f"input '{name}'. {len(dims)} != {len(state.dims)}",
            "initial_state",
        )
    for given, declared in zip(dims, state.dims, strict=True):
        if given == -1:
            raise SequenceConfigError(
                f"'initial_state' field for state input name '{name}' contains variable dimensions.", "initial_state"
            )
        if declared != -1 and given != declared:
            raise SequenceConfigError(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim description. "
                f"{given} != {declared}",
                "initial_state",
            )
    state.initial_dims = dims
    choice = initial.WhichOneof("state_data")
    if choice == "data_file":
        state.data_file = initial.data_file
    elif choice != "zero_data":
        raise SequenceConfigError(
            f"initial_state of state input '{name}' must set zero_data or data_file", "initial_state"
        )


def load_initial_states(settings: SequenceSettings, model_dir: Path) -> None:
    """Read each ``data_file`` initial state from ``<model_dir>/initial_state/`` (raw row-major bytes; for
    TYPE_STRING 4-byte little-endian lengths each followed by its bytes)."""
    for state in settings.states:
        if state.data_file is None:
            continue
        assert state.initial_dims is not None
        path = model_dir / INITIAL_STATE_FOLDER / state.data_file
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ModelLoadError(
                f"initial_state data_file of state input '{state.input_name}': cannot read '{path}': "
                f"{exc.strerror or exc}"
            ) from None
        count = int(np.prod(state.initial_dims))
        if state.dtype == np.dtype(object):
            state.initial = _strings(raw, count, state.input_name).reshape(state.initial_dims)
            continue
        need = count * state.dtype.itemsize
        if len(raw) < need:
            raise ModelLoadError(
                f"initial_state setting expects {need} bytes, but the data provided from {state.data_file} only "
                f"has {len(raw)} bytes."
            )
        state.initial = np.frombuffer(raw[:need], dtype=state.dtype).reshape(state.initial_dims).copy()


def _strings(raw: bytes, count: int, name: str) -> np.ndarray[Any, Any]:
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + 4 > len(raw):
            raise ModelLoadError(f"initial_state data_file of state input '{name}' holds fewer than {count} strings")
        size = int.from_bytes(raw[pos : pos + 4], "little")
        out[i] = raw[pos + 4 : pos + 4 + size]
        pos += 4 + size
    return out
