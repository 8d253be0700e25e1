"""logicd: the logic-server framework (the CPU half of a service).

Built so far: the service configuration (``load_config``: service.yaml with ``LOGICD_`` overrides) and the
text toolkit (``logicd.text``: offline tokenizer, 512-token chunking, batching, aggregation). The service
API, the app and the command line come next (issue 4).
"""

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

__version__ = "0.1.0"

__all__ = [
    "AuthConfig",
    "ChunkingConfig",
    "ConfigError",
    "LimitsConfig",
    "ModelRef",
    "ModelServiceConfig",
    "ServerConfig",
    "ServiceConfig",
    "TokenizerConfig",
    "__version__",
    "example_config",
    "load_config",
]
