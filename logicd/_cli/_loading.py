"""What ``serve`` and ``up`` share: finding a service's ``service.yaml``, loading it with the command line's
overrides, importing the service's code, and the exit statuses."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .._config import CONFIG_ENV, ConfigError, ServerConfig, ServiceConfig, load_config

if TYPE_CHECKING:
    from .._service import Service

CONFIG_FILE = "service.yaml"

USAGE_ERROR = 2
RUN_ERROR = 1


def config_path(given: Path | None, env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """The service.yaml that SERVICE_DIR (a folder or a file), ``$LOGICD_CONFIG`` or the current folder names."""
    env = os.environ if env is None else env
    if given is None:
        named = env.get(CONFIG_ENV)
        given = Path(named) if named else Path()
    return given / CONFIG_FILE if given.is_dir() else given


def with_overrides(
    config: ServiceConfig, *, host: str | None = None, port: int | None = None, model_url: str | None = None
) -> ServiceConfig:
    """``config`` with the command line's ``--host``, ``--port`` and ``--model-url``; a bad URL raises
    :class:`ConfigError` naming the flag."""
    server = ServerConfig(
        host=config.server.host if host is None else host,
        port=config.server.port if port is None else port,
    )
    models = config.model_service
    if model_url is not None:
        try:
            models = msgspec.structs.replace(models, url=model_url)
        except ConfigError as exc:
            raise ConfigError(exc.reason, source="--model-url") from exc
    return msgspec.structs.replace(config, server=server, model_service=models)


def load(args: argparse.Namespace, command: str, model_url: str | None = None) -> tuple[Path, ServiceConfig] | int:
    """The config file and its config with the flags applied, or the exit status after printing why not."""
    path = config_path(args.service_dir)
    try:
        config = with_overrides(load_config(path), host=args.host, port=args.port, model_url=model_url)
    except ConfigError as exc:
        print(f"logicd {command}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    return path, config


def import_service(config: ServiceConfig, service_dir: Path, command: str) -> Service | int:
    """The service object, or the exit status after printing why it could not be imported."""
    from .._service import load_service

    try:
        return load_service(config, service_dir)
    except (ImportError, TypeError) as exc:
        print(f"logicd {command}: {exc}", file=sys.stderr)
    except Exception:  # the service's module raised on import: show where
        print(f"logicd {command}: importing {config.service!r} failed:\n{traceback.format_exc()}", file=sys.stderr)
    return USAGE_ERROR
