"""The model repository: Triton's on-disk layout, ``config.pbtxt`` parsing, auto-complete and checks.

    <root>/<model>/config.pbtxt          optional where the backend can auto-complete (ONNX)
    <root>/<model>/<version>/model.onnx  numeric version directories

:class:`ModelRepository` lists and loads models; a loaded model is a :class:`ModelSource` (completed
config, versions to load, artifact paths). Every problem is a :class:`ConfigError` that names the
file, and the line and column where it can. An ensemble's steps are read and checked as a graph by
:func:`plan_ensemble` (an :class:`EnsemblePlan`).

A repository in object storage (``s3://``, ``gs://``, ``az://``) is a :class:`RemoteRepository`: its
:meth:`~RemoteRepository.sync` mirrors it into a local folder, :attr:`~RemoteRepository.path`, that
:class:`ModelRepository` then reads; its failures are :class:`RemoteRepositoryError` and subclasses.
"""

from ._ensemble import EnsembleConfigError, EnsemblePlan, EnsembleStep, is_ensemble, plan_ensemble
from ._errors import ConfigError
from ._remote import (
    NoModelsError,
    RemoteAccessError,
    RemoteNotFoundError,
    RemoteRepository,
    RemoteRepositoryError,
    SyncResult,
    default_cache_dir,
    is_remote,
)
from ._repository import CONFIG_FILENAME, ModelRepository
from ._source import ModelSource
from ._validate import DEFAULT_INSTANCE_COUNT

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_INSTANCE_COUNT",
    "ConfigError",
    "EnsembleConfigError",
    "EnsemblePlan",
    "EnsembleStep",
    "ModelRepository",
    "ModelSource",
    "NoModelsError",
    "RemoteAccessError",
    "RemoteNotFoundError",
    "RemoteRepository",
    "RemoteRepositoryError",
    "SyncResult",
    "default_cache_dir",
    "is_ensemble",
    "is_remote",
    "plan_ensemble",
]
