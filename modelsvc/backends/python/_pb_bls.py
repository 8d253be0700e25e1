"""pb_utils Business Logic Scripting: a model's requests to other models and to the server.

``BLSRequest`` gives ``InferenceRequest`` its ``exec()`` and ``async_exec()``; ``is_model_ready``,
``load_model`` and ``unload_model`` ask the server. All of them go in-process to the data plane bound in
``_inprocess``. The python backend tells this module which model runs on the current thread (``_Caller``),
so that a model calling itself with its only instance answers at once instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from modelsvc.protocol import (
    InferRequest,
    InferResponse,
    InvalidArgument,
    ModelsvcError,
    RequestedOutput,
    wire_datatype,
)
from modelsvc.protocol import Tensor as WireTensor

from .. import _inprocess
from ._pb_bls_stream import stream_async_exec, stream_exec
from ._pb_errors import TritonError, TritonModelException, _triton_from_error
from ._pb_logging import logger
from ._pb_response import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    InferenceResponse,
    _failed,
    _response_from,
)
from ._pb_tensor import Tensor, _all_bytes, _bytes_array

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Caller:
    """The model whose ``execute`` runs on this thread (set by the python backend)."""

    model: str
    version: int
    instances: int


_context = threading.local()


def _set_caller(caller: _Caller | None) -> None:
    _context.caller = caller


def _refuse_server_calls(reason: str) -> None:
    """Refuse BLS and the model API on this thread (finalize runs while the server's loop waits for it)."""
    _context.refusal = reason


class BLSRequest:
    """What ``InferenceRequest`` does as a request a model makes of another model: ``exec`` and ``async_exec``.

    A base of ``InferenceRequest``, which holds the attributes declared here.
    """

    __slots__ = ()

    _request_id: str
    _correlation_id: int | str
    _flags: int
    _inputs: list[Tensor]
    _requested: list[str]
    _model_name: str
    _model_version: int
    _timeout_us: int
    _parameters: dict[str, Any]

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait for the response; a failure is a response with an error.
        ``decoupled=True``: an iterator of the model's responses as it sends them (``_pb_bls_stream``)."""
        if decoupled:
            return stream_exec(self)
        prepared = self._prepare()
        if isinstance(prepared, InferenceResponse):
            return prepared
        binding, request = prepared
        refused = self._refuse_blocking(binding)
        if refused is not None:
            return refused
        future = asyncio.run_coroutine_threadsafe(
            binding.target.infer(self._model_name, self._version(), request), binding.loop
        )
        try:
            result = future.result(self._timeout_us / 1e6 if self._timeout_us > 0 else None)
        except TimeoutError:
            future.cancel()
            return self._timed_out()
        except Exception as exc:
            return self._failure(exc)
        return _response_from(result)

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[Any]:
        """Start this request and return an awaitable of its response; call it from ``async def execute``.

        Several requests started this way run at once (``asyncio.gather`` them). ``decoupled=True``: an
        awaitable of an iterator of all the model's responses (``_pb_bls_stream``)."""
        here = asyncio.get_running_loop()  # as in Triton: only from a coroutine
        if decoupled:
            return stream_async_exec(self, here)
        prepared = self._prepare()
        if isinstance(prepared, InferenceResponse):
            ready: asyncio.Future[InferenceResponse] = here.create_future()
            ready.set_result(prepared)
            return ready
        binding, request = prepared
        call = binding.target.infer(self._model_name, self._version(), request)
        return here.create_task(self._finish(self._start(binding, call, here)))

    async def _finish(self, pending: asyncio.Future[InferResponse]) -> InferenceResponse:
        try:
            if self._timeout_us > 0:
                result = await asyncio.wait_for(pending, self._timeout_us / 1e6)
            else:
                result = await pending
        except TimeoutError:
            return self._timed_out()
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the caller itself is being cancelled
                raise
            return self._failure(exc)
        except Exception as exc:
            return self._failure(exc)
        return _response_from(result)

    @staticmethod
    def _refuse_blocking(binding: _inprocess.Binding) -> InferenceResponse | None:
        """The response that refuses a blocking ``exec()`` called on the server's own event loop (it would wait
        on itself); None when called from any other thread."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not binding.loop:
            return None
        return _failed(
            "exec() cannot wait on the server's own event loop; use 'await request.async_exec()'",
            TritonError.UNSUPPORTED,
        )

    @staticmethod
    def _start(
        binding: _inprocess.Binding, call: Coroutine[Any, Any, T], here: asyncio.AbstractEventLoop
    ) -> asyncio.Future[T]:
        """Start ``call`` on the server's loop; a future of its result on ``here``, the caller's loop."""
        if here is binding.loop:
            return here.create_task(call)
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, binding.loop), loop=here)

    def _version(self) -> str | None:
        return None if self._model_version < 0 else str(self._model_version)

    def _prepare(self) -> tuple[_inprocess.Binding, InferRequest] | InferenceResponse:
        refusal: str | None = getattr(_context, "refusal", None)
        if refusal is not None:
            return _failed(f"BLS request to model '{self._model_name}': {refusal}", TritonError.UNSUPPORTED)
        binding = _inprocess.current()
        if binding is None:
            return _failed(
                f"BLS request to model '{self._model_name}': no modelsvc server runs in this process",
                TritonError.UNAVAILABLE,
            )
        caller: _Caller | None = getattr(_context, "caller", None)
        if (
            caller is not None
            and caller.instances == 1
            and caller.model == self._model_name
            and self._model_version in (-1, caller.version)
        ):
            return _failed(
                f"BLS request from model '{caller.model}' to itself would wait forever: its only instance is "
                "busy running the calling request (Triton blocks here too). Give the model more instances "
                "(instance_group count) or call another model",
                TritonError.UNAVAILABLE,
            )
        try:
            return binding, self._wire_request()
        except TritonModelException as exc:
            return _failed(exc.message(), TritonError.INVALID_ARG)

    def _wire_request(self) -> InferRequest:
        tensors = []
        for tensor in self._inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"BLS request to model '{self._model_name}': inputs must be pb_utils.Tensor objects, "
                    f"got {type(tensor).__name__}"
                )
            array = tensor.as_numpy()
            try:
                datatype = wire_datatype(array.dtype)
            except InvalidArgument as exc:
                raise TritonModelException(f"input '{tensor.name()}': {exc.message}") from None
            if datatype == "BYTES" and not _all_bytes(array):
                array = _bytes_array(array)
            tensors.append(WireTensor(tensor.name(), datatype, tuple(array.shape), array))
        parameters = dict(self._parameters)
        if self._correlation_id:
            parameters["sequence_id"] = self._correlation_id
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            parameters["sequence_start"] = True
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            parameters["sequence_end"] = True
        outputs = [RequestedOutput(name) for name in self._requested] or None
        return InferRequest(tensors, id=self._request_id or None, outputs=outputs, parameters=parameters)

    def _timed_out(self) -> InferenceResponse:
        return _failed(
            f"BLS request to model '{self._model_name}' did not finish within its timeout of "
            f"{self._timeout_us} us (a model waiting on itself, or a cycle of models with no free "
            "instance, never finishes)",
            TritonError.UNAVAILABLE,
        )

    def _failure(self, exc: BaseException) -> InferenceResponse:
        if isinstance(exc, ModelsvcError):
            return InferenceResponse(error=_triton_from_error(exc))
        if isinstance(exc, asyncio.CancelledError | concurrent.futures.CancelledError):
            return _failed(f"BLS request to model '{self._model_name}' was cancelled", TritonError.CANCELLED)
        logger.error("BLS request to model '%s' failed", self._model_name, exc_info=exc)
        return _failed(
            f"BLS request to model '{self._model_name}' failed inside the server; see the server log",
            TritonError.INTERNAL,
        )


def _on_server(action: str, call: Awaitable[Any]) -> Any:
    """Run a data-plane coroutine on the server's loop from a model's thread; TritonModelException on failure."""
    binding = _inprocess.current()
    refusal: str | None = getattr(_context, "refusal", None)
    if binding is None or refusal is not None:
        if asyncio.iscoroutine(call):
            call.close()
        raise TritonModelException(f"{action}: {refusal or 'no modelsvc server runs in this process'}")

    async def run() -> Any:
        return await call

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is binding.loop:
        if asyncio.iscoroutine(call):
            call.close()
        raise TritonModelException(f"{action}: cannot wait on the server's own event loop")
    try:
        return asyncio.run_coroutine_threadsafe(run(), binding.loop).result()
    except ModelsvcError as exc:
        raise TritonModelException(f"{action}: {exc.message}") from None


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (``model_version``, or its newest version when empty) is ready on this server."""
    binding = _inprocess.current()
    if binding is None:
        raise TritonModelException("is_model_ready: no modelsvc server runs in this process")
    target = binding.target

    async def ready() -> bool:  # read on the loop, where the model table changes
        return target.model_ready(model_name, model_version or None)

    return bool(_on_server("is_model_ready", ready()))


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Ask the server to load ``model_name`` (Triton allows it in explicit model control mode only)."""
    binding = _inprocess.current()
    loader = getattr(binding.target, "load_model", None) if binding is not None else None
    if loader is None:
        raise TritonModelException(f"load_model('{model_name}'): this server cannot load models on request")
    _on_server(f"load_model('{model_name}')", loader(model_name, config or None, files))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Ask the server to unload ``model_name`` (Triton allows it in explicit model control mode only)."""
    binding = _inprocess.current()
    unloader = getattr(binding.target, "unload_model", None) if binding is not None else None
    if unloader is None:
        raise TritonModelException(f"unload_model('{model_name}'): this server cannot unload models on request")
    _on_server(f"unload_model('{model_name}')", unloader(model_name, unload_dependents))
