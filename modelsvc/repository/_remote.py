"""Model repositories kept in object storage (S3, Google Cloud Storage, Azure Blob Storage).

``modelsvc serve --model-repository s3://bucket/path`` serves a Triton model repository that lives in a
bucket. modelsvc copies it into a local cache folder and serves the copy. At start-up it copies
everything once; with ``--model-control-mode poll`` it refreshes the copy every
``--repository-poll-secs`` seconds, just before it looks for changed models.

Locations
    ``s3://bucket/prefix``                   Amazon S3, or the S3-compatible server that
                                             ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` names
    ``s3://host:port/bucket/prefix``         an S3-compatible server (MinIO, Ceph, ...) at
                                             ``http://host:port``; Triton's form
    ``s3://https://host:port/bucket/prefix`` the same over HTTPS
    ``gs://bucket/prefix``, ``gcs://...``    Google Cloud Storage
    ``az://container/prefix``                Azure Blob Storage, the account from
                                             ``AZURE_STORAGE_ACCOUNT_NAME``
    ``abfs://container@account.dfs.core.windows.net/prefix`` (``abfss://`` too)
    ``as://account/container/prefix``        Azure, Triton's form

    Each kind needs its filesystem package: ``pip install 'modelsvc[s3]'`` (s3fs),
    ``'modelsvc[gcs]'`` (gcsfs) or ``'modelsvc[azure]'`` (adlfs).

Credentials
    Never in the URL: a location with ``user:password@`` or with a query string is refused, so no
    secret ends up in a process list, a shell history or a log. They come from where each cloud's own
    tools look:

    - S3: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN``; or ``AWS_PROFILE``
      with ``~/.aws/credentials`` and ``~/.aws/config``; or the machine's role (EC2, ECS, EKS).
      ``AWS_DEFAULT_REGION`` or ``AWS_REGION`` picks the region.
    - Google Cloud Storage: ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's application default
      credentials, or the machine's service account.
    - Azure: ``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT_KEY``,
      ``AZURE_STORAGE_SAS_TOKEN``, a service principal (``AZURE_STORAGE_CLIENT_ID``,
      ``AZURE_STORAGE_CLIENT_SECRET``, ``AZURE_STORAGE_TENANT_ID``) or the default Azure credential
      chain. Triton's ``AZURE_STORAGE_ACCOUNT`` and ``AZURE_STORAGE_KEY`` are read too.

Cache
    ``$MODELSVC_CACHE_DIR/repositories/<hash of the location>/`` (``MODELSVC_CACHE_DIR`` defaults to
    ``$XDG_CACHE_HOME/modelsvc``, that is ``~/.cache/modelsvc``). In it, ``models/`` is the copy that
    the server reads, ``manifest.json`` records what was downloaded, and ``staging/`` holds work in
    progress. Two processes that share a cache take turns (a file lock).

Refresh
    Each refresh lists the remote tree once and compares every file's size and ETag (or checksum, or
    modification time) with what it downloaded before: only files that differ are downloaded, and
    files gone from the bucket are deleted. A model folder is never changed in place: it is rebuilt
    in ``staging/`` (unchanged files are hard links, not copies) and swapped in with one rename, so
    the server never sees a half-written model file or a configuration without its version files.
    A folder whose ``config.pbtxt`` is there but none of whose numeric version folders holds a file
    yet is held back until its files arrive, and so is a folder whose files change during the
    download. Empty folders (S3 "folder" markers) are not copied.

Errors, each with one clear message::

    RemoteRepositoryError          a location that cannot be used: bad URL, missing package, network
    ├── RemoteNotFoundError        the bucket (or container) or the prefix does not exist
    ├── RemoteAccessError          no credentials found, or they are refused
    └── NoModelsError              the prefix holds files but no model folder
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import importlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

__all__ = [
    "NoModelsError",
    "RemoteAccessError",
    "RemoteNotFoundError",
    "RemoteRepository",
    "RemoteRepositoryError",
    "SyncResult",
    "default_cache_dir",
    "is_remote",
]

logger = logging.getLogger("modelsvc.repository")

#: URL scheme -> kind of store
_SCHEMES = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure", "as": "azure"}
#: kind of store -> (filesystem package, modelsvc extra)
_PACKAGES = {"s3": ("s3fs", "s3"), "gcs": ("gcsfs", "gcs"), "azure": ("adlfs", "azure")}
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_VERSION_RE = re.compile(r"^[^/]+/\d+/.")
#: listing keys that identify a file's content, best first; then keys that only date it
_CONTENT_KEYS = ("md5Hash", "crc32c", "ETag", "etag")
_TIME_KEYS = ("LastModified", "last_modified", "updated", "mtime", "generation")
_CONFIG = "config.pbtxt"
_MANIFEST_FORMAT = 1

#: a file as the remote listing describes it: (size in bytes, content tag)
_Entry = tuple[int, str]


# --- errors -------------------------------------------------------------------------------------------


class RemoteRepositoryError(Exception):
    """A remote repository location that cannot be used; ``str()`` reads ``location: message``.

    ``location`` is the URL as modelsvc shows it, never with credentials.
    """

    def __init__(self, message: str, location: str | None = None) -> None:
        self.message = message
        self.location = location
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message

    def __reduce__(self) -> tuple[type[RemoteRepositoryError], tuple[str, str | None]]:
        return (type(self), (self.message, self.location))


class RemoteNotFoundError(RemoteRepositoryError):
    """The bucket (or container) does not exist, or nothing is stored under the prefix."""


class RemoteAccessError(RemoteRepositoryError):
    """No credentials were found, or the store refused the ones given."""


class NoModelsError(RemoteRepositoryError):
    """Files exist under the prefix, but no folder among them is a model (no config.pbtxt or version folder)."""


# --- locations ----------------------------------------------------------------------------------------


def _scheme(location: str) -> str | None:
    match = _SCHEME_RE.match(location)
    return match.group(1).lower() if match else None


def is_remote(location: str) -> bool:
    """Whether ``location`` names object storage (s3://, gs://, gcs://, az://, abfs://, abfss://, as://).

    A local path, or a ``file://`` URL, is not remote.
    """
    return _scheme(location) in _SCHEMES


@dataclass(frozen=True, slots=True)
class _Location:
    kind: str
    """s3, gcs or azure"""
    fsspec_url: str
    """what fsspec opens: the URL less any endpoint part"""
    display: str
    """the URL for messages and logs"""
    key: str
    """what tells two caches apart: the display form and the endpoint"""
    options: dict[str, Any]
    """keyword arguments for the filesystem"""


def _refuse_credentials(kind: str, authority: str) -> None:
    userinfo, at, _ = authority.rpartition("@")
    # Azure's abfs://container@account.dfs.core.windows.net names a container before the @; a colon there
    # (user:password) is a secret everywhere, and a bucket name never holds an @.
    if at and (":" in userinfo or kind != "azure"):
        raise RemoteRepositoryError(
            "credentials in the repository URL are refused; set them in the environment or the "
            "standard credential files (for S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        )


def _env_endpoint() -> str | None:
    """The S3 endpoint that the AWS tools take from the environment, unless told to ignore it."""
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").strip().lower() == "true":
        return None
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _parse(url: str) -> _Location:
    scheme = _scheme(url)
    if scheme is None or scheme not in _SCHEMES:
        shown = f"'{scheme}://'" if scheme else "a path"
        raise RemoteRepositoryError(f"{shown} is not a remote repository; use s3://, gs:// or az://")
    kind = _SCHEMES[scheme]
    rest = url[len(scheme) + 3 :]
    endpoint_scheme = ""
    match = re.match(r"^(https?)://", rest, re.IGNORECASE) if kind == "s3" else None
    if match:
        endpoint_scheme = match.group(1).lower()
        rest = rest[match.end() :]
    _refuse_credentials(kind, rest.partition("/")[0])
    if "?" in rest or "#" in rest:
        raise RemoteRepositoryError(
            "the repository URL takes no query string or fragment; credentials and options come from the environment"
        )
    if kind == "s3":
        return _parse_s3(rest, endpoint_scheme)
    if kind == "azure":
        return _parse_azure(scheme, rest)
    path = rest.strip("/")
    if not path:
        raise RemoteRepositoryError("the repository URL names no bucket", f"{scheme}://")
    return _Location(kind, f"{scheme}://{path}", f"{scheme}://{path}", f"{scheme}://{path}", {})


def _parse_s3(rest: str, endpoint_scheme: str) -> _Location:
    """``bucket/path``, or Triton's ``host:port/bucket/path`` whose first part names the endpoint."""
    authority, _, path = rest.partition("/")
    if endpoint_scheme or ":" in authority:
        if not authority:
            raise RemoteRepositoryError("the S3 URL names an endpoint scheme but no host", f"s3://{endpoint_scheme}://")
        endpoint: str | None = f"{endpoint_scheme or 'http'}://{authority}"
        shown = f"s3://{endpoint_scheme + '://' if endpoint_scheme else ''}{authority}/"
    else:
        endpoint, shown, path = _env_endpoint(), "s3://", rest
    path = path.strip("/")
    if not path:
        raise RemoteRepositoryError("the repository URL names no bucket", shown)
    options: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    return _Location("s3", f"s3://{path}", shown + path, f"{shown}{path} {endpoint or ''}".rstrip(), options)


def _parse_azure(scheme: str, rest: str) -> _Location:
    """``container/path``, ``container@account.host/path``, or Triton's ``as://account/container/path``."""
    options: dict[str, Any] = {}
    env = os.environ
    if scheme == "as":
        account, _, rest = rest.partition("/")
        if not account:
            raise RemoteRepositoryError("the as:// URL names no storage account (as://account/container/path)")
        options["account_name"] = account
        shown, fsspec_scheme = f"as://{account}/", "az://"
    else:
        shown = fsspec_scheme = f"{scheme}://"
        named_in_url = "@" in rest.partition("/")[0]
        if not named_in_url and "AZURE_STORAGE_ACCOUNT_NAME" not in env and "AZURE_STORAGE_ACCOUNT" in env:
            options["account_name"] = env["AZURE_STORAGE_ACCOUNT"]  # Triton's name for it
    if "AZURE_STORAGE_ACCOUNT_KEY" not in env and "AZURE_STORAGE_KEY" in env:  # Triton's name for it
        options["account_key"] = env["AZURE_STORAGE_KEY"]
    path = rest.strip("/")
    if not path:
        raise RemoteRepositoryError("the repository URL names no container", shown)
    account = options.get("account_name") or env.get("AZURE_STORAGE_ACCOUNT_NAME", "")
    return _Location("azure", fsspec_scheme + path, shown + path, f"{shown}{path} {account}".rstrip(), options)


def default_cache_dir(url: str) -> Path:
    """The cache folder of ``url``: ``$MODELSVC_CACHE_DIR/repositories/<hash>`` (default ``~/.cache/modelsvc``)."""
    location = _parse(url)
    base = os.environ.get("MODELSVC_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = str(Path(xdg) / "modelsvc") if xdg else str(Path.home() / ".cache" / "modelsvc")
    digest = hashlib.sha256(location.key.encode()).hexdigest()[:16]
    return Path(base).expanduser() / "repositories" / digest


# --- the filesystem, as this module uses it -------------------------------------------------------------


class _FileSystem(Protocol):
    def find(self, path: str, *, detail: bool) -> dict[str, dict[str, Any]]: ...

    def get_file(self, rpath: str, lpath: str) -> None: ...

    def invalidate_cache(self, path: str | None = None) -> None: ...


def _open_filesystem(location: _Location, scheme: str) -> tuple[_FileSystem, str]:
    package, extra = _PACKAGES[location.kind]
    try:
        importlib.import_module(package)
        fsspec_core = importlib.import_module("fsspec.core")
    except ImportError as exc:
        raise RemoteRepositoryError(
            f"{scheme}:// repositories need the {package} package: pip install 'modelsvc[{extra}]' "
            f"(or pip install {package})"
        ) from exc
    try:
        fs, root = fsspec_core.url_to_fs(location.fsspec_url, skip_instance_cache=True, **location.options)
    except Exception as exc:  # a filesystem that rejects its settings; say so without a traceback
        raise RemoteRepositoryError(f"cannot open the store: {type(exc).__name__}: {exc}", location.display) from exc
    return cast(_FileSystem, fs), str(root).rstrip("/")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _store_error(exc: Exception, location: str, doing: str) -> RemoteRepositoryError:
    """The RemoteRepositoryError for an exception from the filesystem while ``doing`` something."""
    names = {type(e).__name__ for e in _chain(exc)}
    if "NoCredentialsError" in names or "DefaultCredentialsError" in names or "ClientAuthenticationError" in names:
        return RemoteAccessError(f"no credentials found while {doing}: {_env_hint(location)}", location)
    if isinstance(exc, PermissionError):
        return RemoteAccessError(f"access denied while {doing} ({exc}); {_env_hint(location)}", location)
    if isinstance(exc, FileNotFoundError):
        return RemoteNotFoundError(f"not found while {doing}: {exc}", location)
    return RemoteRepositoryError(f"{doing} failed: {type(exc).__name__}: {exc}", location)


def _env_hint(location: str) -> str:
    scheme = _scheme(location) or ""
    kind = _SCHEMES.get(scheme, "")
    if kind == "s3":
        return (
            "credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), "
            "or AWS_PROFILE with ~/.aws/credentials, or the machine's role"
        )
    if kind == "gcs":
        return "credentials come from GOOGLE_APPLICATION_CREDENTIALS or gcloud's application default credentials"
    return (
        "credentials come from AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_KEY, "
        "AZURE_STORAGE_SAS_TOKEN or the default Azure credential chain"
    )


def _content_tag(info: Mapping[str, Any]) -> str:
    """What identifies a file's content in a listing: a checksum or ETag, else its modification time."""
    for key in (*_CONTENT_KEYS, *_TIME_KEYS):
        value = info.get(key)
        if value:
            text = str(value).strip('"')
            return f"{key}={text}"
    return ""


def _safe_relative(rel: str) -> bool:
    """Whether a remote key, relative to the repository, can be written under the cache without escaping it."""
    parts = rel.split("/")
    return all(p not in ("", ".", "..") and "\x00" not in p and "\\" not in p for p in parts)


# --- atomic swap ------------------------------------------------------------------------------------------

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    func.restype = ctypes.c_int
    return cast(Callable[..., int], func)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux ``renameat2``); False where the system cannot."""
    func = _renameat2()
    if func is None:
        return False
    if func(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _replace_dir(new: Path, target: Path, work: Path) -> None:
    """Put directory ``new`` at ``target``; a reader of ``target`` sees the old tree or the new one."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    if not target.exists():
        new.rename(target)
        return
    if _exchange(new, target):
        return  # the old tree now sits at ``new``, inside ``work``, removed with it
    # without an atomic exchange the folder is missing between these two renames
    target.rename(work / "old")
    new.rename(target)


# --- the repository -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What one :meth:`RemoteRepository.sync` did to the local copy."""

    added: tuple[str, ...] = ()
    """model folders that appeared"""
    changed: tuple[str, ...] = ()
    """model folders whose files changed (swapped in whole)"""
    removed: tuple[str, ...] = ()
    """model folders that disappeared"""
    incomplete: tuple[str, ...] = ()
    """remote model folders held back: a config.pbtxt without version files, or files changing during the copy"""
    root_changed: bool = False
    """whether files at the repository's top level were written or deleted"""
    files_downloaded: int = 0
    bytes_downloaded: int = 0
    files_deleted: int = 0

    @property
    def models(self) -> tuple[str, ...]:
        """Every model folder that appeared, changed or disappeared, sorted: what a poll should look at."""
        return tuple(sorted({*self.added, *self.changed, *self.removed}))


@dataclass
class _Tally:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    root_changed: bool = False
    files_downloaded: int = 0
    bytes_downloaded: int = 0
    files_deleted: int = 0

    def result(self) -> SyncResult:
        return SyncResult(
            added=tuple(sorted(self.added)),
            changed=tuple(sorted(self.changed)),
            removed=tuple(sorted(self.removed)),
            incomplete=tuple(sorted(self.incomplete)),
            root_changed=self.root_changed,
            files_downloaded=self.files_downloaded,
            bytes_downloaded=self.bytes_downloaded,
            files_deleted=self.files_deleted,
        )


class _ChangedDuringSync(Exception):
    """A file vanished or changed size between the listing and its download."""


def _split(files: Mapping[str, _Entry]) -> tuple[dict[str, _Entry], dict[str, dict[str, _Entry]]]:
    """Top-level files, and the files of each top-level folder keyed by folder name."""
    root: dict[str, _Entry] = {}
    folders: dict[str, dict[str, _Entry]] = {}
    for rel, entry in files.items():
        top, slash, _ = rel.partition("/")
        if slash:
            folders.setdefault(top, {})[rel] = entry
        else:
            root[rel] = entry
    return root, folders


def _is_model(name: str, files: Mapping[str, _Entry]) -> bool:
    return f"{name}/{_CONFIG}" in files or any(_VERSION_RE.match(rel) for rel in files)


def _is_complete(name: str, files: Mapping[str, _Entry]) -> bool:
    """A folder with a config.pbtxt counts once one of its numeric version folders holds a file."""
    return f"{name}/{_CONFIG}" not in files or any(_VERSION_RE.match(rel) for rel in files)


class RemoteRepository:
    """A model repository in object storage, mirrored into a local folder that :attr:`path` names.

    ``url`` is one of the locations the module documentation lists; ``cache_dir`` is the folder this
    repository owns (default :func:`default_cache_dir`). Nothing is downloaded until :meth:`sync`.
    Constructing one checks the URL and the filesystem package, and raises RemoteRepositoryError.
    """

    def __init__(self, url: str, cache_dir: Path | None = None) -> None:
        location = _parse(url)
        self.url = location.display
        """the location as messages show it (never with credentials)"""
        self._key = location.key
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(url)
        self._fs, self._root = _open_filesystem(location, _scheme(url) or "")
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        """The local repository root, ``<cache_dir>/models``: what ModelRepository reads."""
        return self.cache_dir / "models"

    @property
    def _manifest_path(self) -> Path:
        return self.cache_dir / "manifest.json"

    @property
    def _staging(self) -> Path:
        return self.cache_dir / "staging"

    def __repr__(self) -> str:
        return f"RemoteRepository({self.url!r}, cache_dir={str(self.cache_dir)!r})"

    # --- sync ---

    def sync(self, *, allow_empty: bool = False) -> SyncResult:
        """Bring the local copy in line with the remote tree; returns which model folders changed.

        Blocking (run it in a thread from async code). Raises RemoteNotFoundError when the bucket or
        prefix is missing and NoModelsError when no complete model is found, both before anything
        local changes, unless ``allow_empty`` (a poll, where emptying the bucket unloads every model).
        An error in the middle leaves every model folder either as it was or fully updated.
        """
        try:
            with self._lock, self._locked():
                return self._sync(allow_empty)
        except OSError as exc:  # the local side: a full disk, a cache folder that is not writable
            raise RemoteRepositoryError(f"cannot update the local copy in {self.cache_dir}: {exc}", self.url) from exc

    def _sync(self, allow_empty: bool) -> SyncResult:
        remote = self._list()
        if not remote and not allow_empty:
            raise RemoteNotFoundError("nothing is stored under this prefix", self.url)
        root_files, folders = _split(remote)
        complete = {n for n, files in folders.items() if _is_complete(n, files)}
        if not allow_empty and not any(_is_model(n, folders[n]) for n in complete):
            held = sorted(n for n in folders if n not in complete)
            detail = f" (held back until their version files arrive: {', '.join(held)})" if held else ""
            raise NoModelsError(
                f"no model folders here (a folder with config.pbtxt or a numeric version folder){detail}",
                self.url,
            )
        return self._apply(root_files, folders, complete)

    def _list(self) -> dict[str, _Entry]:
        """Every remote file under the prefix, relative to it, with its size and content tag."""
        self._fs.invalidate_cache()
        try:
            listing = self._fs.find(self._root, detail=True)
        except Exception as exc:
            raise _store_error(exc, self.url, "listing the repository") from exc
        files: dict[str, _Entry] = {}
        base = self._root + "/" if self._root else ""
        for name, info in listing.items():
            if info.get("type", "file") != "file" or name.endswith("/"):
                continue  # folder markers: a folder exists here once a file does
            if name == self._root:
                raise RemoteRepositoryError("this names a file, not a folder of models", self.url)
            if not name.startswith(base):
                continue
            rel = name[len(base) :]
            if not _safe_relative(rel):
                logger.warning("%s: skipping %r, a name that cannot be stored locally", self.url, rel)
                continue
            files[rel] = (int(info.get("size") or 0), _content_tag(info))
        # S3 allows both "a" and "a/b"; a local folder cannot be a file too: the folder wins
        folders = {rel.rsplit("/", i)[0] for rel in files for i in range(1, rel.count("/") + 1)}
        for rel in sorted(folders & files.keys()):
            logger.warning("%s: skipping the file %r, a folder of that name exists", self.url, rel)
            del files[rel]
        return files

    def _apply(
        self, root_files: dict[str, _Entry], folders: dict[str, dict[str, _Entry]], complete: set[str]
    ) -> SyncResult:
        tally = _Tally()
        self.path.mkdir(parents=True, exist_ok=True)
        known = self._local_state()  # updated in place as the steps go, and saved after each
        self._remove_gone(root_files, folders, known, tally)
        self._update_root_files(root_files, known, tally)
        self._update_folders(folders, complete, known, tally)
        return tally.result()

    def _remove_gone(
        self, root_files: Mapping[str, _Entry], folders: Mapping[str, object], known: dict[str, _Entry], tally: _Tally
    ) -> None:
        """Delete local folders and top-level files that the bucket no longer has (strays too)."""
        for child in sorted(self.path.iterdir()):
            name = child.name
            if child.is_dir() and not child.is_symlink():
                if name in folders:
                    continue
                self._remove_dir(child)
                tally.removed.append(name)
                tally.files_deleted += len(_forget(known, name))
                logger.info("%s: model %s removed", self.url, name)
            elif name not in root_files:
                child.unlink()
                known.pop(name, None)
                tally.root_changed = True
                tally.files_deleted += 1
            else:
                continue
            self._save(known)

    def _update_root_files(self, root_files: Mapping[str, _Entry], known: dict[str, _Entry], tally: _Tally) -> None:
        """Download new or changed top-level files, each put in place with one rename."""
        for name, entry in sorted(root_files.items()):
            if known.get(name) == entry:
                continue
            target = self.path / name
            with self._work() as work:
                try:
                    self._download(name, entry, work / name)
                except _ChangedDuringSync:
                    logger.info("%s: %s changed during the download; taken on the next sync", self.url, name)
                    continue
                if target.is_dir() and not target.is_symlink():
                    self._remove_dir(target)
                os.replace(work / name, target)
            known[name] = entry
            tally.root_changed = True
            tally.files_downloaded += 1
            tally.bytes_downloaded += entry[0]
            self._save(known)

    def _update_folders(
        self,
        folders: Mapping[str, Mapping[str, _Entry]],
        complete: set[str],
        known: dict[str, _Entry],
        tally: _Tally,
    ) -> None:
        """Rebuild each new or changed folder in staging and swap it in whole; hold back incomplete ones."""
        for name, files in sorted(folders.items()):
            if name not in complete:
                tally.incomplete.append(name)
                logger.info("%s: model %s has a config.pbtxt but no version files yet; held back", self.url, name)
                continue
            mine = {rel: e for rel, e in known.items() if rel.startswith(f"{name}/")}
            existed = (self.path / name).is_dir()
            if mine == files and existed:
                continue
            try:
                count, size = self._replace_folder(name, files, mine)
            except _ChangedDuringSync as exc:
                tally.incomplete.append(name)
                logger.info("%s: %s changed during the download; taken on the next sync", self.url, exc)
                continue
            (tally.changed if existed else tally.added).append(name)
            tally.files_deleted += len(mine.keys() - files.keys())
            tally.files_downloaded += count
            tally.bytes_downloaded += size
            _forget(known, name)
            known.update(files)
            self._save(known)
            verb = "updated" if existed else "added"
            logger.info("%s: model %s %s (%d files downloaded, %d bytes)", self.url, name, verb, count, size)

    def _replace_folder(self, name: str, files: Mapping[str, _Entry], mine: Mapping[str, _Entry]) -> tuple[int, int]:
        """Build folder ``name`` in staging (unchanged files linked, others downloaded) and swap it in."""
        count = size = 0
        with self._work() as work:
            new = work / "new"
            new.mkdir()
            for rel, entry in sorted(files.items()):
                dest = new / rel.partition("/")[2]
                dest.parent.mkdir(parents=True, exist_ok=True)
                if mine.get(rel) == entry and _link(self.path / rel, dest):
                    continue
                self._download(rel, entry, dest)
                count += 1
                size += entry[0]
            _replace_dir(new, self.path / name, work)
        return count, size

    def _download(self, rel: str, entry: _Entry, dest: Path) -> None:
        remote = f"{self._root}/{rel}" if self._root else rel
        try:
            self._fs.get_file(remote, str(dest))
        except FileNotFoundError as exc:
            raise _ChangedDuringSync(rel) from exc
        except Exception as exc:
            raise _store_error(exc, self.url, f"downloading {rel}") from exc
        if dest.stat().st_size != entry[0]:
            raise _ChangedDuringSync(rel)

    # --- local state ---

    def _local_state(self) -> dict[str, _Entry]:
        """The manifest's files that are still on disk with their recorded size; the rest counts as missing."""
        try:
            data = json.loads(self._manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != _MANIFEST_FORMAT or data.get("key") != self._key:
            return {}
        state: dict[str, _Entry] = {}
        for rel, value in dict(data.get("files") or {}).items():
            try:
                size, tag = int(value[0]), str(value[1])
                on_disk = (self.path / rel).stat()
            except (OSError, ValueError, TypeError, IndexError):
                continue
            if on_disk.st_size == size and _safe_relative(rel):
                state[rel] = (size, tag)
        return state

    def _save(self, files: Mapping[str, _Entry]) -> None:
        data = {
            "format": _MANIFEST_FORMAT,
            "url": self.url,
            "key": self._key,
            "files": {rel: list(e) for rel, e in sorted(files.items())},
        }
        tmp = self._manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=0), encoding="utf-8")
        os.replace(tmp, self._manifest_path)

    def _remove_dir(self, path: Path) -> None:
        """Make ``path`` disappear in one rename, then delete it."""
        with self._work() as work:
            path.rename(work / "gone")

    @contextlib.contextmanager
    def _work(self) -> Iterator[Path]:
        """A scratch folder in staging (same filesystem as the copy, so renames are atomic), removed after."""
        work = Path(tempfile.mkdtemp(dir=self._staging))
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the cache's file lock; clear what an interrupted sync left in staging."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with open(self.cache_dir / "lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                shutil.rmtree(self._staging, ignore_errors=True)
                self._staging.mkdir()
                (self.cache_dir / "location").write_text(self.url + "\n", encoding="utf-8")
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _forget(known: dict[str, _Entry], folder: str) -> list[str]:
    """Drop the entries under ``folder/`` from ``known``; returns them."""
    gone = [rel for rel in known if rel.startswith(f"{folder}/")]
    for rel in gone:
        del known[rel]
    return gone


def _link(source: Path, dest: Path) -> bool:
    """Hard-link an unchanged file into staging (a copy where links fail); False when the source is gone."""
    try:
        os.link(source, dest)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        try:
            shutil.copy2(source, dest)
        except OSError:
            return False
        return True
