"""The models of a repository and their lifecycle: load, reload without downtime, unload, poll.

Each model folder the server has dealt with is a :class:`ModelEntry`; each version that takes requests is a
:class:`ModelVersion` (its instances, scheduler, statistics and tensor contract). :class:`ModelManager` owns
the table, which changes only on the event loop; backend instances are created in worker threads.

A version goes through Triton's states, as the repository index shows them::

    LOADING ──▶ READY ──▶ UNLOADING ──▶ UNAVAILABLE, reason "unloaded"
       └──────▶ UNAVAILABLE, reason: why it failed

Reloading a model that serves builds the new versions completely (instances created, every hook of
``_build_version`` run) while the old ones keep serving, swaps them into the entry in one step with no
await in between, and only then closes the old schedulers, which run what they hold (queued and in
flight) before they stop. A reload that fails leaves the old versions serving, with the reason on their
index rows and in the caller's error. A request resolves its version (``get``) and queues on its
scheduler without awaiting in between, so it never meets a closed scheduler.

One ``asyncio.Lock`` per model serializes that model's loads and unloads. No operation holds one model's
lock while it waits for another's (an ensemble's composing models load before the ensemble's lock is
taken), so operations never wait on each other in a circle.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from ..backends import ModelConfig, ModelLoadError, get_backend
from ..protocol import CONFIG_TO_WIRE, InvalidArgument, NotFound, Unavailable
from ..repository import CONFIG_FILENAME, ConfigError, ModelRepository, ModelSource, is_ensemble
from ..scheduler import ModelStats, Scheduler, SchedulerConfig
from ._cache import ResponseCache, warn_if_uncached
from ._ensemble import EnsembleScheduler, InferTarget, create_ensemble_scheduler
from ._warmup import warm_up

if TYPE_CHECKING:
    from ..repository import RemoteRepository

logger = logging.getLogger("modelsvc.models")


class ModelControlMode(enum.Enum):
    """tritonserver's ``--model-control-mode``."""

    NONE = "none"
    """Load every model at start; the load and unload APIs answer with an error."""
    POLL = "poll"
    """Load every model at start, then follow the repository's changes; the APIs answer with an error."""
    EXPLICIT = "explicit"
    """Load the ``--load-model`` models at start; then load and unload on request."""


READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
UNLOADED = "unloaded"
"""Triton's reason for a version unloaded on purpose: it does not make the server unready."""


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
    scheduler: Scheduler | EnsembleScheduler
    """An ensemble's scheduler runs its steps; every other model's is a (dynamic) batcher in front of its instances."""
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


@dataclass(frozen=True, slots=True)
class VersionState:
    """One version's row in the repository index."""

    state: str
    """READY, UNAVAILABLE, LOADING or UNLOADING."""
    reason: str = ""


Stamp = tuple[tuple[str, int, int], ...]
"""A model folder's files and folders as (relative path, size, mtime ns); a folder has size -1."""


@dataclass(slots=True)
class ModelEntry:
    """A model of the repository that the server has loaded, or tried to."""

    name: str
    config: ModelConfig | None = None
    """The configuration the serving versions were built from; None while none serves."""
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    """The versions that take requests now."""
    state: str = ""
    """READY, UNAVAILABLE, LOADING or UNLOADING; empty while nobody asked for the model (explicit mode)."""
    reason: str = ""
    #: versions that should have loaded but failed, with the reason
    failed: dict[int, str] = field(default_factory=dict)
    version_states: dict[int, VersionState] = field(default_factory=dict)
    """Every version loaded or tried since the model first loaded, as the repository index shows it."""
    requires: tuple[str, ...] = ()
    """The models this one runs: an ensemble's composing models."""
    explicit: bool = False
    """Loaded on its own account (asked for, or every model at start), not only because an ensemble runs it."""
    awaiting: str = ""
    """The composing model whose unloading took this model down; it loads again when that model is back."""
    stamp: Stamp | None = None
    """The model folder as it was when last read: a poll reloads the model when the folder differs."""
    override: Path | None = None
    """The temporary repository that a load request's config or files built the serving versions from."""


class _Incomplete(Exception):
    """A model folder that is not complete yet (polling): nothing is loaded from it until it is."""

    def __init__(self, why: str, stamp: Stamp | None) -> None:
        super().__init__(why)
        self.why = why
        self.stamp = stamp


class ModelManager:
    """The models of one repository: loads, reloads and unloads them, and finds the version a request asks for.

    ``mode`` is the server's model control mode (the data plane refuses load and unload requests outside
    EXPLICIT); ``remote`` is the object-storage repository that ``repository`` reads a local copy of, when
    the repository is remote: a load request refreshes the copy first.
    """

    def __init__(
        self,
        repository: ModelRepository,
        *,
        mode: ModelControlMode = ModelControlMode.NONE,
        remote: RemoteRepository | None = None,
    ) -> None:
        self.repository = repository
        self.mode = mode
        self.remote = remote
        self.models: dict[str, ModelEntry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._seen: dict[str, Stamp] = {}
        """Polling: each folder as the previous poll saw it."""
        self._waiting: dict[str, tuple[Stamp | None, str]] = {}
        """Polling: folders not complete yet, with what they lack."""
        self._closed = False
        self.cache: ResponseCache | None = None
        """The server's response cache (``--cache-config``), set before loading; models that enable caching use it."""
        self.infer_target: InferTarget | None = None
        """Where ensembles send their steps: the data plane, which sets it."""

    # -- start-up ---------------------------------------------------------------------------------------
    async def load_all(self) -> list[str]:
        """Load every model of the repository; returns the errors (one line each), empty when all loaded."""
        try:
            names = await asyncio.to_thread(self.repository.model_names)
        except (ConfigError, OSError) as exc:
            return [str(exc)]
        return await self.load_startup(names)

    async def load_startup(self, names: Sequence[str]) -> list[str]:
        """Load ``names`` and the models they run, each after the models it runs; returns the errors."""
        wanted = set(names)
        requires = await asyncio.to_thread(self._requirements_closure, names)
        errors: list[str] = []
        for wave in _waves(requires):
            results = await asyncio.gather(*(self._load(name, explicit=name in wanted) for name in wave))
            errors += [f"failed to load '{name}': {error}" for name, error in zip(wave, results, strict=True) if error]
        return errors

    def _requirements_closure(self, names: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """``names`` and every model they run, directly or not, each with the models it runs (blocking)."""
        found: dict[str, tuple[str, ...]] = {}
        todo = list(names)
        while todo:
            name = todo.pop()
            if name not in found:
                found[name] = _read_requires(self.repository.root / name)
                todo += found[name]
        return found

    # -- requests: load and unload ----------------------------------------------------------------------
    async def load(self, name: str, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        """Load ``name``, or reload it when it serves; raises a ModelsvcError unless it ends up serving.

        ``config`` (JSON of a ModelConfig) replaces the folder's config.pbtxt; ``files`` (paths such as
        ``1/model.onnx`` -> content) replace the folder itself and need ``config``. An ensemble's composing
        models are loaded first where they do not serve yet.
        """
        _check_name(name)
        if self.remote is not None:
            try:
                await asyncio.to_thread(self.remote.sync, allow_empty=True)
            except Exception as exc:  # RemoteRepositoryError, or OSError underneath it
                raise Unavailable(f"failed to load '{name}': cannot refresh the repository's copy: {exc}") from None
        override = None
        if config is not None or files:
            override = await asyncio.to_thread(self._write_override, name, config, files or {})
        folder = (override or self.repository.root) / name
        requires = await asyncio.to_thread(_read_requires, folder)
        await self._load_requirements(requires, {name})
        error = await self._load(name, explicit=True, override=override)
        if error:
            raise InvalidArgument(f"load failed for model '{name}': {error}")
        await self._revive_users(name)

    async def _load_requirements(self, requires: Sequence[str], seen: set[str]) -> None:
        """Load what an ensemble runs, where it does not serve yet (its own errors stay on its entry)."""
        for name in requires:
            if name in seen or self._serving(name):
                continue
            seen.add(name)
            await self._load_requirements(await asyncio.to_thread(_read_requires, self.repository.root / name), seen)
            await self._load(name, explicit=False)

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload ``name``: new requests get an error, those in flight finish; returns once they have.

        Ensembles that run it go down with it (they come back when it does). ``unload_dependents``, as in
        Triton: the models it runs go too, unless they were loaded on their own account or another model
        still runs them. A name the server never loaded is nothing to do.
        """
        entry = self.models.get(name)
        if entry is None:
            return
        await self._unload(name, UNLOADED)
        await self._unload_users(name)
        if unload_dependents:
            for required in entry.requires:
                other = self.models.get(required)
                if other is None or other.explicit or not other.versions:
                    continue
                if any(required in e.requires and e.versions for e in self.models.values()):
                    continue
                await self.unload(required, unload_dependents=True)

    # -- polling ----------------------------------------------------------------------------------------
    async def poll(self, *, settle: bool = True) -> None:
        """Bring the loaded models in line with the repository: load new folders, reload changed ones,
        unload removed ones.

        A folder is loaded only once it is complete: its config.pbtxt parses, it has a version folder, and
        every version to load has its model file. With ``settle``, a new or changed folder must also look the
        same in two polls in a row, so a folder still being copied is not read half-way (a remote
        repository's copy needs no such wait: each folder is swapped in whole).
        """
        try:
            names = await asyncio.to_thread(self.repository.model_names)
        except (ConfigError, OSError) as exc:
            logger.error("cannot read the model repository: %s", exc)
            return
        present = set(names)
        for name in [n for n in self.models if n not in present]:
            if self.models[name].versions:
                await self._unload(name, UNLOADED)
                await self._unload_users(name)
            self.models.pop(name, None)
            logger.info("model '%s' left the repository", name)
        for name in [n for n in (*self._seen, *self._waiting) if n not in present]:
            self._seen.pop(name, None)
            self._waiting.pop(name, None)
        stamps = await asyncio.to_thread(lambda: {n: _stamp(self.repository.root / n) for n in names})
        changed: list[str] = []
        for name in names:
            stamp = stamps[name]
            entry = self.models.get(name)
            seen_before = self._seen.get(name)
            self._seen[name] = stamp
            if entry is not None and entry.stamp == stamp:
                continue
            if name in self._waiting and self._waiting[name][0] == stamp:
                continue
            if settle and seen_before != stamp:
                continue
            changed.append(name)
        requires = await asyncio.to_thread(lambda: {n: _read_requires(self.repository.root / n) for n in changed})
        for wave in _waves(requires):
            await asyncio.gather(*(self._poll_load(name) for name in wave))

    async def _poll_load(self, name: str) -> None:
        try:
            error = await self._load(name, explicit=True, require_files=True)
        except _Incomplete as exc:
            if self._waiting.get(name, (None, ""))[1] != exc.why:
                logger.info("model folder '%s' is not complete yet (%s): loading it once it is", name, exc.why)
            self._waiting[name] = (exc.stamp, exc.why)
            return
        self._waiting.pop(name, None)
        if not error:
            await self._revive_users(name)

    # -- loading ----------------------------------------------------------------------------------------
    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def _serving(self, name: str) -> bool:
        entry = self.models.get(name)
        return entry is not None and entry.state == READY

    async def _load(
        self, name: str, *, explicit: bool, override: Path | None = None, require_files: bool = False
    ) -> str:
        """Load or reload one model; returns why it failed, empty when every version serves.

        ``override``: a temporary repository holding the model's folder as a load request gave it.
        ``require_files``: raise _Incomplete, changing nothing, while the folder is not complete.
        """
        async with self._lock(name):
            folder = (override or self.repository.root) / name
            stamp = None if override is not None else await asyncio.to_thread(_stamp, folder)
            repository = self.repository if override is None else self._repository_at(override)
            if require_files:
                why = await asyncio.to_thread(_incomplete_reason, folder)
                if why:
                    raise _Incomplete(why, stamp)
            source: ModelSource | None = None
            problem = ""
            try:
                source = await asyncio.to_thread(repository.load, name)
            except ConfigError as exc:
                problem = _shown(exc, override)
            except Exception:
                logger.exception("reading model '%s' failed", name)
                problem = "unexpected error while reading the model; see the server log"
            if source is not None and require_files:
                why = await asyncio.to_thread(_missing_files, source)
                if why:
                    raise _Incomplete(why, stamp)
            entry = self.models.get(name)
            if entry is None:
                entry = self.models[name] = ModelEntry(name)
            entry.explicit = entry.explicit or explicit
            if source is None:
                return await self._not_loaded(entry, problem, stamp, override)
            entry.requires = _steps(source.config)
            missing = self._missing_requirement(entry)
            if missing:
                return await self._not_loaded(entry, missing, stamp, override)
            before = dict(entry.version_states)
            for version in source.versions:
                if version not in entry.versions:
                    entry.version_states[version] = VersionState(LOADING)
            if not entry.versions:
                entry.state = LOADING
            built, failed = await self._build_versions(entry, source)
            if self._closed:
                await _close_versions(built.values())
                return "the server is shutting down"
            missing = self._missing_requirement(entry)  # unloaded while this one was being built
            if missing:
                await _close_versions(built.values())
                return await self._not_loaded(entry, missing, stamp, override, before)
            if entry.versions and (failed or not built):
                return await self._keep_serving(entry, before, built, failed, stamp, override)
            self._publish(entry, source, built, failed, stamp, override)
            return _joined(failed)

    def _missing_requirement(self, entry: ModelEntry) -> str:
        """Why ``entry`` cannot load for a composing model that does not serve (noted in ``awaiting``, so it
        loads once that model does); empty when all serve."""
        for required in entry.requires:
            if not self._serving(required):
                entry.awaiting = required
                other = self.models.get(required)
                detail = f": {other.reason}" if other is not None and other.reason else ""
                return f"composing model '{required}' is not available{detail}"
        return ""

    async def _build_versions(
        self, entry: ModelEntry, source: ModelSource
    ) -> tuple[dict[int, ModelVersion], dict[int, str]]:
        built: dict[int, ModelVersion] = {}
        failed: dict[int, str] = {}
        for version in source.versions:
            serving = entry.versions.get(version)
            try:
                built[version] = await self._build_version(
                    entry.name, source, version, serving.stats if serving is not None else None
                )
            except (ModelLoadError, ConfigError, OSError) as exc:
                failed[version] = str(exc)
                logger.error("model '%s' version %d failed to load: %s", entry.name, version, exc)
            except Exception:
                failed[version] = "unexpected error while loading; see the server log"
                logger.exception("model '%s' version %d failed to load", entry.name, version)
        return built, failed

    async def _build_version(
        self, name: str, source: ModelSource, version: int, stats: ModelStats | None = None
    ) -> ModelVersion:
        """Build one version of ``name`` from its config and its backend's instances, ready for requests.

        The one place where a version comes to life: what must happen before a version takes requests (its
        scheduler, a warmup) happens here, while any older version of the model still serves. ``stats``: the
        statistics of the version this one replaces, so counters go on across a reload.
        """
        stats = stats or ModelStats(name, str(version))
        label = f"model '{name}' version {version}"
        warn_if_uncached(self.cache, source.config, label)
        if is_ensemble(source.config):
            return self._build_ensemble_version(name, source, version, stats)
        backend = get_backend(source.config)
        instances = await asyncio.to_thread(backend.create_instances, source.config, source.artifact(version), version)
        try:
            scheduler = Scheduler(
                SchedulerConfig.from_model_config(source.config), instances, stats, model_label=f"{name}"
            )
            scheduler.start()
        except BaseException:
            for inst in instances:
                inst.close()
            raise
        inputs, outputs = _specs(source.config.input), _specs(source.config.output)
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

    def _build_ensemble_version(self, name: str, source: ModelSource, version: int, stats: ModelStats) -> ModelVersion:
        """An ensemble version: checked against its composing models (loaded first), no instances of its own."""
        inputs, outputs = _specs(source.config.input), _specs(source.config.output)
        scheduler = create_ensemble_scheduler(source.config, stats, self, inputs, outputs)
        logger.info("loaded ensemble '%s' version %d: %d step(s)", name, version, len(scheduler.plan.steps))
        return ModelVersion(name, version, source.config, scheduler, stats, inputs, outputs, [])

    def _publish(
        self,
        entry: ModelEntry,
        source: ModelSource,
        built: dict[int, ModelVersion],
        failed: dict[int, str],
        stamp: Stamp | None,
        override: Path | None,
    ) -> None:
        """Swap the new versions in (no await: one step on the loop), then retire the old ones behind it."""
        old = list(entry.versions.values())
        old_override = entry.override
        entry.versions = built
        entry.config = source.config
        entry.failed = failed
        for mv in old:
            if mv.version not in built:
                entry.version_states[mv.version] = VersionState(UNLOADING)
        for version in built:
            entry.version_states[version] = VersionState(READY)
        for version, reason in failed.items():
            entry.version_states[version] = VersionState(UNAVAILABLE, reason)
        entry.state = READY if built and not failed else UNAVAILABLE
        entry.reason = _joined(failed)
        entry.stamp = stamp
        entry.override = override
        entry.awaiting = ""
        if old:
            logger.info("model '%s' reloaded; the previous versions finish their requests", entry.name)
        if old or old_override is not None:
            task = asyncio.get_running_loop().create_task(self._retire(entry, old, old_override))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, entry: ModelEntry, old: list[ModelVersion], override: Path | None) -> None:
        """Close replaced versions (their queued and running requests finish first) and drop their files."""
        await _close_versions(old)
        for mv in old:
            if mv.version not in entry.versions and entry.version_states.get(mv.version) == VersionState(UNLOADING):
                entry.version_states[mv.version] = VersionState(UNAVAILABLE, UNLOADED)
        if override is not None:
            await asyncio.to_thread(shutil.rmtree, override, True)

    async def _keep_serving(
        self,
        entry: ModelEntry,
        before: dict[int, VersionState],
        built: dict[int, ModelVersion],
        failed: dict[int, str],
        stamp: Stamp | None,
        override: Path | None,
    ) -> str:
        """A reload failed: drop what it built, keep the serving versions, and say why on their rows."""
        await _close_versions(built.values())
        reason = _joined(failed) or "no version to load"
        return await self._not_loaded(entry, reason, stamp, override, before)

    async def _not_loaded(
        self,
        entry: ModelEntry,
        reason: str,
        stamp: Stamp | None,
        override: Path | None,
        before: dict[int, VersionState] | None = None,
    ) -> str:
        """Record a load that failed as a whole; versions that serve keep serving. Returns ``reason``."""
        entry.stamp = stamp
        if override is not None:
            await asyncio.to_thread(shutil.rmtree, override, True)
        if entry.versions:
            note = f"reload failed, the loaded versions still serve: {reason}"
            entry.version_states = dict(before if before is not None else entry.version_states)
            for version in entry.versions:
                entry.version_states[version] = VersionState(READY, note)
            entry.reason = note
            logger.error("model '%s': %s", entry.name, note)
            return reason
        entry.version_states = {}
        entry.config = None
        entry.failed = {}
        entry.state = UNAVAILABLE
        entry.reason = reason
        logger.error("model '%s' failed to load: %s", entry.name, reason)
        return reason

    # -- unloading --------------------------------------------------------------------------------------
    async def _unload(self, name: str, reason: str, awaiting: str = "") -> None:
        """Take every version of ``name`` out of service and wait for their requests to finish."""
        async with self._lock(name):
            entry = self.models.get(name)
            if entry is None:
                return
            old = list(entry.versions.values())
            entry.versions = {}
            entry.config = None
            entry.failed = {}
            entry.awaiting = awaiting
            if reason == UNLOADED:
                entry.explicit = False
            for mv in old:
                entry.version_states[mv.version] = VersionState(UNLOADING)
            entry.state = UNLOADING
            entry.reason = ""
            await _close_versions(old)
            for version in entry.version_states:
                entry.version_states[version] = VersionState(UNAVAILABLE, reason)
            entry.state = UNAVAILABLE
            entry.reason = reason
            if entry.override is not None:
                await asyncio.to_thread(shutil.rmtree, entry.override, True)
                entry.override = None
            if old:
                logger.info("unloaded model '%s' (%s)", name, reason)

    async def _unload_users(self, name: str) -> None:
        """Take down the ensembles that run ``name``, which no longer serves (and those that run them)."""
        for user in [e for e in self.models.values() if name in e.requires and e.versions]:
            await self._unload(user.name, f"composing model '{name}' is not available", awaiting=name)
            await self._unload_users(user.name)

    async def _revive_users(self, name: str) -> None:
        """``name`` serves again: load the ensembles that went down with it, once all they run serves."""
        for user in [e for e in self.models.values() if e.awaiting and name in e.requires]:
            if self._closed or not all(self._serving(r) for r in user.requires):
                continue
            if not await self._load(user.name, explicit=user.explicit):
                await self._revive_users(user.name)

    # -- load requests with overrides -------------------------------------------------------------------
    def _repository_at(self, root: Path) -> ModelRepository:
        return ModelRepository(
            root,
            strict_model_config=self.repository.strict_model_config,
            autocomplete=self.repository.autocomplete,
            gpus=self.repository.gpus,
        )

    def _write_override(self, name: str, config: str | None, files: Mapping[str, bytes]) -> Path:
        """A temporary repository holding ``name`` as a load request describes it (blocking).

        With files, they are the model folder; without, the repository's folder is linked in, all but its
        config.pbtxt, which ``config`` replaces.
        """
        parsed = ModelConfig()
        if config is None:
            raise InvalidArgument(
                f"failed to load '{name}': file overrides need the 'config' parameter too (the files replace "
                "the model's folder, config.pbtxt included)"
            )
        if not config.lstrip().startswith("{"):
            raise InvalidArgument(f"failed to load '{name}': the 'config' parameter must be a JSON object")
        try:
            json_format.Parse(config, parsed)
        except (json_format.ParseError, TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"failed to load '{name}': the 'config' parameter is not a model config: {exc}"
            ) from None
        paths = {_relative_path(name, key): data for key, data in files.items()}
        root = Path(tempfile.mkdtemp(prefix="modelsvc-load-"))
        try:
            folder = root / name
            folder.mkdir()
            for relative, data in paths.items():
                target = folder / relative
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
                except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
                    raise InvalidArgument(
                        f"failed to load '{name}': file override '{relative}' collides with another one: {exc}"
                    ) from None
            if not paths:
                original = self.repository.root / name
                if original.is_dir():
                    for child in original.iterdir():
                        if child.name != CONFIG_FILENAME:
                            (folder / child.name).symlink_to(child.absolute())
            (folder / CONFIG_FILENAME).write_text(text_format.MessageToString(parsed), encoding="utf-8")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return root

    # -- what the data plane reads ----------------------------------------------------------------------
    def all_ready(self) -> bool:
        """Triton's strict readiness: every model the server loaded, or tried to, serves every version it
        should; versions unloaded on purpose and models nobody asked for (explicit mode) do not count."""
        for entry in self.models.values():
            if not entry.state:
                continue
            if not entry.version_states:
                if entry.reason != UNLOADED:
                    return False
                continue
            if any(s.state != READY and s.reason != UNLOADED for s in entry.version_states.values()):
                return False
        return True

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """The repository index, as Triton gives it: every model folder of the repository, loaded or not.

        A model never loaded is its name alone; every version the server loaded or tried has a row with its
        state and reason; a model that failed before any version could load has one row without a version.
        """
        try:
            names = set(self.repository.model_names())
        except (ConfigError, OSError):
            names = set()
        rows: list[dict[str, Any]] = []
        for name in sorted(names | set(self.models)):
            entry = self.models.get(name)
            if entry is None or not entry.state:
                waiting = self._waiting.get(name)
                if waiting is not None and entry is None:
                    if not ready_only:
                        reason = f"waiting for the model folder to be complete: {waiting[1]}"
                        rows.append({"name": name, "state": UNAVAILABLE, "reason": reason})
                elif not ready_only:
                    rows.append({"name": name})
                continue
            if not entry.version_states:
                if not ready_only or entry.state == READY:
                    rows.append({"name": name, "state": entry.state, "reason": entry.reason})
                continue
            for version, vs in sorted(entry.version_states.items()):
                if not ready_only or vs.state == READY:
                    rows.append({"name": name, "version": str(version), "state": vs.state, "reason": vs.reason})
        return rows

    def entry(self, name: str) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return entry

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The version asked for, or the newest loaded one when ``version`` is empty.

        A caller that queues a request on the version's scheduler must do so without awaiting after this
        call: a reload closes the old schedulers right after the swap.
        """
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
            if number in entry.version_states:
                raise Unavailable(f"Request for unknown model: '{name}' version {number} is not at ready state")
            raise NotFound(f"Request for unknown model: '{name}' version {number} is not found")
        return found

    def loaded(self) -> Iterator[ModelVersion]:
        for entry in self.models.values():
            yield from entry.versions.values()

    async def close(self) -> None:
        """Close every version (what they hold runs first) and remove the load requests' temporary folders."""
        self._closed = True
        versions = list(self.loaded())
        # ensembles first: the requests they have in flight still need their composing models
        await _close_versions(v for v in versions if isinstance(v.scheduler, EnsembleScheduler))
        await asyncio.gather(_close_versions(versions), *list(self._retiring))
        for entry in self.models.values():
            if entry.override is not None:
                await asyncio.to_thread(shutil.rmtree, entry.override, True)
                entry.override = None


# -- helpers (no model table) -----------------------------------------------------------------------------


async def _close_versions(versions: Iterable[ModelVersion]) -> None:
    """Close schedulers (each runs what it holds first); a failure is logged, the others still close."""
    chosen = list(versions)
    results = await asyncio.gather(*(mv.scheduler.close() for mv in chosen), return_exceptions=True)
    for mv, result in zip(chosen, results, strict=True):
        if isinstance(result, BaseException):
            logger.error("closing model '%s' version %d failed", mv.name, mv.version, exc_info=result)


def _joined(failed: Mapping[int, str]) -> str:
    return "; ".join(f"version {v}: {r}" for v, r in sorted(failed.items()))


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise InvalidArgument(f"'{name}' is not a model name")


def _relative_path(model: str, key: str) -> PurePosixPath:
    """A file override's path inside the model folder; anything that could leave the folder is refused."""
    path = PurePosixPath(key)
    if not key or path.is_absolute() or "\\" in key or any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidArgument(
            f"failed to load '{model}': file override 'file:{key}' must be a relative path inside the model "
            "folder, such as 'file:1/model.onnx'"
        )
    return path


def _shown(exc: ConfigError, override: Path | None) -> str:
    """A config error as the caller reads it: a load request's temporary folder is named as such."""
    text = str(exc)
    return text if override is None else text.replace(str(override), "(load request)")


def _steps(config: ModelConfig) -> tuple[str, ...]:
    """The models an ensemble's steps run, each once, in order (empty for other models)."""
    return tuple(dict.fromkeys(str(s.model_name) for s in config.ensemble_scheduling.step if s.model_name))


def _read_requires(folder: Path) -> tuple[str, ...]:
    """The models the config.pbtxt in ``folder`` runs; empty when it cannot be read (blocking)."""
    config = ModelConfig()
    try:
        text_format.Parse((folder / CONFIG_FILENAME).read_text(encoding="utf-8"), config)
    except (OSError, UnicodeDecodeError, text_format.ParseError):
        return ()
    return _steps(config)


def _waves(requires: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """The names in groups that load together, each group after the models its members run (a cycle of
    ensembles comes last, as one group: its loads then fail with the reason)."""
    left = {name: {r for r in reqs if r in requires and r != name} for name, reqs in requires.items()}
    waves: list[list[str]] = []
    while left:
        ready = sorted(name for name, reqs in left.items() if not reqs)
        if not ready:
            waves.append(sorted(left))
            break
        waves.append(ready)
        for name in ready:
            del left[name]
        for reqs in left.values():
            reqs.difference_update(ready)
    return waves


def _stamp(folder: Path) -> Stamp:
    """Every file and folder under ``folder`` with its size and modification time (blocking)."""
    rows: list[tuple[str, int, int]] = []
    for top, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        base = Path(top).relative_to(folder)
        rows += [(str(base / d), -1, 0) for d in dirs]
        for name in sorted(files):
            try:
                info = (Path(top) / name).stat()
            except OSError:
                continue
            rows.append((str(base / name), info.st_size, info.st_mtime_ns))
    return tuple(rows)


def _incomplete_reason(folder: Path) -> str:
    """Why a model folder is not complete yet, from what is on disk; empty when it looks complete (blocking).

    Complete: its config.pbtxt (if any) parses, it has a numeric version folder, and no version folder is empty
    (except an ensemble's, which are empty by design)."""
    config = ModelConfig()
    config_path = folder / CONFIG_FILENAME
    if config_path.exists():
        try:
            text_format.Parse(config_path.read_text(encoding="utf-8"), config)
        except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
            return f"{CONFIG_FILENAME} does not parse: {exc}"
    try:
        versions = sorted(int(c.name) for c in folder.iterdir() if c.name.isdigit() and c.is_dir())
        if not versions:
            return "no version folder"
        if not _steps(config):
            for version in versions:
                if not any((folder / str(version)).iterdir()):
                    return f"version folder {version}/ is empty"
    except OSError as exc:
        return f"cannot list the folder: {exc}"
    return ""


def _missing_files(source: ModelSource) -> str:
    """The first model file of a version to load that is not there yet; empty when all are."""
    if _steps(source.config):
        return ""  # an ensemble's version folders are empty
    for version in source.versions:
        artifact = source.artifact(version)
        if artifact.is_dir():
            if not any(artifact.iterdir()):
                return f"version folder {version}/ is empty"
        elif not artifact.exists():
            return f"{artifact.relative_to(source.path)} is missing"
    return ""
