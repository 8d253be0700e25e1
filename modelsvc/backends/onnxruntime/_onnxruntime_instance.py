"""An ONNX Runtime instance: one session that runs batches, with the conversions ORT needs for BYTES
(UTF-8 strings) and BF16 (raw 16-bit data through OrtValues), and ORT's errors mapped to the server's: its
INVALID_ARGUMENT is a 400, and so is a failed run whose inputs' shapes the model rejects (``_onnxruntime_shapes``);
any other failure is a 500."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from modelsvc.protocol import InternalError, InvalidArgument, Unavailable

from .._base import Arrays
from .._shapes import InputsMismatch, Verdicts, named_dims_disagree, shapes_of
from ._onnxruntime_shapes import declared_dims


def _to_ort_strings(array: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
    flat = array.reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.object_)
    try:
        for i, item in enumerate(flat):
            out[i] = item.decode("utf-8") if isinstance(item, bytes | bytearray) else str(item)
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"input '{name}': ONNX Runtime string tensors need UTF-8; element {i} is not valid UTF-8"
        ) from None
    return out.reshape(array.shape)


def _from_ort_strings(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    flat = array.reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.object_)
    for i, item in enumerate(flat):
        out[i] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out.reshape(array.shape)


class OnnxRuntimeInstance:
    """One ONNX Runtime session. ORT releases the GIL while it runs."""

    def __init__(
        self,
        name: str,
        device: str,
        providers: list[str],
        session: ort.InferenceSession,
        run_options: ort.RunOptions | None = None,
        model: str | None = None,
        verdicts: Verdicts | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self._verdicts = verdicts
        self.device = device
        self.providers = providers
        self._session: ort.InferenceSession | None = session
        self._run_options = run_options
        self._string_inputs = {n.name for n in session.get_inputs() if n.type == "tensor(string)"}
        self._output_names = [n.name for n in session.get_outputs()]
        self._declared = declared_dims(session)
        self._lock = threading.Lock()

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Arrays:
        """Run the session; ``output_names`` empty means every model output."""
        session = self._session
        if session is None:
            raise Unavailable(f"model instance '{self.name}' is closed")
        feed = {
            name: _to_ort_strings(array, name) if name in self._string_inputs else array
            for name, array in inputs.items()
        }
        names = list(output_names) or self._output_names
        shapes = shapes_of(inputs)
        disagree = named_dims_disagree(shapes, self._declared)
        if disagree is not None:
            raise InputsMismatch(shapes, disagree, self.model)
        try:
            with self._lock:
                if _BF16 is not None and (
                    any(a.dtype == _BF16 for a in feed.values()) or _has_bf16_output(session, names)
                ):
                    return _run_bf16(session, names, feed, self._run_options)
                results = session.run(names, feed, self._run_options)
        except ort_state.InvalidArgument as exc:
            raise InvalidArgument(f"onnx runtime error: {exc}") from exc
        except (ort_state.Fail, ort_state.RuntimeException) as exc:
            rejected = self._verdicts.rejects(shapes) if self._verdicts is not None else None
            if rejected is not None:
                raise InputsMismatch(shapes, f"{_words(exc)} (ONNX shape inference: {rejected})", self.model) from exc
            raise InternalError(f"onnx runtime error in instance '{self.name}': {exc}") from exc
        except (ort_state.NotImplemented, ort_state.EPFail) as exc:
            raise InternalError(f"onnx runtime error in instance '{self.name}': {exc}") from exc
        out: Arrays = {}
        for name, result in zip(names, results, strict=True):
            array = np.asarray(result)
            out[name] = _from_ort_strings(array) if array.dtype.kind in ("O", "U", "S") else array
        return out

    def provider_options(self) -> dict[str, dict[str, str]]:
        """The options of the providers in use, as ONNX Runtime reports them: what it really applied."""
        session = self._session
        if session is None:
            raise Unavailable(f"model instance '{self.name}' is closed")
        return {name: dict(options) for name, options in session.get_provider_options().items()}

    def close(self) -> None:
        self._session = None

    def __repr__(self) -> str:
        return f"OnnxRuntimeInstance(name={self.name!r}, device={self.device!r}, providers={self.providers!r})"


def _words(exc: BaseException) -> str:
    """ONNX Runtime's message on one line, without its ``[ONNXRuntimeError] : 1 : FAIL :`` prefix."""
    text = " ".join(str(exc).split())
    marker = "Status Message:"
    if marker in text:  # "Non-zero status code returned while running Add node. Name:'' Status Message: <why>"
        node = text.split(" node.", 1)[0].rsplit("running ", 1)[-1]
        return f"{node}: {text.split(marker, 1)[1].strip()}"
    return text.split(" : ", 3)[-1] if text.startswith("[ONNXRuntimeError]") else text


try:  # BF16 tensors travel as ml_dtypes.bfloat16 arrays, which ONNX Runtime's numpy bridge cannot take
    import ml_dtypes as _ml_dtypes

    _BF16: np.dtype[Any] | None = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None


def _has_bf16_output(session: Any, names: Sequence[str]) -> bool:
    return any(o.type == "tensor(bfloat16)" and o.name in names for o in session.get_outputs())


def _run_bf16(session: Any, names: Sequence[str], feed: Arrays, run_options: Any) -> Arrays:
    """Run with OrtValues so BF16 goes in and out as raw 16-bit data (CPU memory)."""
    values = {}
    for name, array in feed.items():
        if array.dtype == _BF16:
            values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.ascontiguousarray(array).view(np.uint16), _ONNX_BFLOAT16
            )
        else:
            values[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
    results = session.run_with_ort_values(list(names), values, run_options)
    out: Arrays = {}
    for name, value in zip(names, results, strict=True):
        if value.data_type() == "tensor(bfloat16)":
            shape = tuple(value.shape())
            count = int(np.prod(shape)) if shape else 1
            raw = np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(value.data_ptr()))
            out[name] = raw.copy().view(_BF16).reshape(shape)
        else:
            out[name] = value.numpy()
    return out


_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16
