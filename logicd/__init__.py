"""logicd: the logic-server framework (the CPU half of a service).

A service is a ``Service`` with async handlers taking (request, ``Context``); ``create_app`` turns it and its
``ServiceConfig`` (``load_config``: service.yaml with ``LOGICD_`` overrides) into a Litestar app. The text
toolkit (``logicd.text``) tokenizes offline, cuts 512-token windows, batches and aggregates.
"""

from ._app import create_app
from ._config import (
    AuthConfig,
    ChunkingConfig,
    ConfigError,
    LimitsConfig,
    ModelRef,
    ModelServiceConfig,
    ServerConfig,
    ServiceConfig,
    TokenizerConfig,
    example_config,
    load_config,
)
from ._context import Context
from ._problems import ServiceError
from ._service import Service, load_service

__version__ = "0.1.0"

__all__ = [
    "AuthConfig",
    "ChunkingConfig",
    "ConfigError",
    "Context",
    "LimitsConfig",
    "ModelRef",
    "ModelServiceConfig",
    "ServerConfig",
    "Service",
    "ServiceConfig",
    "ServiceError",
    "TokenizerConfig",
    "__version__",
    "create_app",
    "example_config",
    "load_config",
    "load_service",
]
