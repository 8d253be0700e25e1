"""Mirroring a remote repository into its local cache folder: :class:`RemoteRepository` and its sync.

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
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ._errors import NoModelsError, RemoteNotFoundError, RemoteRepositoryError
from ._locations import default_cache_dir, parse
from ._swap import link, replace_dir
from ._tree import Entry, content_tag, forget, is_complete, is_model, safe_relative, split

__all__ = ["RemoteRepository", "SyncResult"]

logger = logging.getLogger("modelsvc.repository")

_MANIFEST_FORMAT = 1


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


class RemoteRepository:
    """A model repository in object storage, mirrored into a local folder that :attr:`path` names.

    ``url`` is one of the locations this package's documentation lists; ``cache_dir`` is the folder this
    repository owns (default :func:`default_cache_dir`). Nothing is downloaded until :meth:`sync`.
    Constructing one checks the URL and the filesystem package, and raises RemoteRepositoryError.
    """

    def __init__(self, url: str, cache_dir: Path | None = None) -> None:
        location = parse(url)
        self.url = location.display
        """the location as messages show it (never with credentials)"""
        self._key = location.key
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(url)
        self._provider = location.provider
        self._fs, self._root = location.provider.open(location)
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
        root_files, folders = split(remote)
        complete = {n for n, files in folders.items() if is_complete(n, files)}
        if not allow_empty and not any(is_model(n, folders[n]) for n in complete):
            held = sorted(n for n in folders if n not in complete)
            detail = f" (held back until their version files arrive: {', '.join(held)})" if held else ""
            raise NoModelsError(
                f"no model folders here (a folder with config.pbtxt or a numeric version folder){detail}",
                self.url,
            )
        return self._apply(root_files, folders, complete)

    def _list(self) -> dict[str, Entry]:
        """Every remote file under the prefix, relative to it, with its size and content tag."""
        self._fs.invalidate_cache()
        try:
            listing = self._fs.find(self._root, detail=True)
        except Exception as exc:
            raise self._provider.error(exc, self.url, "listing the repository") from exc
        files: dict[str, Entry] = {}
        base = self._root + "/" if self._root else ""
        for name, info in listing.items():
            if info.get("type", "file") != "file" or name.endswith("/"):
                continue  # folder markers: a folder exists here once a file does
            if name == self._root:
                raise RemoteRepositoryError("this names a file, not a folder of models", self.url)
            if not name.startswith(base):
                continue
            rel = name[len(base) :]
            if not safe_relative(rel):
                logger.warning("%s: skipping %r, a name that cannot be stored locally", self.url, rel)
                continue
            files[rel] = (int(info.get("size") or 0), content_tag(info))
        # S3 allows both "a" and "a/b"; a local folder cannot be a file too: the folder wins
        folders = {rel.rsplit("/", i)[0] for rel in files for i in range(1, rel.count("/") + 1)}
        for rel in sorted(folders & files.keys()):
            logger.warning("%s: skipping the file %r, a folder of that name exists", self.url, rel)
            del files[rel]
        return files

    def _apply(
        self, root_files: dict[str, Entry], folders: dict[str, dict[str, Entry]], complete: set[str]
    ) -> SyncResult:
        tally = _Tally()
        self.path.mkdir(parents=True, exist_ok=True)
        known = self._local_state()  # updated in place as the steps go, and saved after each
        self._remove_gone(root_files, folders, known, tally)
        self._update_root_files(root_files, known, tally)
        self._update_folders(folders, complete, known, tally)
        return tally.result()

    def _remove_gone(
        self, root_files: Mapping[str, Entry], folders: Mapping[str, object], known: dict[str, Entry], tally: _Tally
    ) -> None:
        """Delete local folders and top-level files that the bucket no longer has (strays too)."""
        for child in sorted(self.path.iterdir()):
            name = child.name
            if child.is_dir() and not child.is_symlink():
                if name in folders:
                    continue
                self._remove_dir(child)
                tally.removed.append(name)
                tally.files_deleted += len(forget(known, name))
                logger.info("%s: model %s removed", self.url, name)
            elif name not in root_files:
                child.unlink()
                known.pop(name, None)
                tally.root_changed = True
                tally.files_deleted += 1
            else:
                continue
            self._save(known)

    def _update_root_files(self, root_files: Mapping[str, Entry], known: dict[str, Entry], tally: _Tally) -> None:
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
        folders: Mapping[str, Mapping[str, Entry]],
        complete: set[str],
        known: dict[str, Entry],
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
            forget(known, name)
            known.update(files)
            self._save(known)
            verb = "updated" if existed else "added"
            logger.info("%s: model %s %s (%d files downloaded, %d bytes)", self.url, name, verb, count, size)

    def _replace_folder(self, name: str, files: Mapping[str, Entry], mine: Mapping[str, Entry]) -> tuple[int, int]:
        """Build folder ``name`` in staging (unchanged files linked, others downloaded) and swap it in."""
        count = size = 0
        with self._work() as work:
            new = work / "new"
            new.mkdir()
            for rel, entry in sorted(files.items()):
                dest = new / rel.partition("/")[2]
                dest.parent.mkdir(parents=True, exist_ok=True)
                if mine.get(rel) == entry and link(self.path / rel, dest):
                    continue
                self._download(rel, entry, dest)
                count += 1
                size += entry[0]
            replace_dir(new, self.path / name, work)
        return count, size

    def _download(self, rel: str, entry: Entry, dest: Path) -> None:
        remote = f"{self._root}/{rel}" if self._root else rel
        try:
            self._fs.get_file(remote, str(dest))
        except FileNotFoundError as exc:
            raise _ChangedDuringSync(rel) from exc
        except Exception as exc:
            raise self._provider.error(exc, self.url, f"downloading {rel}") from exc
        if dest.stat().st_size != entry[0]:
            raise _ChangedDuringSync(rel)

    # --- local state ---

    def _local_state(self) -> dict[str, Entry]:
        """The manifest's files that are still on disk with their recorded size; the rest counts as missing."""
        try:
            data = json.loads(self._manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != _MANIFEST_FORMAT or data.get("key") != self._key:
            return {}
        state: dict[str, Entry] = {}
        for rel, value in dict(data.get("files") or {}).items():
            try:
                size, tag = int(value[0]), str(value[1])
                on_disk = (self.path / rel).stat()
            except (OSError, ValueError, TypeError, IndexError):
                continue
            if on_disk.st_size == size and safe_relative(rel):
                state[rel] = (size, tag)
        return state

    def _save(self, files: Mapping[str, Entry]) -> None:
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

