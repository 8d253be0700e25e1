"""Reading model folders for loading: what a folder runs, in which order models load, whether a folder is
complete, and the temporary repository that a load request's config or files override a folder with.

Everything here reads or writes files and knows nothing of the model table (blocking functions, which the
model manager runs in worker threads).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from google.protobuf import json_format, text_format

from ..backends import ModelConfig
from ..protocol import InvalidArgument
from ..repository import CONFIG_FILENAME, ConfigError, ModelRepository, ModelSource

Stamp = tuple[tuple[str, int, int], ...]
"""A model folder's files and folders as (relative path, size, mtime ns); a folder has size -1."""


class Incomplete(Exception):
    """A model folder that is not complete yet (polling): nothing is loaded from it until it is."""

    def __init__(self, why: str, stamp: Stamp | None) -> None:
        super().__init__(why)
        self.why = why
        self.stamp = stamp


# -- what a folder runs, and the order of loads -----------------------------------------------------------


def ensemble_steps(config: ModelConfig) -> tuple[str, ...]:
    """The models an ensemble's steps run, each once, in order (empty for other models)."""
    return tuple(dict.fromkeys(str(s.model_name) for s in config.ensemble_scheduling.step if s.model_name))


def read_requires(folder: Path) -> tuple[str, ...]:
    """The models the config.pbtxt in ``folder`` runs; empty when it cannot be read (blocking)."""
    config = ModelConfig()
    try:
        text_format.Parse((folder / CONFIG_FILENAME).read_text(encoding="utf-8"), config)
    except (OSError, UnicodeDecodeError, text_format.ParseError):
        return ()
    return ensemble_steps(config)


def load_waves(requires: Mapping[str, Sequence[str]]) -> list[list[str]]:
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


# -- polling: is a folder complete, and has it changed ----------------------------------------------------


def folder_stamp(folder: Path) -> Stamp:
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


def incomplete_reason(folder: Path) -> str:
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
        if not ensemble_steps(config):
            for version in versions:
                if not any((folder / str(version)).iterdir()):
                    return f"version folder {version}/ is empty"
    except OSError as exc:
        return f"cannot list the folder: {exc}"
    return ""


def missing_files(source: ModelSource) -> str:
    """The first model file of a version to load that is not there yet; empty when all are."""
    if ensemble_steps(source.config):
        return ""  # an ensemble's version folders are empty
    for version in source.versions:
        artifact = source.artifact(version)
        if artifact.is_dir():
            if not any(artifact.iterdir()):
                return f"version folder {version}/ is empty"
        elif not artifact.exists():
            return f"{artifact.relative_to(source.path)} is missing"
    return ""


# -- load requests with overrides -------------------------------------------------------------------------


def check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise InvalidArgument(f"'{name}' is not a model name")


def shown_error(exc: ConfigError, override: Path | None) -> str:
    """A config error as the caller reads it: a load request's temporary folder is named as such."""
    text = str(exc)
    return text if override is None else text.replace(str(override), "(load request)")


def repository_at(repository: ModelRepository, root: Path) -> ModelRepository:
    """A repository at ``root`` (a load request's temporary one) read with ``repository``'s settings."""
    return ModelRepository(
        root,
        strict_model_config=repository.strict_model_config,
        autocomplete=repository.autocomplete,
        gpus=repository.gpus,
    )


def write_override(repository: ModelRepository, name: str, config: str | None, files: Mapping[str, bytes]) -> Path:
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
        raise InvalidArgument(f"failed to load '{name}': the 'config' parameter is not a model config: {exc}") from None
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
            original = repository.root / name
            if original.is_dir():
                for child in original.iterdir():
                    if child.name != CONFIG_FILENAME:
                        (folder / child.name).symlink_to(child.absolute())
        (folder / CONFIG_FILENAME).write_text(text_format.MessageToString(parsed), encoding="utf-8")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def _relative_path(model: str, key: str) -> PurePosixPath:
    """A file override's path inside the model folder; anything that could leave the folder is refused."""
    path = PurePosixPath(key)
    if not key or path.is_absolute() or "\\" in key or any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidArgument(
            f"failed to load '{model}': file override 'file:{key}' must be a relative path inside the model "
            "folder, such as 'file:1/model.onnx'"
        )
    return path
