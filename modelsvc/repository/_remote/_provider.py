"""The one interface behind which each object store (S3, GCS, Azure) sits, and what all of them share.

A :class:`Provider` parses the part of a URL after ``scheme://`` into a :class:`Location` (what fsspec
opens, with which options, and how messages show it), names its fsspec filesystem package and the
modelsvc extra that installs it, and says where its credentials come from. :func:`refuse_secrets`
is the check every provider runs first: no credentials, query string or fragment in a URL.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from ._errors import RemoteAccessError, RemoteNotFoundError, RemoteRepositoryError

__all__ = ["FileSystem", "Location", "Provider", "refuse_secrets"]


class FileSystem(Protocol):
    """The fsspec filesystem, as remote repositories use it."""

    def find(self, path: str, *, detail: bool) -> dict[str, dict[str, Any]]: ...

    def get_file(self, rpath: str, lpath: str) -> None: ...

    def invalidate_cache(self, path: str | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class Location:
    provider: Provider
    """the store that the URL names"""
    scheme: str
    """the URL's scheme, lower case"""
    fsspec_url: str
    """what fsspec opens: the URL less any endpoint part"""
    display: str
    """the URL for messages and logs"""
    key: str
    """what tells two caches apart: the display form and the endpoint"""
    options: dict[str, Any]
    """keyword arguments for the filesystem"""


class Provider(abc.ABC):
    """One kind of object store; a subclass per store fills in the class attributes and :meth:`parse`."""

    kind: ClassVar[str]
    """s3, gcs or azure"""
    schemes: ClassVar[tuple[str, ...]]
    """the URL schemes that name this store"""
    package: ClassVar[str]
    """the fsspec filesystem package"""
    extra: ClassVar[str]
    """the modelsvc extra that installs it"""
    credentials_hint: ClassVar[str]
    """where credentials come from, for the messages of access errors"""
    credential_errors: ClassVar[frozenset[str]]
    """names of the exceptions the store's client raises when it finds no credentials"""

    @abc.abstractmethod
    def parse(self, scheme: str, rest: str) -> Location:
        """The location that ``scheme://rest`` names; raises RemoteRepositoryError for a bad URL."""

    def open(self, location: Location) -> tuple[FileSystem, str]:
        """The filesystem and the root path in it (no trailing slash)."""
        package, extra = self.package, self.extra
        try:
            importlib.import_module(package)
            fsspec_core = importlib.import_module("fsspec.core")
        except ImportError as exc:
            raise RemoteRepositoryError(
                f"{location.scheme}:// repositories need the {package} package: pip install 'modelsvc[{extra}]' "
                f"(or pip install {package})"
            ) from exc
        try:
            fs, root = fsspec_core.url_to_fs(location.fsspec_url, skip_instance_cache=True, **location.options)
        except Exception as exc:  # a filesystem that rejects its settings; say so without a traceback
            raise RemoteRepositoryError(
                f"cannot open the store: {type(exc).__name__}: {exc}", location.display
            ) from exc
        return cast(FileSystem, fs), str(root).rstrip("/")

    def error(self, exc: Exception, location: str, doing: str) -> RemoteRepositoryError:
        """The RemoteRepositoryError for an exception from the filesystem while ``doing`` something."""
        names = {type(e).__name__ for e in _chain(exc)}
        if names & self.credential_errors:
            return RemoteAccessError(f"no credentials found while {doing}: {self.credentials_hint}", location)
        if isinstance(exc, PermissionError):
            return RemoteAccessError(f"access denied while {doing} ({exc}); {self.credentials_hint}", location)
        if isinstance(exc, FileNotFoundError):
            return RemoteNotFoundError(f"not found while {doing}: {exc}", location)
        return RemoteRepositoryError(f"{doing} failed: {type(exc).__name__}: {exc}", location)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def refuse_secrets(rest: str, *, account_before_at: bool = False) -> None:
    """Refuse a URL (the part after ``scheme://``) with credentials, a query string or a fragment.

    ``account_before_at``: the store's URLs may name something before an ``@`` (Azure's
    ``abfs://container@account.dfs.core.windows.net``); a colon there (user:password) is still a secret.
    """
    userinfo, at, _ = rest.partition("/")[0].rpartition("@")
    # a colon before the @ is a secret everywhere, and a bucket name never holds an @
    if at and (":" in userinfo or not account_before_at):
        raise RemoteRepositoryError(
            "credentials in the repository URL are refused; set them in the environment or the "
            "standard credential files (for S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        )
    if "?" in rest or "#" in rest:
        raise RemoteRepositoryError(
            "the repository URL takes no query string or fragment; credentials and options come from the environment"
        )
