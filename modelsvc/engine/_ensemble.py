"""Running an ensemble: its steps as a graph, each step a request to its composing model.

An ensemble version gets an :class:`EnsembleScheduler` where other models get a dynamic batcher; the
data plane calls it the same way (a ``Scheduler``: ``enqueue(job)``). A request to the ensemble starts every
step whose input tensors exist, and each step that finishes may make more steps ready, so independent steps
run at the same time and a request moves on as soon as what it needs is there. Each step is an ordinary request to
the composing model through the data plane (``InferTarget``): it passes that model's checks, its
scheduler (so a batching model batches steps of concurrent ensemble requests together), its
response cache, and its statistics. While one request is at the tokenizer another can be at the
encoder: nothing is held between steps but the request's own tensors.

Only the steps that the requested outputs depend on run. A step that fails fails its request alone,
with an error of the same kind (invalid argument stays 400) whose message names the ensemble, the
step and its model. The request's parameters (``priority`` and ``timeout`` among them) go with every
step. The ensemble's statistics count its own requests (success, fail, inference and execution
counts); each step counts in its composing model's statistics (queue, compute, batches), as in Triton.
Unlike Triton, the ensemble's own queue and compute times are not the sum of its steps' (they stay 0).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..backends import ModelConfig, ModelLoadError
from ..protocol import (
    ERROR_TYPES,
    InferRequest,
    InferResponse,
    InternalError,
    ModelsvcError,
    RequestedOutput,
    Tensor,
    Unavailable,
)
from ..repository import EnsemblePlan, EnsembleStep
from ..scheduler import ModelStats, TracedBatch, WorkItem
from ._spec import TensorSpec

Arrays = dict[str, np.ndarray[Any, Any]]
logger = logging.getLogger("modelsvc.ensemble")

class InferTarget(Protocol):
    """Where steps go: the data plane's inference path."""

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse: ...


class ComposingVersion(Protocol):
    """What the checks of an ensemble read of a composing model's loaded version (a ``ModelVersion``)."""

    @property
    def max_batch_size(self) -> int: ...
    @property
    def batching(self) -> bool: ...
    @property
    def inputs(self) -> Mapping[str, TensorSpec]: ...
    @property
    def outputs(self) -> Mapping[str, TensorSpec]: ...


class ComposingModel(Protocol):
    """A composing model as the model table holds it (a ``ModelEntry``): its serving versions, or why none."""

    @property
    def versions(self) -> Mapping[int, ComposingVersion]: ...
    @property
    def reason(self) -> str: ...


class ComposingModels(Protocol):
    """What an ensemble needs of the model manager: the models it runs, and where its steps go (the data
    plane, once set: steps look it up at each request)."""

    @property
    def models(self) -> Mapping[str, ComposingModel]: ...
    @property
    def infer_target(self) -> InferTarget | None: ...


class EnsembleScheduler:
    """Takes an ensemble version's requests, as a model's ``Scheduler`` takes a model's, and runs their steps.

    ``target`` gives the data plane that steps are sent to, looked up at each request (the data plane
    is created after the models load).
    """

    def __init__(
        self,
        plan: EnsemblePlan,
        stats: ModelStats,
        target: Callable[[], InferTarget | None],
        *,
        batching: bool,
        input_types: dict[str, str],
        output_types: dict[str, str],
    ) -> None:
        self.plan = plan
        self.stats = stats
        self._target = target
        self._batching = batching
        self._input_types = input_types
        self._output_types = output_types
        self._label = f"ensemble '{plan.name}'"
        self._by_outputs: dict[tuple[str, ...], tuple[EnsembleStep, ...]] = {}
        self._in_flight = 0
        self._closing = False
        self._idle: asyncio.Event | None = None

    @property
    def pending_count(self) -> int:
        """Requests waiting in a queue of the ensemble's own: none (they wait in the composing models')."""
        return 0

    @property
    def in_flight(self) -> int:
        """Requests between their first step and their answer."""
        return self._in_flight

    def start(self) -> None:
        """Nothing to start (no instances, no threads); here so that every version's scheduler starts alike."""

    async def close(self) -> None:
        """Refuse new requests and wait for those in flight (their steps still need the composing models)."""
        self._closing = True
        if self._in_flight:
            if self._idle is None:
                self._idle = asyncio.Event()
            await self._idle.wait()

    async def enqueue(self, job: WorkItem) -> Arrays:
        """Run the steps that ``job.outputs`` need and return those ensemble tensors.

        As the other schedulers do, it calls ``job.on_start`` and tells ``job.trace`` of a "batch" when the steps
        start: the request's trace shows the whole pipeline as its one batch (the steps are not traced on their
        own).
        """
        if self._closing:
            raise Unavailable(f"{self._label} is shutting down")
        target = self._target()
        if target is None:
            raise Unavailable(f"{self._label} cannot run: the server is not serving requests")
        wanted = tuple(job.outputs)
        steps = self._by_outputs.get(wanted)
        if steps is None:
            steps = self._by_outputs[wanted] = self.plan.steps_for(wanted)
        inputs, request = job.inputs, job.request
        values = {name: Tensor(name, self._input_types[name], array.shape, array) for name, array in inputs.items()}
        params = dict(request.parameters) if request is not None else {}
        if job.priority:
            params["priority"] = job.priority
        if job.timeout_us:
            params["timeout"] = job.timeout_us
        request_id = request.id if request is not None else None
        if self._batching:
            first = next(iter(inputs.values()), None)
            rows = first.shape[0] if first is not None and first.ndim else 1
        else:
            rows = 1
        traced = self._started(rows, job)
        failure: BaseException | None = None
        self._in_flight += 1
        try:
            await self._run(target, steps, values, params, request_id)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._in_flight -= 1
            idle = self._idle  # set once close() waits
            if idle is not None and not self._in_flight:
                idle.set()
            if traced is not None:
                self._finished(traced, failure)
        result: Arrays = {}
        for name in wanted:
            tensor = values[name]
            if tensor.datatype != self._output_types[name]:
                logger.error(
                    "%s: output '%s' came as %s, the ensemble declares %s (was a composing model reloaded?)",
                    self._label,
                    name,
                    tensor.datatype,
                    self._output_types[name],
                )
                raise InternalError(f"{self._label} produced output '{name}' with the wrong datatype")
            result[name] = tensor.data
        self.stats.count_inference(rows)
        return result

    def _started(self, rows: int, job: WorkItem) -> TracedBatch | None:
        """Tell the hooks that the request's steps start; a hook that fails is logged and the request goes on."""
        try:
            if job.on_start is not None:
                job.on_start(rows)
            trace = job.trace
            return None if trace is None else trace.batch_started([trace], rows)
        except Exception:
            logger.exception("a start hook of a request to %s failed", self._label)
            return None

    def _finished(self, traced: TracedBatch, failure: BaseException | None) -> None:
        try:
            traced.finished(failure, None)
        except Exception:
            logger.exception("tracing a request to %s failed", self._label)

    async def _run(
        self,
        target: InferTarget,
        steps: tuple[EnsembleStep, ...],
        values: dict[str, Tensor],
        params: dict[str, Any],
        request_id: str | None,
    ) -> None:
        producer = self.plan.producer
        waiting = list(steps)
        running: dict[asyncio.Task[InferResponse], EnsembleStep] = {}
        try:
            while waiting or running:
                ready = [s for s in waiting if all(t in values or t not in producer for _, t in s.inputs)]
                for step in ready:
                    waiting.remove(step)
                if len(ready) == 1 and not running:  # a chain: no task needed
                    step = ready[0]
                    _store(step, await self._step(target, step, values, params, request_id), values)
                    continue
                for step in ready:
                    task = asyncio.create_task(self._step(target, step, values, params, request_id))
                    running[task] = step
                if not running:  # cannot happen for a plan that passed its checks
                    raise InternalError(f"{self._label}: no step can run")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                failure: BaseException | None = None
                for task in done:
                    step = running.pop(task)
                    error = task.exception()
                    if error is not None:
                        failure = failure or error
                    elif failure is None:
                        _store(step, task.result(), values)
                if failure is not None:
                    raise failure
        finally:
            for task in running:  # the request failed or its caller left: stop its other steps
                if task.done():
                    if not task.cancelled():
                        task.exception()  # seen, so asyncio does not log it
                else:
                    task.cancel()

    async def _step(
        self,
        target: InferTarget,
        step: EnsembleStep,
        values: dict[str, Tensor],
        params: dict[str, Any],
        request_id: str | None,
    ) -> InferResponse:
        tensors = []
        for model_input, name in step.inputs:
            value = values.get(name)
            if value is not None:  # absent: an optional ensemble input the request left out
                tensors.append(Tensor(model_input, value.datatype, value.shape, value.data))
        request = InferRequest(
            inputs=tensors,
            id=request_id,
            outputs=[RequestedOutput(model_output) for model_output, _ in step.outputs],
            parameters=params,
        )
        try:
            return await target.infer(step.model_name, step.version_text, request)
        except ModelsvcError as exc:
            kind = ERROR_TYPES.get(exc.kind, InternalError)
            raise kind(f"{self._label} {step.label}: {exc.message}") from exc
        except Exception as exc:
            logger.error("%s %s failed", self._label, step.label, exc_info=exc)
            raise InternalError(f"{self._label} {step.label} failed") from exc


def _store(step: EnsembleStep, response: InferResponse, values: dict[str, Tensor]) -> None:
    names = dict(step.outputs)
    for tensor in response.outputs:
        name = names.get(tensor.name)
        if name is not None:
            values[name] = tensor


# --- building an ensemble version ------------------------------------------------------------------------


def create_ensemble_scheduler(
    config: ModelConfig,
    stats: ModelStats,
    models: ComposingModels,
    inputs: dict[str, TensorSpec],
    outputs: dict[str, TensorSpec],
) -> EnsembleScheduler:
    """The scheduler of an ensemble version, after checking the ensemble against its (loaded) composing models.

    ModelLoadError names the step and what disagrees: a composing model that is not loaded, an input or output
    it does not have, a datatype or shape that does not fit, a batch size it cannot take.
    """
    from ..repository import EnsembleConfigError, plan_ensemble

    try:
        plan = plan_ensemble(config)
    except EnsembleConfigError as exc:
        raise ModelLoadError(exc.message) from exc
    _check_composing(plan, config, models, inputs, outputs)
    if len(config.model_warmup):
        logger.warning("ensemble '%s': model_warmup is ignored; warm up its composing models instead", plan.name)
    return EnsembleScheduler(
        plan,
        stats,
        lambda: models.infer_target,
        batching=config.max_batch_size > 0,
        input_types={n: s.datatype for n, s in inputs.items()},
        output_types={n: s.datatype for n, s in outputs.items()},
    )


@dataclass(frozen=True, slots=True)
class _End:
    """One end of an ensemble tensor: who makes or reads it, with what datatype and full shape."""

    who: str
    datatype: str
    shape: tuple[int, ...]


def _full(spec: TensorSpec, batching: bool) -> tuple[int, ...]:
    return (-1, *spec.dims) if batching else spec.dims


def _fits(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _composing_version(step: EnsembleStep, models: ComposingModels) -> ComposingVersion:
    entry = models.models.get(step.model_name)
    if entry is None or not entry.versions:
        why = f": {entry.reason}" if entry is not None and entry.reason else ""
        raise ModelLoadError(f"{step.label}: model '{step.model_name}' is not loaded{why}")
    if step.model_version == -1:
        return entry.versions[max(entry.versions)]
    found = entry.versions.get(step.model_version)
    if found is None:
        loaded = ", ".join(map(str, sorted(entry.versions)))
        raise ModelLoadError(
            f"{step.label}: version {step.model_version} of model '{step.model_name}' is not loaded (loaded: {loaded})"
        )
    return found


def _check_composing(
    plan: EnsemblePlan,
    config: ModelConfig,
    models: ComposingModels,
    inputs: dict[str, TensorSpec],
    outputs: dict[str, TensorSpec],
) -> None:
    batching = config.max_batch_size > 0
    made = {n: _End(f"ensemble input '{n}'", s.datatype, _full(s, batching)) for n, s in inputs.items()}
    read: list[tuple[str, _End, bool]] = []  # (tensor, reader, reader has a reshape)
    for step in plan.steps:
        mv = _composing_version(step, models)
        if batching and mv.max_batch_size < config.max_batch_size:
            takes = f"takes at most {mv.max_batch_size}" if mv.batching else "does not batch (max_batch_size 0)"
            raise ModelLoadError(
                f"{step.label}: the ensemble has max_batch_size {config.max_batch_size}, but the model {takes}"
            )
        for model_input, tensor in step.inputs:
            spec = mv.inputs.get(model_input)
            if spec is None:
                raise ModelLoadError(
                    f"{step.label}: input_map names input '{model_input}', which the model does not have "
                    f"(inputs: {', '.join(mv.inputs)})"
                )
            reader = _End(f"input '{model_input}' of {step.label}", spec.datatype, _full(spec, mv.batching))
            read.append((tensor, reader, spec.reshape is not None))
        mapped = {model_input for model_input, _ in step.inputs}
        missing = [n for n, s in mv.inputs.items() if n not in mapped and not s.optional]
        if missing:
            raise ModelLoadError(f"{step.label}: input_map leaves out the model's required input(s) {missing}")
        for model_output, tensor in step.outputs:
            spec = mv.outputs.get(model_output)
            if spec is None:
                raise ModelLoadError(
                    f"{step.label}: output_map names output '{model_output}', which the model does not have "
                    f"(outputs: {', '.join(mv.outputs)})"
                )
            made[tensor] = _End(f"output '{model_output}' of {step.label}", spec.datatype, _full(spec, mv.batching))
    for name, spec in outputs.items():
        read.append((name, _End(f"ensemble output '{name}'", spec.datatype, _full(spec, batching)), False))
    for tensor, reader, reshaped in read:
        maker = made.get(tensor)
        if maker is None:  # an ensemble input that is not declared: plan_ensemble refuses it already
            continue
        if maker.datatype != reader.datatype:
            raise ModelLoadError(
                f"ensemble tensor '{tensor}': {maker.who} is {maker.datatype}, but {reader.who} takes {reader.datatype}"
            )
        if not reshaped and not _fits(maker.shape, reader.shape):
            raise ModelLoadError(
                f"ensemble tensor '{tensor}': {maker.who} has shape {list(maker.shape)}, but {reader.who} takes "
                f"{list(reader.shape)}"
            )
