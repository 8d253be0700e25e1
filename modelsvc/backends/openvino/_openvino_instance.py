"""An OpenVINO instance: one InferRequest of a CompiledModel that other instances share. It checks a batch's
shapes against the compiled model's (400 naming the tensor), answers a failed inference whose inputs the model's
shape inference rejects with a 400 naming them (``_openvino_shapes``), pads a short batch to a fixed one where
``ENABLE_BATCH_PADDING`` asks, and carries BF16 through as raw 16-bit data."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import openvino as ov

from modelsvc.protocol import InternalError, InvalidArgument, Unavailable

from .._base import Arrays
from .._shapes import InputsMismatch, Verdicts, shapes_of
from ._openvino_shapes import words

try:  # BF16 travels as ml_dtypes.bfloat16 arrays; OpenVINO's numpy view of a bf16 tensor is float16-typed bits
    import ml_dtypes as _ml_dtypes

    _BF16: np.dtype[Any] | None = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None


_I32 = np.iinfo(np.int32)


class _Input:
    __slots__ = ("bf16", "dims", "name")

    def __init__(self, name: str, dims: list[int] | None, bf16: bool) -> None:
        self.name = name
        self.dims = dims
        self.bf16 = bf16


class OpenVINOInstance:
    """One InferRequest. OpenVINO releases the GIL while it infers, so the instances of one compiled model run
    their batches at the same time, each on its own worker thread, across the model's streams."""

    def __init__(
        self,
        name: str,
        model: str,
        device: str,
        request: ov.InferRequest,
        compiled: ov.CompiledModel,
        fixed_batch: int | None = None,
        batch_padding: bool = False,
        verdicts: Verdicts | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.device = "cpu"
        self.providers = [f"OpenVINO {device}"]
        self._request: ov.InferRequest | None = request
        self._compiled: ov.CompiledModel | None = compiled  # its request's model (the group's other instances' too)
        self._fixed_batch = fixed_batch
        self._padding = batch_padding
        self._verdicts = verdicts
        self._inputs: dict[str, _Input] = {}
        for port in compiled.inputs:
            shape = port.get_partial_shape()
            dims = None if shape.rank.is_dynamic else [d.get_length() if d.is_static else -1 for d in shape]
            entry = _Input(port.get_any_name(), dims, port.get_element_type() == ov.Type.bf16)
            for alias in port.get_names():
                self._inputs[alias] = entry
        #: each model input's names: OpenVINO runs an input left unset on the last request's data
        self._required = [(port.get_any_name(), frozenset(port.get_names())) for port in compiled.inputs]
        self._outputs = [port.get_any_name() for port in compiled.outputs]
        self._bf16_outputs = {
            alias for port in compiled.outputs if port.get_element_type() == ov.Type.bf16 for alias in port.get_names()
        }
        self._lock = threading.Lock()

    def _check(self, name: str, array: np.ndarray[Any, Any]) -> None:
        spec = self._inputs.get(name)
        if spec is None:
            raise InvalidArgument(f"model '{self.model}' has no input '{name}'")
        if spec.dims is None:
            return
        shape = list(array.shape)
        dims = list(spec.dims)
        if self._fixed_batch is not None and dims:
            dims[0] = -1  # ``_pad`` checks the batch
        if len(shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, shape, strict=True)):
            raise InvalidArgument(
                f"input '{name}' of model '{self.model}': shape {shape} does not fit the model's shape "
                f"{['?' if d == -1 else d for d in spec.dims]}"
            )

    def _check_range(self, name: str, array: np.ndarray[Any, Any]) -> None:
        """OpenVINO's CPU plugin computes INT64 / UINT64 as signed 32-bit integers (UINT64 too: 2**31 + 5 plus one
        came back as 2**64 - 2147483642): a value beyond that would come back wrong."""
        if array.size == 0 or array.dtype not in (np.int64, np.uint64):
            return
        low, high = (_I32.min if array.dtype == np.int64 else 0), _I32.max
        if int(array.min()) < low or int(array.max()) > high:
            raise InvalidArgument(
                f"input '{name}' of model '{self.model}': OpenVINO's CPU plugin computes {array.dtype.name.upper()} "
                f"in signed 32 bits, and a value lies outside [{low}, {high}]"
            )

    def _pad(self, inputs: Arrays) -> tuple[Arrays, int | None]:
        """Pad every input's batch to the fixed batch; return the inputs and the real batch size."""
        fixed = self._fixed_batch
        if fixed is None or not inputs:
            return inputs, None
        rows = next(iter(inputs.values())).shape[0]
        if rows == fixed:
            return inputs, None
        if not self._padding or rows > fixed:
            raise InvalidArgument(
                f"model '{self.model}' runs batches of exactly {fixed} (SKIP_OV_DYNAMIC_BATCHSIZE), got {rows}: "
                "send full batches, or set parameter ENABLE_BATCH_PADDING to YES at a cost in compute"
            )
        padded = {}
        for name, array in inputs.items():
            pad = np.zeros((fixed - rows, *array.shape[1:]), dtype=array.dtype)
            padded[name] = np.concatenate([array, pad])
        return padded, rows

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Arrays:
        """Run the request on ``inputs``; ``output_names`` empty means every model output."""
        request = self._request
        if request is None:
            raise Unavailable(f"model instance '{self.name}' is closed")
        for name, array in inputs.items():
            self._check(name, array)
            self._check_range(name, array)
        for name, aliases in self._required:
            if aliases.isdisjoint(inputs):
                raise InvalidArgument(f"model '{self.model}' needs input '{name}' (OpenVINO takes every input)")
        feed_arrays, rows = self._pad(inputs)
        feed: dict[str, Any] = {}
        for name, array in feed_arrays.items():
            data = np.ascontiguousarray(array)
            if self._inputs[name].bf16:
                if data.dtype != _BF16:
                    raise InvalidArgument(f"input '{name}' of model '{self.model}': expected BF16 data")
                feed[name] = ov.Tensor(data.view(np.uint16), ov.Shape(list(data.shape)), ov.Type.bf16)
            else:
                feed[name] = data
        names = list(output_names) or self._outputs
        out: Arrays = {}
        try:
            with self._lock:
                request.infer(feed, share_inputs=True, share_outputs=True)
                for name in names:
                    data = request.get_tensor(name).data
                    if name in self._bf16_outputs and _BF16 is not None:
                        data = data.view(np.uint16).view(_BF16)
                    out[name] = np.array(data[:rows] if rows is not None else data, copy=True)
        except RuntimeError as exc:
            rejected = self._verdicts.rejects(shapes_of(feed_arrays)) if self._verdicts is not None else None
            if rejected is not None:
                raise InputsMismatch(
                    shapes_of(inputs), f"{words(exc)} (OpenVINO shape inference: {rejected})", self.model
                ) from exc
            raise InternalError(f"openvino error in instance '{self.name}': {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise InternalError(f"openvino error in instance '{self.name}': {exc}") from exc
        return out

    def close(self) -> None:
        self._request = None
        self._compiled = None  # freed with the group's last instance, though a scheduler still holds the closed ones

    def __repr__(self) -> str:
        return f"OpenVINOInstance(name={self.name!r}, device={self.device!r}, providers={self.providers!r})"
