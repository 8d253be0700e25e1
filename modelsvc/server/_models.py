"""Loaded models: each version's instances, scheduler, statistics and tensor contract."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import model_config_pb2

from ..backends import ModelConfig, ModelLoadError, get_backend
from ..protocol import CONFIG_TO_WIRE, NotFound, Unavailable
from ..repository import ConfigError, ModelRepository
from ..scheduler import ModelStats, Scheduler, SchedulerConfig

logger = logging.getLogger("modelsvc.models")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]
    """Without the batch dimension."""
    reshape: tuple[int, ...] | None = None
    optional: bool = False


def _specs(entries: Any) -> dict[str, TensorSpec]:
    specs = {}
    for e in entries:
        dtype_name = model_config_pb2.DataType.Name(e.data_type)
        reshape = tuple(e.reshape.shape) if e.HasField("reshape") else None
        specs[e.name] = TensorSpec(
            e.name,
            CONFIG_TO_WIRE.get(dtype_name, dtype_name),
            tuple(e.dims),
            reshape,
            getattr(e, "optional", False),
        )
    return specs


@dataclass(slots=True)
class ModelVersion:
    name: str
    version: int
    config: ModelConfig
    scheduler: Scheduler
    stats: ModelStats
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    providers: list[str]
    max_batch_size: int = 0
    batching: bool = False
    version_label: str = ""

    def __post_init__(self) -> None:
        self.max_batch_size = int(self.config.max_batch_size)
        self.batching = self.max_batch_size > 0
        self.version_label = str(self.version)


@dataclass(slots=True)
class ModelEntry:
    """A model of the repository, loaded or not."""

    name: str
    config: ModelConfig | None = None
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    state: str = "UNAVAILABLE"
    reason: str = ""
    #: versions that should have loaded but failed, with the reason
    failed: dict[int, str] = field(default_factory=dict)


class ModelManager:
    """Loads every model of a repository and finds the version a request asks for."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.models: dict[str, ModelEntry] = {}

    async def load_all(self) -> list[str]:
        """Load every model; returns the errors (one line each), empty when all loaded."""
        names = self.repository.model_names()
        entries = await asyncio.gather(*(self._load(name) for name in names))
        errors = []
        for entry in entries:
            self.models[entry.name] = entry
            if entry.state != "READY":
                errors.append(f"failed to load '{entry.name}': {entry.reason}")
        return errors

    async def _load(self, name: str) -> ModelEntry:
        entry = ModelEntry(name)
        try:
            source = await asyncio.to_thread(self.repository.load, name)
        except ConfigError as exc:
            entry.reason = str(exc)
            logger.error("model '%s' has a bad configuration: %s", name, exc)
            return entry
        entry.config = source.config
        backend = get_backend(source.config)
        for version in source.versions:
            try:
                instances = await asyncio.to_thread(
                    backend.create_instances, source.config, source.artifact(version), version
                )
            except (ModelLoadError, ConfigError, OSError) as exc:
                entry.failed[version] = str(exc)
                logger.error("model '%s' version %d failed to load: %s", name, version, exc)
                continue
            stats = ModelStats(name, str(version))
            scheduler = Scheduler(
                SchedulerConfig.from_model_config(source.config), instances, stats, model_label=f"{name}"
            )
            scheduler.start()
            providers = sorted({p for inst in instances for p in inst.providers[:1]})
            entry.versions[version] = ModelVersion(
                name,
                version,
                source.config,
                scheduler,
                stats,
                _specs(source.config.input),
                _specs(source.config.output),
                providers,
            )
            logger.info(
                "loaded model '%s' version %d: %d instance(s) on %s",
                name,
                version,
                len(instances),
                ", ".join(f"{i.device} ({i.providers[0] if i.providers else '?'})" for i in instances),
            )
        if entry.failed:
            entry.reason = "; ".join(f"version {v}: {r}" for v, r in sorted(entry.failed.items()))
        entry.state = "READY" if entry.versions and not entry.failed else "UNAVAILABLE"
        return entry

    def all_ready(self) -> bool:
        return all(e.state == "READY" for e in self.models.values())

    def entry(self, name: str) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return entry

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The version asked for, or the newest loaded one when ``version`` is empty."""
        entry = self.entry(name)
        if not version:
            if not entry.versions:
                raise Unavailable(f"Request for unknown model: '{name}' has no available versions")
            return entry.versions[max(entry.versions)]
        try:
            number = int(version)
        except ValueError:
            raise NotFound(f"Request for unknown model: '{name}' version '{version}' is not found") from None
        found = entry.versions.get(number)
        if found is None:
            if number in entry.failed:
                raise Unavailable(f"Request for unknown model: '{name}' version {number} is not at ready state")
            raise NotFound(f"Request for unknown model: '{name}' version {number} is not found")
        return found

    def loaded(self) -> Iterator[ModelVersion]:
        for entry in self.models.values():
            yield from entry.versions.values()

    async def close(self) -> None:
        await asyncio.gather(*(mv.scheduler.close() for mv in self.loaded()))
