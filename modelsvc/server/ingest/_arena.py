"""A shared-memory arena: anonymous memory (``memfd``) the engine makes for each worker and direction, mapped by its
owner (who writes and frees) and by its peer (who reads).

The engine creates both of a worker's arenas and hands their file descriptors to the worker when it starts it
(inputs: the worker writes, the engine reads; outputs: the other way). No file is ever named, so nothing is left
behind when a process dies, and no tmpfs limit (a container's 64 MiB /dev/shm) applies: the pages count against the
pod's memory as they are first written. The owner ``put``s a tensor's bytes into a free block (one copy, by numpy in
C) and names the block in a message; the peer reads it in place. A block is freed when the peer says it is done (an
input, once the request's final reply came; an output, once the worker copied it out). Blocks are first-fit from a
free list kept sorted by offset and merged with their neighbours; when none fits, ``put`` answers None and the tensor
goes inline in the frame instead.
"""

from __future__ import annotations

import bisect
import mmap
import os

import numpy as np

from ._wire import Arena

ALIGN = 64


def memfd(size: int, name: str = "modelsvc-ingest") -> int:
    """A new anonymous shared-memory file of ``size`` bytes (its descriptor is inheritable by a child)."""
    fd = os.memfd_create(name, 0)
    os.ftruncate(fd, size)
    return fd


class OwnedArena(Arena):
    """The arena this process writes into, on ``fd`` (a new one when None)."""

    def __init__(self, size: int, fd: int | None = None) -> None:
        self.size = size
        self.fd = memfd(size) if fd is None else fd
        self._map = mmap.mmap(self.fd, size)
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

    def close_fd(self) -> None:
        """Close the descriptor (once the peer has its own); the mapping stays."""
        os.close(self.fd)


class ArenaView(Arena):
    """The peer's arena, mapped to read its blocks."""

    def __init__(self, fd: int, size: int) -> None:
        self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ)

    def view(self, block: tuple[int, int]) -> memoryview:
        offset, length = block
        return memoryview(self._map)[offset : offset + length]
