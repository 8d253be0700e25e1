"""mypy runs in the tests start from the project's own cache, where there is one."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

from tests._server import ROOT


def copy_of_the_projects_mypy_cache(dest: Path) -> Path:
    """``dest``, a copy of the project's own mypy cache where there is one (CI runs mypy before the tests).

    mypy reuses a cached module only if the options that affect the cache are the same (``strict``,
    ``warn_unreachable``, ``follow_imports``, ...) and its source did not change: a run whose config matches the
    project's for the standard library, numpy and the rest analyses only its own files (seen here: 96 s cold, 6 s
    from the copy, on a loaded machine). The findings are those of a cold run. SQLite files are copied with
    SQLite's backup, safe while another mypy writes them."""
    source = ROOT / ".mypy_cache"
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.rglob("*")) if source.is_dir() else []:
        target = dest / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.suffix == ".db":
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            with closing(db), closing(sqlite3.connect(target)) as copy:
                db.backup(copy)
        elif path.suffix not in (".lock", ".tmp"):
            shutil.copyfile(path, target)
    return dest
