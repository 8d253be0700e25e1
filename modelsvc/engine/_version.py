"""One version of a model: its states, what it serves with, and how it comes to life and goes away.

A :class:`ModelVersion` is a version that takes requests: its configuration, scheduler (a ``Scheduler``: a
dynamic batcher in front of its backend's instances, the sequence batcher, or an ensemble's step runner),
statistics and tensor contract.
:func:`build_version` creates its instances, starts its scheduler and runs its warmup before anyone sees it;
:func:`close_versions` drains versions (what they hold runs first) and closes them.

A version goes through Triton's states, as the repository index shows them (:class:`VersionState`)::

    LOADING ──▶ READY ──▶ UNLOADING ──▶ UNAVAILABLE, reason "unloaded"
       └──────▶ UNAVAILABLE, reason: why it failed
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from ..backends import ModelConfig, ModelLoadError, get_backend
from ..repository import ModelSource, is_ensemble
from ..scheduler import (
    DynamicScheduler,
    ModelStats,
    Scheduler,
    SchedulerConfig,
    SequenceConfigError,
    SequenceScheduler,
    SequenceSettings,
    load_initial_states,
)
from ._cache import ResponseCache, warn_if_uncached
from ._ensemble import ComposingModels, create_ensemble_scheduler
from ._spec import TensorSpec, tensor_specs
from ._warmup import warm_up

logger = logging.getLogger("modelsvc.models")

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
UNLOADED = "unloaded"
"""Triton's reason for a version unloaded on purpose: it does not make the server unready."""


@dataclass(frozen=True, slots=True)
class VersionState:
    """One version's row in the repository index."""

    state: str
    """READY, UNAVAILABLE, LOADING or UNLOADING."""
    reason: str = ""


@dataclass(slots=True)
class ModelVersion:
    name: str
    version: int
    config: ModelConfig
    scheduler: Scheduler
    """An ensemble's scheduler runs its steps; a model with ``sequence_batching`` has the sequence batcher; every
    other model's is a (dynamic) batcher in front of its instances."""
    stats: ModelStats
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    providers: list[str]
    max_batch_size: int = 0
    batching: bool = False
    version_label: str = ""
    build: int = 0
    """Which load of this version this is (unique in the process): a reload gets a new one, so that what was
    cached for the version before (the response cache) is never taken for what it answers now."""

    def __post_init__(self) -> None:
        self.max_batch_size = int(self.config.max_batch_size)
        self.batching = self.max_batch_size > 0
        self.version_label = str(self.version)
        self.build = next(_BUILDS)


_BUILDS = itertools.count(1)


async def build_version(
    name: str,
    source: ModelSource,
    version: int,
    stats: ModelStats | None,
    *,
    cache: ResponseCache | None,
    composing: ComposingModels,
) -> ModelVersion:
    """Build one version of ``name`` from its config and its backend's instances, ready for requests.

    The one place where a version comes to life: what must happen before a version takes requests (its
    scheduler, a warmup) happens here, while any older version of the model still serves. ``stats``: the
    statistics of the version this one replaces, so counters go on across a reload. ``cache``: the server's
    response cache; ``composing``: the loaded models an ensemble version is checked against and runs.
    """
    stats = stats or ModelStats(name, str(version))
    label = f"model '{name}' version {version}"
    warn_if_uncached(cache, source.config, label)
    if is_ensemble(source.config):
        return _build_ensemble_version(name, source, version, stats, composing)
    backend = get_backend(source.config)
    sequence = _sequence_settings(source)
    instances = await asyncio.to_thread(backend.create_instances, source.config, source.artifact(version), version)
    try:
        scheduler: Scheduler
        if sequence is not None:
            scheduler = SequenceScheduler(sequence, instances, stats, model_label=name)
        else:
            config = SchedulerConfig.from_model_config(source.config)
            scheduler = DynamicScheduler(config, instances, stats, model_label=name)
        scheduler.start()
    except BaseException:
        for inst in instances:
            inst.close()
        raise
    inputs, outputs = tensor_specs(source.config.input), tensor_specs(source.config.output)
    try:  # the version is not published before its warmup ran
        await warm_up(label, source.config, source.path, scheduler, inputs, list(outputs), len(instances))
    except BaseException:
        await scheduler.close()
        raise
    providers = sorted({p for inst in instances for p in inst.providers[:1]})
    loaded = ModelVersion(
        name,
        version,
        source.config,
        scheduler,
        stats,
        inputs,
        outputs,
        providers,
    )
    logger.info(
        "loaded model '%s' version %d: %d instance(s) on %s",
        name,
        version,
        len(instances),
        ", ".join(f"{i.device} ({i.providers[0] if i.providers else '?'})" for i in instances),
    )
    return loaded


def _sequence_settings(source: ModelSource) -> SequenceSettings | None:
    """The sequence batcher's settings (with their initial states read) for a config with ``sequence_batching``."""
    try:
        settings = SequenceSettings.from_model_config(source.config)
    except SequenceConfigError as exc:
        raise ModelLoadError(str(exc)) from None
    if settings is not None:
        load_initial_states(settings, source.path)
    return settings


def _build_ensemble_version(
    name: str, source: ModelSource, version: int, stats: ModelStats, composing: ComposingModels
) -> ModelVersion:
    """An ensemble version: checked against its composing models (loaded first), no instances of its own."""
    inputs, outputs = tensor_specs(source.config.input), tensor_specs(source.config.output)
    scheduler = create_ensemble_scheduler(source.config, stats, composing, inputs, outputs)
    logger.info("loaded ensemble '%s' version %d: %d step(s)", name, version, len(scheduler.plan.steps))
    return ModelVersion(name, version, source.config, scheduler, stats, inputs, outputs, [])


async def close_versions(versions: Iterable[ModelVersion]) -> None:
    """Close schedulers (each runs what it holds first); a failure is logged, the others still close."""
    chosen = list(versions)
    results = await asyncio.gather(*(mv.scheduler.close() for mv in chosen), return_exceptions=True)
    for mv, result in zip(chosen, results, strict=True):
        if isinstance(result, BaseException):
            logger.error("closing model '%s' version %d failed", mv.name, mv.version, exc_info=result)
