"""Which store a repository URL names: the providers by scheme, :func:`is_remote`, and the cache folder
that each location gets (:func:`default_cache_dir`).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ._azure import Azure
from ._errors import RemoteRepositoryError
from ._gcs import GCS
from ._provider import Location, Provider
from ._s3 import S3

__all__ = ["default_cache_dir", "is_remote", "parse"]

#: URL scheme -> the store it names
_PROVIDERS: dict[str, Provider] = {scheme: p for p in (S3(), GCS(), Azure()) for scheme in p.schemes}
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _scheme(location: str) -> str | None:
    match = _SCHEME_RE.match(location)
    return match.group(1).lower() if match else None


def is_remote(location: str) -> bool:
    """Whether ``location`` names object storage (s3://, gs://, gcs://, az://, abfs://, abfss://, as://).

    A local path, or a ``file://`` URL, is not remote.
    """
    return _scheme(location) in _PROVIDERS


def parse(url: str) -> Location:
    """The location ``url`` names; raises RemoteRepositoryError for a URL that no store takes."""
    scheme = _scheme(url)
    if scheme is None or scheme not in _PROVIDERS:
        shown = f"'{scheme}://'" if scheme else "a path"
        raise RemoteRepositoryError(f"{shown} is not a remote repository; use s3://, gs:// or az://")
    return _PROVIDERS[scheme].parse(scheme, url[len(scheme) + 3 :])


def default_cache_dir(url: str) -> Path:
    """The cache folder of ``url``: ``$MODELSVC_CACHE_DIR/repositories/<hash>`` (default ``~/.cache/modelsvc``)."""
    location = parse(url)
    base = os.environ.get("MODELSVC_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = str(Path(xdg) / "modelsvc") if xdg else str(Path.home() / ".cache" / "modelsvc")
    digest = hashlib.sha256(location.key.encode()).hexdigest()[:16]
    return Path(base).expanduser() / "repositories" / digest
