"""The one data plane under every transport: HTTP and gRPC handlers only decode, call this, and encode.

A request that passes the checks becomes one job (``modelsvc.scheduler.WorkItem``: its inputs, the outputs it
wants, its priority, timeout, trace and the request itself), which the model version's scheduler takes whole
(``Scheduler.enqueue``), as Triton's core hands one request to ``Scheduler::Enqueue``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import __version__
from ..backends import bind_inprocess
from ..backends._decoupled import DecoupledRequest, Failed, ResponseChannel, Sent
from ..protocol import (
    InferRequest,
    InferResponse,
    InternalError,
    InvalidArgument,
    ModelsvcError,
    NotFound,
    Tensor,
    Unavailable,
    Unsupported,
)
from ..protocol._pbjson import message_to_json
from ..scheduler import WorkItem
from ._models import ModelControlMode, ModelManager
from ._spec import TensorSpec
from ._stream_stats import ResponseStats
from ._version import ModelVersion

if TYPE_CHECKING:
    from ._cache import ResponseCache
    from ._trace import Trace, Tracing

EXTENSIONS = [
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_configuration",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
]


class DataPlane:
    def __init__(self, models: ModelManager) -> None:
        self.models = models
        self.accepting = False
        """False until every model that should load has been loaded (or has failed)."""
        self.draining = False
        """True once shutdown began: not ready any more, in-flight requests still finish."""
        self.doors_open = True
        """False while the server's doors are still opening (ingest workers starting): not ready yet, though the
        requests that already reach it are served."""
        self.tracing: Tracing | None = None
        """Set when tracing is on (``--trace-config mode=opentelemetry``); the transports start each
        request's trace with it."""
        self.cache: ResponseCache | None = models.cache
        """The response cache (``--cache-config``); None: no model is cached."""
        self.response_stats: dict[tuple[str, str], ResponseStats] = {}
        """Decoupled models' ``response_stats`` by (model, version)."""
        models.infer_target = self  # ensembles send their steps through this data plane
        # python models call other models (BLS) through this data plane, on its loop; created outside a
        # loop, it is not bound and BLS requests answer with an error
        with contextlib.suppress(RuntimeError):
            bind_inprocess(self, asyncio.get_running_loop())

    # -- health and metadata ----------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.accepting and self.doors_open and not self.draining and self.models.all_ready()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "modelsvc", "version": __version__, "extensions": EXTENSIONS}

    def model_ready(self, name: str, version: str | None = None) -> bool:
        try:
            self.models.get(name, version)
        except ModelsvcError:
            return False
        return True

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        entry = self.models.entry(name)
        mv = self.models.get(name, version)
        batch = (-1,) if mv.max_batch_size > 0 else ()
        return {
            "name": name,
            "versions": [str(v) for v in sorted(entry.versions)],
            "platform": mv.config.platform or mv.config.backend,
            "inputs": [_tensor_meta(s, batch) for s in mv.inputs.values()],
            "outputs": [_tensor_meta(s, batch) for s in mv.outputs.values()],
        }

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        entry = self.models.entry(name)
        if version or entry.config is None:
            return message_to_json(self.models.get(name, version).config)
        return message_to_json(entry.config)

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        if name:
            entry = self.models.entry(name)
            if version:
                chosen = [self.models.get(name, version)]
            else:
                chosen = [entry.versions[v] for v in sorted(entry.versions)]
        else:
            chosen = list(self.models.loaded())
        return {"model_stats": [self._model_stats(mv) for mv in chosen]}

    def _model_stats(self, mv: ModelVersion) -> dict[str, Any]:
        stats = mv.stats.as_json()
        if is_decoupled(mv):
            responses = self.response_stats.get((mv.name, mv.version_label))
            stats["response_stats"] = {} if responses is None else responses.as_json()
        return stats

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model folder of the repository, loaded or not, with each version's state and reason."""
        return self.models.index(ready_only)

    # -- inference ------------------------------------------------------------------------------
    async def infer(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        trace: Trace | None = None,
        *,
        endpoint: str | None = None,
    ) -> InferResponse:
        """Run one request; ``trace`` (from ``self.tracing``) records its queue and compute spans. A decoupled
        model is refused (UNSUPPORTED) as Triton refuses it, with ``endpoint`` (``"HTTP end point"``,
        ``"ModelInfer RPC"``) in Triton's words: only a stream (``infer_stream``) runs it."""
        start = time.perf_counter_ns()
        if not self.accepting:
            raise Unavailable("the server is not accepting inference requests (starting or shutting down)")
        mv = self.models.get(name, version)
        if is_decoupled(mv):
            if endpoint is not None:
                raise DecoupledRefused(f"{endpoint} doesn't support models with decoupled transaction policy")
            raise DecoupledRefused(  # (Triton's BLS says the first half and asks for decoupled=True)
                f"Model {name} is using the decoupled transaction policy: call it with 'decoupled=True' in BLS "
                "'exec' or 'async_exec', or over a gRPC stream (ModelStreamInfer)"
            )
        try:
            inputs = _check_inputs(mv, request)
            wanted = _requested_outputs(mv, request)
            cache = self.cache
            if cache is not None and mv.config.response_cache.enable:
                key, hit = cache.lookup(name, self._cache_identity(mv), request, wanted, mv.stats)
                if hit is not None:
                    mv.stats.record_cached_success(time.perf_counter_ns() - start)
                    return InferResponse(model_name=name, model_version=mv.version_label, outputs=hit, id=request.id)
            priority, timeout_us = _scheduling(request)
            if trace is not None:
                trace.enqueued(mv.version_label)
            outputs = await mv.scheduler.enqueue(WorkItem(inputs, wanted, priority, timeout_us, trace, request))
            response = InferResponse(
                model_name=name,
                model_version=mv.version_label,
                outputs=[_output_tensor(mv.outputs[n], outputs, n, mv.batching) for n in wanted],
                id=request.id,
            )
            if cache is not None and mv.config.response_cache.enable:
                cache.insert(key, response.outputs, mv.stats)
        except BaseException:
            mv.stats.fail.add(time.perf_counter_ns() - start)
            raise
        mv.stats.success.add(time.perf_counter_ns() - start)
        return response

    async def infer_stream(
        self, name: str, version: str | None, request: InferRequest, trace: Trace | None = None
    ) -> AsyncGenerator[tuple[InferResponse | ModelsvcError | None, bool], None]:
        """Run one request of a stream (gRPC ``ModelStreamInfer``): each response as the model sends it, with
        whether it is the last. A decoupled model gives zero or more responses (an error fails one response
        and the stream goes on; None: the final flag sent without a response); any other model its one
        response, final. Errors before the model runs (bad input, full queue) raise. Closing the iterator
        before the final response cancels the request: the model's ``is_cancelled()`` turns true."""
        mv = self.models.get(name, version)
        if not is_decoupled(mv):
            yield await self.infer(name, version, request, trace), True
            return
        start = time.perf_counter_ns()
        if not self.accepting:
            raise Unavailable("the server is not accepting inference requests (starting or shutting down)")
        loop = asyncio.get_running_loop()
        channel = ResponseChannel(loop)
        key = (name, mv.version_label)
        counted = self.response_stats.get(key)
        if counted is None:
            counted = self.response_stats[key] = ResponseStats()
        index = 0
        final = False
        run: asyncio.Future[Any] | None = None
        try:
            inputs = _check_inputs(mv, request)
            wanted = _requested_outputs(mv, request)
            priority, timeout_us = _scheduling(request)
            if trace is not None:
                trace.enqueued(mv.version_label)
            streamed = DecoupledRequest(request.inputs, request.id, request.outputs, request.parameters, channel)
            job = WorkItem(inputs, wanted, priority, timeout_us, trace, streamed)
            run = asyncio.ensure_future(mv.scheduler.enqueue(job))
            run.add_done_callback(lambda done: _failed(done, channel))
            while not final:
                sent, final, infer_ns, output_ns = await channel.get()
                if isinstance(sent, Failed):
                    raise sent.error
                if sent is None:
                    counted.empty(index, infer_ns)
                else:
                    counted.response(index, infer_ns, output_ns, not isinstance(sent, BaseException))
                index += 1
                yield _stream_response(mv, name, request, wanted, sent), final
        except BaseException:
            mv.stats.fail.add(time.perf_counter_ns() - start)
            raise
        finally:
            if not final:
                cancelled_ns = time.perf_counter_ns()
                channel.cancel()  # the caller went away (or the request failed): the model may stop
                if run is not None and not run.done():
                    run.cancel()  # withdrawn if still queued
                if run is not None:  # it reached the scheduler (a request refused before it did is no cancel)
                    counted.cancelled(index, time.perf_counter_ns() - cancelled_ns)
        mv.stats.success.add(time.perf_counter_ns() - start)

    def _cache_identity(self, mv: ModelVersion) -> str:
        """What the response cache keys a version by: its label and which load of it this is (a reload gets a
        new build, so answers cached before it are never served after it); for an ensemble, also that of every
        model its steps run now, so reloading a composing model keys out the ensemble's old answers too."""
        identity = f"{mv.version_label}#{mv.build}"
        plan = getattr(mv.scheduler, "plan", None)  # an ensemble's scheduler carries its steps
        if plan is None:
            return identity
        parts = [identity]
        for step in plan.steps:
            try:
                composing = self.models.get(step.model_name, step.version_text)
            except ModelsvcError:
                continue  # the request fails in that step anyway
            parts.append(f"{step.model_name}:{self._cache_identity(composing)}")
        return "|".join(parts)

    # -- model control --------------------------------------------------------------------------
    async def load_model(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Load ``name``, or reload it when it serves (model control mode EXPLICIT only, as in Triton).

        ``config``: a ModelConfig as JSON, used instead of the folder's config.pbtxt. ``files``: path in the
        model folder (``1/model.onnx``; a ``file:`` prefix is dropped) -> content; they replace the folder and
        need ``config``. A reload keeps the old version serving until the new one is ready; one that fails
        leaves it serving and raises with the reason.
        """
        self._check_model_control()
        named = {key.removeprefix("file:"): data for key, data in (files or {}).items()}
        await self.models.load(name, config, named)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unload ``name`` (EXPLICIT mode only): new requests are refused, those in flight finish first.
        ``unload_dependents``: also the models it runs that were loaded only for it (an ensemble's)."""
        self._check_model_control()
        await self.models.unload(name, unload_dependents)

    def _check_model_control(self) -> None:
        if self.models.mode is not ModelControlMode.EXPLICIT:
            raise Unavailable(_NO_MODEL_CONTROL)


_NO_MODEL_CONTROL = "explicit model load / unload is not allowed if polling is enabled"
"""Triton's words (and code, UNAVAILABLE) for load and unload outside model control mode EXPLICIT."""


class DecoupledRefused(Unsupported):
    """A unary call (HTTP ``/infer``, gRPC ``ModelInfer``, BLS) to a decoupled model: Triton answers HTTP 501 and
    gRPC UNIMPLEMENTED."""

    http_status = 501


def is_decoupled(mv: ModelVersion) -> bool:
    """Whether ``mv`` answers through response senders (``model_transaction_policy { decoupled: true }``; the
    python backend is the one that has them)."""
    config = mv.config
    return bool(config.model_transaction_policy.decoupled) and config.backend == "python"


def _failed(run: asyncio.Future[Any], channel: ResponseChannel) -> None:
    """A request to a decoupled model that failed in the scheduler ends its stream with that error."""
    error = None if run.cancelled() else run.exception()
    if error is not None:
        channel.fail(error)


def _stream_response(
    mv: ModelVersion, name: str, request: InferRequest, wanted: list[str], sent: Sent
) -> InferResponse | ModelsvcError | None:
    if sent is None:
        return None
    if isinstance(sent, ModelsvcError):
        return sent
    if isinstance(sent, BaseException | Failed):
        return InternalError(f"model '{name}' failed to execute the request")
    return InferResponse(
        model_name=name,
        model_version=mv.version_label,
        outputs=[_output_tensor(mv.outputs[n], sent, n, mv.batching) for n in wanted],
        id=request.id,
    )


def _tensor_meta(spec: TensorSpec, batch: tuple[int, ...]) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": [*batch, *spec.dims]}


def _int_param(params: dict[str, Any], key: str) -> int:
    value = params.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"request parameter '{key}' must be a non-negative integer, got {value!r}")
    return value


def _scheduling(request: InferRequest) -> tuple[int, int | None]:
    """The request's ``priority`` (0: the default) and ``timeout`` in microseconds (None: none)."""
    params = request.parameters
    if not params:
        return 0, None
    return _int_param(params, "priority"), _int_param(params, "timeout") or None


def _shape_matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _check_inputs(mv: ModelVersion, request: InferRequest) -> dict[str, np.ndarray[Any, Any]]:
    """The request's inputs as the model takes them; every disagreement names the tensor."""
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    batching = mv.batching
    batch_size = None
    for tensor in request.inputs:
        spec = mv.inputs.get(tensor.name)
        if spec is None:
            raise InvalidArgument(
                f"unexpected inference input '{tensor.name}' for model '{mv.name}', expected one of {sorted(mv.inputs)}"
            )
        if tensor.name in arrays:
            raise InvalidArgument(f"input '{tensor.name}' appears more than once in the request")
        if tensor.datatype != spec.datatype:
            raise InvalidArgument(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{mv.name}' expects '{spec.datatype}'"
            )
        shape = tensor.shape
        expected = [-1, *spec.dims] if batching else list(spec.dims)
        if batching:
            if not shape or not _shape_matches(shape[1:], spec.dims) or shape[0] < 1:
                raise InvalidArgument(
                    f"unexpected shape for input '{tensor.name}' for model '{mv.name}'. "
                    f"Expected {expected}, got {list(shape)}"
                )
            if shape[0] > mv.max_batch_size:
                raise InvalidArgument(
                    f"inference request batch-size must be <= {mv.max_batch_size} for '{mv.name}', "
                    f"input '{tensor.name}' has batch size {shape[0]}"
                )
            if batch_size is None:
                batch_size = shape[0]
            elif shape[0] != batch_size:
                raise InvalidArgument(
                    f"input '{tensor.name}' has batch size {shape[0]}, other inputs have {batch_size}"
                )
        elif not _shape_matches(shape, spec.dims):
            raise InvalidArgument(
                f"unexpected shape for input '{tensor.name}' for model '{mv.name}'. "
                f"Expected {expected}, got {list(shape)}"
            )
        data = tensor.data
        if spec.reshape is not None:
            data = data.reshape(((shape[0],) if batching else ()) + spec.reshape)
        arrays[tensor.name] = data
    if not arrays:
        raise InvalidArgument(f"inference request to model '{mv.name}' has no inputs")
    missing = [n for n, s in mv.inputs.items() if n not in arrays and not s.optional]
    if missing:
        raise InvalidArgument(
            f"expected {len(mv.inputs)} inputs but got {len(arrays)} inputs for model '{mv.name}'. "
            f"Got input(s) {sorted(arrays)}, but missing required input(s) {missing}. "
            "Please provide all required input(s)."
        )
    return arrays


def _requested_outputs(mv: ModelVersion, request: InferRequest) -> list[str]:
    if request.outputs is None or not request.outputs:
        return list(mv.outputs)
    names = []
    for out in request.outputs:
        if out.name not in mv.outputs:
            raise InvalidArgument(
                f"unexpected inference output '{out.name}' for model '{mv.name}', expected one of {sorted(mv.outputs)}"
            )
        names.append(out.name)
    return names


def _output_tensor(spec: TensorSpec, outputs: dict[str, np.ndarray[Any, Any]], name: str, batching: bool) -> Tensor:
    data = outputs.get(name)
    if data is None:
        raise NotFound(f"model did not produce output '{name}'")
    if spec.reshape is not None:
        lead = (data.shape[0],) if batching else ()
        want = lead + spec.dims
        if -1 not in spec.dims and math.prod(want) == data.size:
            data = data.reshape(want)
    return Tensor(name, spec.datatype, tuple(data.shape), data)
