"""The model table: each model the server has dealt with (:class:`ModelEntry`) and its versions, and what
the data plane reads of it: the repository index with states and reasons, readiness, the version a request
asks for.

:class:`ModelRegistry` only reads the table; the model manager, built on it, changes it (on the event loop).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends import ModelConfig
from ..protocol import NotFound, Unavailable
from ..repository import ConfigError, ModelRepository
from ._loading import Stamp
from ._version import READY, UNAVAILABLE, UNLOADED, ModelVersion, VersionState


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


class ModelRegistry:
    """The models of one repository as the server knows them, and the answers read from them."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.models: dict[str, ModelEntry] = {}
        self._waiting: dict[str, tuple[Stamp | None, str]] = {}
        """Polling: folders not complete yet, with what they lack."""

    def _serving(self, name: str) -> bool:
        entry = self.models.get(name)
        return entry is not None and entry.state == READY

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
