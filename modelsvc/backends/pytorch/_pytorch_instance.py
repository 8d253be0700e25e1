"""A PyTorch instance: one TorchScript module on one device that runs batches, with the conversions torch needs
(BF16 through raw 16-bit data, TYPE_STRING as List[str]) and torch's errors mapped to the server's.

Inputs that fit the config but not each other (add_sub's [2,3] with [2,4]) fail one of ATen's shape checks, which
torch raises as a plain RuntimeError, as it raises most faults: TorchScript declares no shapes to check against,
and torch gives these checks no class of their own. So their wording decides (``_SHAPE_CHECKS``, ATen's
messages for broadcasting, matmul, cat/stack, view/reshape, expand, conv channels, layer_norm): such a failure is a
400 naming the inputs in torch's words; anything else (out of memory has its class, torch.OutOfMemoryError) a 500.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from modelsvc.protocol import InternalError, InvalidArgument, Unavailable

from .._base import Arrays
from .._shapes import InputsMismatch, shapes_of
from ._pytorch_spec import TORCH_DTYPES, PyTorchOptions
from ._pytorch_spec import Plan as IOPlan

try:  # BF16 tensors travel as ml_dtypes.bfloat16 arrays, which torch.from_numpy cannot take
    import ml_dtypes as _ml_dtypes

    _BF16: np.dtype[Any] | None = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

#: torch dtype -> config data_type, for the check of what forward() returned
_CONFIG_TYPES = {getattr(torch, name): config for config, name in TORCH_DTYPES.items()}


def _to_tensor(array: np.ndarray[Any, Any], device: torch.device) -> torch.Tensor:
    if _BF16 is not None and array.dtype == _BF16:
        tensor = torch.from_numpy(np.ascontiguousarray(array).view(np.int16).copy()).view(torch.bfloat16)
    else:
        # from_numpy shares memory: copy what is read-only (wire buffers) or not contiguous, as forward() may write
        if not array.flags.writeable or not array.flags.c_contiguous:
            array = np.array(array, order="C")
        tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device)


def _to_strings(array: np.ndarray[Any, Any], name: str) -> list[str]:
    out: list[str] = []
    for i, item in enumerate(array.reshape(-1)):
        try:
            out.append(item.decode("utf-8") if isinstance(item, bytes | bytearray) else str(item))
        except UnicodeDecodeError:
            raise InvalidArgument(
                f"input '{name}': PyTorch takes strings as List[str], which needs UTF-8; element {i} is not valid UTF-8"
            ) from None
    return out


def _from_tensor(tensor: torch.Tensor) -> np.ndarray[Any, Any]:
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16 and _BF16 is not None:
        return tensor.view(torch.int16).numpy().view(_BF16)
    return tensor.numpy()


class PyTorchInstance:
    """One TorchScript module on ``device`` (``cpu`` or ``cuda:N``). torch releases the GIL in its ops, so the
    instances' worker threads overlap."""

    def __init__(
        self,
        name: str,
        model: str,
        device: torch.device,
        module: Any,
        plan: IOPlan,
        options: PyTorchOptions,
        batching: bool,
    ) -> None:
        self.name = name
        self.model = model
        self.device = "cpu" if device.type == "cpu" else f"gpu:{device.index or 0}"
        self.providers = [f"PyTorch {torch.__version__} ({device})"]
        self._torch_device = device
        self._module: Any = module
        self._plan = plan
        self._options = options
        self._batching = batching
        self._arity = 1 if plan.dict_input else max(plan.inputs.values(), default=-1) + 1
        self._lock = threading.Lock()

    def _arguments(self, inputs: Arrays) -> list[Any]:
        plan = self._plan
        missing = [name for name in plan.inputs if name not in inputs]
        if missing:
            raise InvalidArgument(f"model '{self.model}' needs input '{missing[0]}' (forward() takes every input)")
        if plan.dict_input:
            return [{name: _to_tensor(inputs[name], self._torch_device) for name in plan.inputs}]
        arguments: list[Any] = [None] * self._arity
        for name, position in plan.inputs.items():
            array = inputs[name]
            arguments[position] = (
                _to_strings(array, name) if name in plan.string_inputs else _to_tensor(array, self._torch_device)
            )
        return arguments

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Arrays:
        """Run forward(); ``output_names`` empty means every configured output."""
        module = self._module
        if module is None:
            raise Unavailable(f"model instance '{self.name}' is closed")
        options = self._options
        with self._lock, torch.no_grad(), torch.inference_mode(options.inference_mode):
            arguments = self._arguments(inputs)
            try:
                with torch.jit.optimized_execution(options.optimized_execution):  # type: ignore[attr-defined]
                    result = module(*arguments)
            except (RuntimeError, torch.jit.Error, ValueError, TypeError, IndexError, KeyError) as exc:
                words = _shape_words(exc)
                if words is not None:
                    raise InputsMismatch(shapes_of(inputs), words, self.model) from exc
                raise InternalError(
                    f"PyTorch execute failure in instance '{self.name}' of model '{self.model}': {exc}"
                ) from exc
            finally:
                if options.cache_cleaning and self._torch_device.type == "cuda":
                    torch.cuda.empty_cache()
            values = list(result) if isinstance(result, tuple) else [result]
            batch = _batch_size(inputs) if self._batching else None
            return {name: self._output(name, values, batch) for name in (list(output_names) or self._plan.outputs)}

    def _output(self, name: str, values: list[Any], batch: int | None) -> np.ndarray[Any, Any]:
        position = self._plan.outputs[name]
        where = f"output '{name}' of model '{self.model}' (returned value {position})"
        if position >= len(values):
            raise InternalError(f"{where}: forward() returned only {len(values)} value(s)")
        value = values[position]
        if isinstance(value, torch.Tensor):
            wanted = self._plan.output_types[name]
            got = _CONFIG_TYPES.get(value.dtype, str(value.dtype))
            if got != wanted:
                raise InternalError(f"{where}: the configuration says {wanted}, forward() returned {got}")
            if value.dim() == 0:
                raise InternalError(f"{where}: forward() returned a scalar, which a tensor output cannot carry")
            array = _from_tensor(value)
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            array = np.empty(len(value), dtype=np.object_)
            for i, item in enumerate(value):
                array[i] = item.encode("utf-8")
        else:
            raise InternalError(f"{where}: forward() returned {type(value).__name__}, not a Tensor or List[str]")
        if batch is not None and array.shape[0] != batch:
            raise InternalError(f"{where}: its first dimension is {array.shape[0]}, but the batch has {batch} rows")
        return array

    def close(self) -> None:
        self._module = None
        if self._torch_device.type == "cuda":
            torch.cuda.empty_cache()

    def __repr__(self) -> str:
        return f"PyTorchInstance(name={self.name!r}, device={self.device!r}, providers={self.providers!r})"


#: ATen's wording of its shape checks (torch 2.x): what a request's shapes that do not fit each other raise
_SHAPE_CHECKS = re.compile(
    r"must match the size of tensor"  # broadcasting: The size of tensor a (3) must match the size of tensor b (4)
    r"|shapes cannot be multiplied"  # mat1 and mat2 shapes cannot be multiplied (2x3 and 4x2)
    r"|Sizes of tensors must match except in dimension"  # cat
    r"|stack expects each tensor to be equal size"
    r"|is invalid for input of size"  # view / reshape: shape '[4, -1]' is invalid for input of size 6
    r"|The expanded size of the tensor"
    r"|Expected size for first two dimensions of batch2 tensor"  # bmm
    r"|^size mismatch, got"  # mv / addmv
    r"|inconsistent tensor size"  # dot
    r"|channels, but got \d+ channels instead"  # conv
    r"|expected input with shape \[\*"  # layer_norm
)


def _shape_words(exc: BaseException) -> str | None:
    """torch's own words (the last line: TorchScript puts its traceback first) where ``exc`` is one of ATen's shape
    checks; None for anything else."""
    if not isinstance(exc, RuntimeError) or isinstance(exc, torch.OutOfMemoryError):
        return None
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    last = lines[-1].removeprefix("RuntimeError: ") if lines else ""
    return last if _SHAPE_CHECKS.search(last) else None


def _batch_size(inputs: Arrays) -> int | None:
    for array in inputs.values():
        if array.ndim:
            return int(array.shape[0])
    return None
