"""Swapping a model folder in whole: a reader of the local copy sees the old tree or the new one, never a mix.

Linux's ``renameat2(RENAME_EXCHANGE)`` swaps two directories in one step; where the system lacks it the
folder is missing for the moment between two renames. Unchanged files reach the staged folder as hard links.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import cast

__all__ = ["link", "replace_dir"]

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


def replace_dir(new: Path, target: Path, work: Path) -> None:
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


def link(source: Path, dest: Path) -> bool:
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
