"""The remote tree as a listing shows it, in pure functions: what identifies a file's content, which keys
can be stored locally, which top-level folders are models, and which are held back as half-uploaded.

Change detection: a file is taken as changed when its size or its content tag differs from the one
recorded at its download. The tag is the first of a checksum or ETag that the listing carries (each
provider's module says which its store offers), else a modification time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["Entry", "content_tag", "forget", "is_complete", "is_model", "safe_relative", "split"]

_VERSION_RE = re.compile(r"^[^/]+/\d+/.")
#: listing keys that identify a file's content, best first; then keys that only date it
_CONTENT_KEYS = ("md5Hash", "crc32c", "ETag", "etag")
_TIME_KEYS = ("LastModified", "last_modified", "updated", "mtime", "generation")
_CONFIG = "config.pbtxt"

#: a file as the remote listing describes it: (size in bytes, content tag)
Entry = tuple[int, str]


def content_tag(info: Mapping[str, Any]) -> str:
    """What identifies a file's content in a listing: a checksum or ETag, else its modification time."""
    for key in (*_CONTENT_KEYS, *_TIME_KEYS):
        value = info.get(key)
        if value:
            text = str(value).strip('"')
            return f"{key}={text}"
    return ""


def safe_relative(rel: str) -> bool:
    """Whether a remote key, relative to the repository, can be written under the cache without escaping it."""
    parts = rel.split("/")
    return all(p not in ("", ".", "..") and "\x00" not in p and "\\" not in p for p in parts)


def split(files: Mapping[str, Entry]) -> tuple[dict[str, Entry], dict[str, dict[str, Entry]]]:
    """Top-level files, and the files of each top-level folder keyed by folder name."""
    root: dict[str, Entry] = {}
    folders: dict[str, dict[str, Entry]] = {}
    for rel, entry in files.items():
        top, slash, _ = rel.partition("/")
        if slash:
            folders.setdefault(top, {})[rel] = entry
        else:
            root[rel] = entry
    return root, folders


def is_model(name: str, files: Mapping[str, Entry]) -> bool:
    return f"{name}/{_CONFIG}" in files or any(_VERSION_RE.match(rel) for rel in files)


def is_complete(name: str, files: Mapping[str, Entry]) -> bool:
    """A folder with a config.pbtxt counts once one of its numeric version folders holds a file."""
    return f"{name}/{_CONFIG}" not in files or any(_VERSION_RE.match(rel) for rel in files)


def forget(known: dict[str, Entry], folder: str) -> list[str]:
    """Drop the entries under ``folder/`` from ``known``; returns them."""
    gone = [rel for rel in known if rel.startswith(f"{folder}/")]
    for rel in gone:
        del known[rel]
    return gone

