"""A python model's instance: one ``TritonPythonModel`` object that runs the requests of a batch, its event
loop for ``async def execute``, and the checks that turn its responses into outputs or per-request errors."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from modelsvc.protocol import CONFIG_TO_WIRE, NUMPY_DTYPES, InternalError, ModelsvcError, Unavailable

from .. import python_utils as pb
from .._base import Arrays, BatchRequest, ModelLoadError
from .._decoupled import channel_of
from ._pb_bls import _Caller, _refuse_server_calls, _set_caller
from ._pb_errors import _error_from_triton
from ._pb_sender import InferenceResponseSender, run_decoupled
from ._pb_tensor import _all_bytes, _bytes_array
from ._python_import import _ModelFile

logger = logging.getLogger("modelsvc.backends.python")


# --- outputs ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _OutputSpec:
    """What the config allows for one output, as the model must produce it (its ``reshape`` if it has one)."""

    name: str
    datatype: str
    dtype: np.dtype[Any] | None
    dims: tuple[int, ...]

    @classmethod
    def of(cls, entry: Any) -> _OutputSpec:
        dims = tuple(entry.reshape.shape) if entry.HasField("reshape") else tuple(entry.dims)
        return cls.typed(entry.name, entry.data_type, dims)

    @classmethod
    def typed(cls, name: str, data_type: int, dims: tuple[int, ...]) -> _OutputSpec:
        """An output named ``name`` of the config's ``data_type`` (a DataType number) and ``dims``."""
        type_name = model_config_pb2.DataType.Name(data_type)
        datatype = CONFIG_TO_WIRE.get(type_name, type_name)
        return cls(name, datatype, NUMPY_DTYPES.get(datatype), dims)

    def conform(self, array: np.ndarray[Any, Any], rows: int | None) -> np.ndarray[Any, Any] | str:
        """The array as the server sends it, or what is wrong with it. ``rows``: the request's batch size."""
        if self.datatype == "BYTES":
            if array.dtype.kind not in ("U", "S", "O"):
                return f"output '{self.name}' has numpy dtype {array.dtype}; the configuration says BYTES"
            if array.dtype.kind != "O" or not _all_bytes(array):
                array = _bytes_array(array)
        elif self.dtype is not None and array.dtype != self.dtype:
            return f"output '{self.name}' has numpy dtype {array.dtype}; the configuration says {self.datatype}"
        shape = array.shape
        expected = self.dims if rows is None else (rows, *self.dims)
        if len(shape) != len(expected) or any(e != -1 and e != s for s, e in zip(shape, expected, strict=True)):
            shown = list(self.dims) if rows is None else [rows, *self.dims]
            return f"output '{self.name}' has shape {list(shape)}; the configuration expects {shown}"
        return array


# --- an instance --------------------------------------------------------------------------------------


class _LoopThread:
    """An event loop on a thread of its own for one instance's coroutines (``async def execute``), kept
    for the instance's life so that what a model binds to its loop keeps working between calls."""

    def __init__(self, name: str, caller: _Caller) -> None:
        self.loop = asyncio.new_event_loop()
        self._caller = caller
        self._thread = threading.Thread(target=self._run, name=f"{name}-asyncio", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        _set_caller(self._caller)
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, awaitable: Any) -> Any:
        """Run ``awaitable`` on the loop and wait for its result (from any other thread)."""
        return self.start(awaitable).result()

    def start(self, awaitable: Any) -> concurrent.futures.Future[Any]:
        """Start ``awaitable`` on the loop; its future (from any other thread)."""

        async def wrapped() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop)

    def close(self) -> None:
        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_the_rest(), self.loop).result(10)
        except Exception:
            logger.exception("cancelling the tasks left on a python model's event loop failed")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()

class PythonInstance:
    """One ``TritonPythonModel`` object; the scheduler hands it each batch as a list of requests."""

    def __init__(
        self,
        name: str,
        device: str,
        model: Any,
        model_file: _ModelFile,
        caller: _Caller,
        outputs: dict[str, _OutputSpec],
        batching: bool,
        decoupled: bool = False,
    ) -> None:
        self.name = name
        self.device = device
        self.providers = ["python"]
        self.initialized = False
        self._model = model
        self._file = model_file
        self._caller = caller
        self._label = caller.model
        self._outputs = outputs
        self._batching = batching
        self._decoupled = decoupled
        """``model_transaction_policy { decoupled: true }``: answers go through each request's response sender."""
        self._loop: _LoopThread | None = None
        self._closed = False
        self._execute_is_async = inspect.iscoroutinefunction(getattr(model, "execute", None))

    # -- life cycle ----------------------------------------------------------------------------------
    def initialize(self, args: dict[str, str]) -> None:
        """Call the model's ``initialize(args)``; ModelLoadError with its message when it raises."""
        init = getattr(self._model, "initialize", None)
        try:
            if init is not None:
                result = init(args)
                if inspect.isawaitable(result):
                    self._await(result)
        except Exception as exc:
            logger.error("initialize() of model '%s' instance '%s' failed", self._label, self.name, exc_info=exc)
            raise ModelLoadError(
                f"initialize() of model '{self._label}' (instance '{self.name}') failed: {type(exc).__name__}: {exc}"
            ) from exc
        self.initialized = True

    def close(self, finalize: bool = True) -> None:
        """Call the model's ``finalize()`` (on a thread of its own, never on the server's event loop) once."""
        if self._closed:
            return
        self._closed = True
        worker = threading.Thread(target=self._finish, args=(finalize,), name=f"{self.name}-finalize")
        worker.start()
        worker.join()

    def _finish(self, finalize: bool) -> None:
        # the server's loop waits for this thread: a BLS call from finalize would wait for it in turn
        _refuse_server_calls("not available in finalize(), as in Triton")
        try:
            method = getattr(self._model, "finalize", None) if finalize else None
            if method is not None:
                result = method()
                if inspect.isawaitable(result):
                    self._await(result)
        except Exception:
            logger.exception("finalize() of model '%s' instance '%s' failed", self._label, self.name)
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None
            self._file.release()

    def _await(self, awaitable: Any) -> Any:
        return self._loop_thread().run(awaitable)

    def _loop_thread(self) -> _LoopThread:
        if self._loop is None:
            self._loop = _LoopThread(self.name, self._caller)
        return self._loop

    # -- execution -----------------------------------------------------------------------------------
    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Arrays:
        """One request on its own (``output_names`` empty: every output); raises the request's error."""
        names = tuple(output_names) or tuple(self._outputs)
        (answer,) = self.execute_requests([BatchRequest(inputs, names)])
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def execute_requests(self, batch: Sequence[BatchRequest]) -> list[Arrays | BaseException]:
        """Run ``execute`` on the batch's requests; one entry per request: its outputs or its error."""
        if self._closed:
            raise Unavailable(f"model instance '{self.name}' is closed")
        if self._decoupled:
            return self._execute_decoupled(batch)
        version = self._caller.version
        requests = [
            pb.InferenceRequest._incoming(
                [pb.Tensor._wrap(name, array) for name, array in item.inputs.items()],
                item.outputs,
                item.request,
                self._label,
                version,
            )
            for item in batch
        ]
        _set_caller(self._caller)
        try:
            if self._execute_is_async:
                responses = self._await(self._model.execute(requests))
            else:
                responses = self._model.execute(requests)
                if inspect.isawaitable(responses):
                    responses = self._await(responses)
        except pb.TritonModelException as exc:
            logger.error("model '%s' instance '%s': execute() raised: %s", self._label, self.name, exc.message())
            message = f"model '{self._label}' failed to execute the request: {exc.message()}"
            return [InternalError(message) for _ in batch]
        except Exception as exc:
            logger.error("model '%s' instance '%s': execute() raised", self._label, self.name, exc_info=exc)
            return [
                InternalError(f"model '{self._label}' failed to execute the request; see the server log") for _ in batch
            ]
        finally:
            _set_caller(None)
        if not isinstance(responses, list | tuple) or len(responses) != len(batch):
            got = f"{len(responses)} responses" if isinstance(responses, list | tuple) else repr(type(responses))
            message = (
                f"model '{self._label}': execute() must return a list of one InferenceResponse per request; "
                f"it returned {got} for {len(batch)} request(s)"
            )
            logger.error("%s", message)
            return [InternalError(message) for _ in batch]
        return [self._answer(item, response) for item, response in zip(batch, responses, strict=True)]

    def _execute_decoupled(self, batch: Sequence[BatchRequest]) -> list[Arrays | BaseException]:
        """Run a decoupled model's ``execute``: its answers go through the senders; each request's entry here
        is empty (the instance is free once ``execute`` returns, or, for ``async def execute``, once it started)."""
        version = self._caller.version
        senders = [
            InferenceResponseSender(channel_of(item.request), functools.partial(self._answer, item), self._label)
            for item in batch
        ]
        requests = [
            pb.InferenceRequest._incoming(
                [pb.Tensor._wrap(name, array) for name, array in item.inputs.items()],
                item.outputs,
                item.request,
                self._label,
                version,
                sender,
            )
            for item, sender in zip(batch, senders, strict=True)
        ]
        _set_caller(self._caller)
        try:
            run_decoupled(
                self._model.execute,
                requests,
                senders,
                self.name,
                lambda coroutine: self._loop_thread().start(coroutine),
                self._execute_is_async,
            )
        finally:
            _set_caller(None)
        return [{} for _ in batch]

    def _answer(self, item: BatchRequest, response: Any) -> Arrays | ModelsvcError:
        """A response as the request's outputs, or the error that fails this request."""
        if not isinstance(response, pb.InferenceResponse):
            return self._fault(f"execute() returned {type(response).__name__} where an InferenceResponse belongs")
        error = response.error()
        if error is not None:
            return _error_from_triton(error)
        produced: dict[str, np.ndarray[Any, Any]] = {}
        tensors: list[Any] = response.output_tensors()
        for tensor in tensors:
            if not isinstance(tensor, pb.Tensor):
                return self._fault(f"a response holds {type(tensor).__name__} where a pb_utils.Tensor belongs")
            if tensor.name() not in self._outputs:
                listed = ", ".join(self._outputs) or "none"
                return self._fault(
                    f"returned output '{tensor.name()}', which the configuration does not list (outputs: {listed})"
                )
            produced[tensor.name()] = tensor.as_numpy()
        rows: int | None = None
        if self._batching and item.inputs:
            rows = next(iter(item.inputs.values())).shape[0]
        out: Arrays = {}
        for name in item.outputs:
            array = produced.get(name)
            if array is None:
                return self._fault(f"did not return the requested output '{name}'")
            spec = self._outputs.get(name)
            if spec is not None:
                conformed = spec.conform(array, rows)
                if isinstance(conformed, str):
                    return self._fault(conformed)
                array = conformed
            out[name] = array
        return out

    def _fault(self, what: str) -> InternalError:
        message = f"model '{self._label}' {what}"
        logger.error("%s", message)
        return InternalError(message)

    def __repr__(self) -> str:
        return f"PythonInstance(name={self.name!r}, device={self.device!r})"
