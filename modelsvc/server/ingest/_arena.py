"""A shared-memory arena: a file in /dev/shm mapped by its owner (who writes and frees) and by its peer (who reads).

The owner ``put``s a tensor's bytes into a free block (one copy, by numpy in C) and names the block in a message;
the peer maps the same file once (``ArenaView``) and reads the block in place. A block is freed when the peer says
it is done (an input, once the request's final reply came; an output, once the worker wrote it out). Blocks are
first-fit from a free list kept sorted by offset and merged with their neighbours; when none fits, ``put`` answers
None and the tensor goes inline in the frame instead.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import secrets
import tempfile
from pathlib import Path

import numpy as np

from ._wire import Arena

ALIGN = 64


def _folder() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class OwnedArena(Arena):
    """The arena this process writes into."""

    def __init__(self, size: int, prefix: str = "modelsvc") -> None:
        self.size = size
        self.path = _folder() / f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._array = np.frombuffer(self._map, dtype=np.uint8)
        self._free: list[tuple[int, int]] = [(0, size)]  # (offset, length), sorted by offset
        self.in_use = 0

    def put(self, data: memoryview) -> tuple[int, int] | None:
        need = data.nbytes
        rounded = (need + ALIGN - 1) // ALIGN * ALIGN
        for i, (offset, length) in enumerate(self._free):
            if length >= rounded:
                if length == rounded:
                    del self._free[i]
                else:
                    self._free[i] = (offset + rounded, length - rounded)
                self._array[offset : offset + need] = np.frombuffer(data, dtype=np.uint8)
                self.in_use += rounded
                return (offset, need)
        return None

    def view(self, block: tuple[int, int]) -> memoryview:
        offset, length = block
        return memoryview(self._map)[offset : offset + length]

    def free(self, block: tuple[int, int]) -> None:
        offset, need = block
        length = (need + ALIGN - 1) // ALIGN * ALIGN
        self.in_use -= length
        i = bisect.bisect_left(self._free, (offset, 0))
        if i < len(self._free) and self._free[i][0] == offset + length:  # merge with the next
            length += self._free[i][1]
            del self._free[i]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:  # and with the previous
            offset, length = self._free[i - 1][0], self._free[i - 1][1] + length
            del self._free[i - 1]
            i -= 1
        self._free.insert(i, (offset, length))

    def unlink(self) -> None:
        """Remove the file; the mappings stay valid (both sides unlink once both have mapped it)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class ArenaView(Arena):
    """The peer's arena, mapped to read its blocks."""

    def __init__(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)

    def view(self, block: tuple[int, int]) -> memoryview:
        offset, length = block
        return memoryview(self._map)[offset : offset + length]
