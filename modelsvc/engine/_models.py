"""The model manager: loads, reloads without downtime, unloads and polls the models of a repository.

:class:`ModelManager` is the model table (:class:`ModelRegistry`) with the operations that change it, only on
the event loop; backend instances are created in worker threads. A version comes to life in
``_version.build_version``; the model folders are read in ``_loading``.

Reloading a model that serves builds the new versions completely (instances created, every hook of
``build_version`` run) while the old ones keep serving, swaps them into the entry in one step with no
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
import logging
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..backends import ModelLoadError
from ..protocol import InvalidArgument, Unavailable
from ..repository import ConfigError, ModelRepository, ModelSource
from ._cache import ResponseCache
from ._ensemble import EnsembleScheduler, InferTarget
from ._loading import (
    Incomplete,
    Stamp,
    check_name,
    ensemble_steps,
    folder_stamp,
    incomplete_reason,
    load_waves,
    missing_files,
    read_requires,
    repository_at,
    shown_error,
    write_override,
)
from ._registry import ModelEntry, ModelRegistry
from ._version import (
    LOADING,
    READY,
    UNAVAILABLE,
    UNLOADED,
    UNLOADING,
    ModelVersion,
    VersionState,
    build_version,
    close_versions,
)

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


class ModelManager(ModelRegistry):
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
        super().__init__(repository)
        self.mode = mode
        self.remote = remote
        self._locks: dict[str, asyncio.Lock] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._seen: dict[str, Stamp] = {}
        """Polling: each folder as the previous poll saw it."""
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
        for wave in load_waves(requires):
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
                found[name] = read_requires(self.repository.root / name)
                todo += found[name]
        return found

    # -- requests: load and unload ----------------------------------------------------------------------
    async def load(self, name: str, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        """Load ``name``, or reload it when it serves; raises a ModelsvcError unless it ends up serving.

        ``config`` (JSON of a ModelConfig) replaces the folder's config.pbtxt; ``files`` (paths such as
        ``1/model.onnx`` -> content) replace the folder itself and need ``config``. An ensemble's composing
        models are loaded first where they do not serve yet.
        """
        check_name(name)
        if self.remote is not None:
            try:
                await asyncio.to_thread(self.remote.sync, allow_empty=True)
            except Exception as exc:  # RemoteRepositoryError, or OSError underneath it
                raise Unavailable(f"failed to load '{name}': cannot refresh the repository's copy: {exc}") from None
        override = None
        if config is not None or files:
            override = await asyncio.to_thread(write_override, self.repository, name, config, files or {})
        folder = (override or self.repository.root) / name
        requires = await asyncio.to_thread(read_requires, folder)
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
            await self._load_requirements(await asyncio.to_thread(read_requires, self.repository.root / name), seen)
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
        stamps = await asyncio.to_thread(lambda: {n: folder_stamp(self.repository.root / n) for n in names})
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
        requires = await asyncio.to_thread(lambda: {n: read_requires(self.repository.root / n) for n in changed})
        for wave in load_waves(requires):
            await asyncio.gather(*(self._poll_load(name) for name in wave))

    async def _poll_load(self, name: str) -> None:
        try:
            error = await self._load(name, explicit=True, require_files=True)
        except Incomplete as exc:
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

    async def _load(
        self, name: str, *, explicit: bool, override: Path | None = None, require_files: bool = False
    ) -> str:
        """Load or reload one model; returns why it failed, empty when every version serves.

        ``override``: a temporary repository holding the model's folder as a load request gave it.
        ``require_files``: raise Incomplete, changing nothing, while the folder is not complete.
        """
        async with self._lock(name):
            folder = (override or self.repository.root) / name
            stamp = None if override is not None else await asyncio.to_thread(folder_stamp, folder)
            repository = self.repository if override is None else repository_at(self.repository, override)
            if require_files:
                why = await asyncio.to_thread(incomplete_reason, folder)
                if why:
                    raise Incomplete(why, stamp)
            source: ModelSource | None = None
            problem = ""
            try:
                source = await asyncio.to_thread(repository.load, name)
            except ConfigError as exc:
                problem = shown_error(exc, override)
            except Exception:
                logger.exception("reading model '%s' failed", name)
                problem = "unexpected error while reading the model; see the server log"
            if source is not None and require_files:
                why = await asyncio.to_thread(missing_files, source)
                if why:
                    raise Incomplete(why, stamp)
            entry = self.models.get(name)
            if entry is None:
                entry = self.models[name] = ModelEntry(name)
            entry.explicit = entry.explicit or explicit
            if source is None:
                return await self._not_loaded(entry, problem, stamp, override)
            entry.requires = ensemble_steps(source.config)
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
                await close_versions(built.values())
                return "the server is shutting down"
            missing = self._missing_requirement(entry)  # unloaded while this one was being built
            if missing:
                await close_versions(built.values())
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
                built[version] = await build_version(
                    entry.name,
                    source,
                    version,
                    serving.stats if serving is not None else None,
                    cache=self.cache,
                    composing=self,
                )
            except (ModelLoadError, ConfigError, OSError) as exc:
                failed[version] = str(exc)
                logger.error("model '%s' version %d failed to load: %s", entry.name, version, exc)
            except Exception:
                failed[version] = "unexpected error while loading; see the server log"
                logger.exception("model '%s' version %d failed to load", entry.name, version)
        return built, failed

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
        await close_versions(old)
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
        await close_versions(built.values())
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
            await close_versions(old)
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

    async def close(self) -> None:
        """Close every version (what they hold runs first) and remove the load requests' temporary folders."""
        self._closed = True
        versions = list(self.loaded())
        # ensembles first: the requests they have in flight still need their composing models
        await close_versions(v for v in versions if isinstance(v.scheduler, EnsembleScheduler))
        await asyncio.gather(close_versions(versions), *list(self._retiring))
        for entry in self.models.values():
            if entry.override is not None:
                await asyncio.to_thread(shutil.rmtree, entry.override, True)
                entry.override = None


# -- helpers (no model table) -----------------------------------------------------------------------------


def _joined(failed: Mapping[int, str]) -> str:
    return "; ".join(f"version {v}: {r}" for v, r in sorted(failed.items()))
