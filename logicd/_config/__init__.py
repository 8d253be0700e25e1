"""A service's configuration: ``service.yaml``, overridden by ``LOGICD_`` environment variables.

``load_config(path)`` reads the file, applies the environment overrides, checks every value and
returns a frozen :class:`ServiceConfig`; anything wrong raises :class:`ConfigError`, whose message names
the file, the key (``chunking.stride``), the environment variable when an override caused it, and the
line and column of a YAML syntax error. ``example_config()`` returns a sample that shows every key.

The schema (the typed, documented sections) is in ``_schema``; reading the file, the overrides and the error
messages are in ``_loader``; the errors both raise are in ``_errors``.
"""

from ._errors import ConfigError
from ._loader import CONFIG_ENV, ENV_PREFIX, load_config
from ._schema import (
    EMBEDDED,
    NAME_RULE,
    AdmissionConfig,
    AuthConfig,
    ChunkingConfig,
    LimitsConfig,
    ModelRef,
    ModelServiceConfig,
    ServerConfig,
    ServiceConfig,
    TokenizerConfig,
    example_config,
    is_service_name,
)

__all__ = [
    "CONFIG_ENV",
    "EMBEDDED",
    "ENV_PREFIX",
    "NAME_RULE",
    "AdmissionConfig",
    "AuthConfig",
    "ChunkingConfig",
    "ConfigError",
    "LimitsConfig",
    "ModelRef",
    "ModelServiceConfig",
    "ServerConfig",
    "ServiceConfig",
    "TokenizerConfig",
    "example_config",
    "is_service_name",
    "load_config",
]
