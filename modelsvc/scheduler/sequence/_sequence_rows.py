"""The tensors of one sequence batch's rows: the request's own inputs, its control tensors and its implicit state.

Pure functions, no event loop: ``request_params`` reads and checks a request's ``sequence_id``,
``sequence_start`` and ``sequence_end``; ``row_inputs`` builds a request's row as the model takes it (READY
true), ``empty_row`` an empty slot's padding (READY false); ``take_state`` moves the state outputs out of a row's
answer.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from ...protocol import InternalError, InvalidArgument
from ._sequence_config import CORRID, END, READY, START, SequenceSettings

Arrays = dict[str, np.ndarray[Any, Any]]
CorrId = int | str


def request_params(params: dict[str, Any] | None, model: str) -> tuple[CorrId, bool, bool]:
    """(correlation id, start, end) of a request, as tritonclient sends them (HTTP JSON or gRPC parameters)."""
    params = params or {}
    corrid = params.get("sequence_id", 0)
    if isinstance(corrid, bool) or not isinstance(corrid, int | str):
        raise InvalidArgument(
            f"request parameter 'sequence_id' must be an unsigned integer or a string, got {corrid!r}"
        )
    if isinstance(corrid, int) and not 0 <= corrid < 2**64:
        raise InvalidArgument(f"request parameter 'sequence_id' must be an unsigned 64-bit integer, got {corrid}")
    if corrid == 0 or corrid == "":
        raise InvalidArgument(
            f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
        )
    return corrid, _flag(params, "sequence_start"), _flag(params, "sequence_end")


def _flag(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InvalidArgument(f"request parameter '{key}' must be a boolean, got {value!r}")


def corrid_value(settings: SequenceSettings, corrid: CorrId, model: str) -> Any:
    """The correlation id as the CORRID control tensor holds it; InvalidArgument when it does not fit."""
    control = settings.corrid
    if control is None:
        return None
    if control.dtype == np.dtype(object):
        return corrid.encode() if isinstance(corrid, str) else str(corrid).encode()
    if isinstance(corrid, str):
        raise InvalidArgument(
            f"inference request to model '{model}' has string correlation ID '{corrid}', but its CORRID control "
            f"'{control.name}' takes integers ({control.dtype.name.upper()})"
        )
    info = np.iinfo(control.dtype)
    if not info.min <= corrid <= info.max:
        raise InvalidArgument(
            f"correlation ID {corrid} does not fit the CORRID control '{control.name}' of model '{model}' "
            f"({control.dtype.name.upper()})"
        )
    return corrid


def shape_key(inputs: Arrays) -> Hashable:
    """Rows batch together only when their tensors agree in names and shapes."""
    return tuple((name, array.shape, array.dtype.str) for name, array in inputs.items())


def row_inputs(
    settings: SequenceSettings,
    inputs: Arrays,
    state: Arrays | None,
    *,
    start: bool,
    end: bool,
    corrid: Any,
) -> Arrays:
    """A request's row as the model takes it: ``inputs`` with the control tensors (READY true) and the state
    inputs added (each with a batch dimension of 1 when the model batches); ``state`` None: the initial state."""
    batched = settings.max_batch_size > 0
    shape = (1, 1) if batched else (1,)
    row = dict(inputs)
    for kind, control in settings.controls.items():
        if kind == CORRID:
            value = corrid if corrid is not None else (b"" if control.dtype == np.dtype(object) else 0)
            row[control.name] = np.full(shape, value, dtype=control.dtype)
        else:
            on = {START: start, END: end, READY: True}[kind]
            row[control.name] = np.full(shape, control.value(on), dtype=control.dtype)
    for spec in settings.states:
        value = state[spec.input_name] if state is not None else spec.start_value()
        row[spec.input_name] = value[np.newaxis] if batched else value
    return row


def empty_row(settings: SequenceSettings, template: Arrays) -> Arrays:
    """An empty slot's row in a direct batch: zeros shaped as ``template`` with READY (and START, END) false."""
    row: Arrays = {}
    for name, array in template.items():
        if array.dtype == np.dtype(object):
            row[name] = np.full(array.shape, b"", dtype=object)
        else:
            row[name] = np.zeros_like(array)
    for kind, control in settings.controls.items():
        if kind != CORRID:
            row[control.name] = np.full(template[control.name].shape, control.value(False), dtype=control.dtype)
    return row


def take_state(settings: SequenceSettings, answer: Arrays, model: str) -> Arrays | None:
    """The state outputs of a row's answer as the next state inputs (copies, without the batch dimension);
    InternalError when the model did not return one."""
    if not settings.states:
        return None
    batched = settings.max_batch_size > 0
    state: Arrays = {}
    for spec in settings.states:
        value = answer.get(spec.output_name)
        if value is None:
            raise InternalError(f"model '{model}' did not return the state output '{spec.output_name}'")
        if batched:
            if value.ndim == 0 or value.shape[0] != 1:
                raise InternalError(
                    f"model '{model}' returned state output '{spec.output_name}' with shape {list(value.shape)}; "
                    "expected a batch dimension of 1"
                )
            value = value[0]
        if value.dtype != spec.dtype and spec.dtype != np.dtype(object):
            raise InternalError(
                f"model '{model}' returned state output '{spec.output_name}' as {value.dtype}; the state is "
                f"{spec.datatype}"
            )
        state[spec.input_name] = np.array(value, copy=True)
    return state
