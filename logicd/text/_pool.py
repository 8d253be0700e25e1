"""Tokenization off the event loop: a thread pool sized from the CPU count.

Threads, not processes: the Rust tokenizer releases the GIL for the whole batch call (and spreads a batch over
its own rayon threads), so a thread keeps the event loop responsive and costs nothing to hand over, while a
process pool would pickle every text in and every id array out (see loadtests/bench_text.py for the figures).
The Python windowing after the call holds the GIL, but takes a few percent of the time.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

from ._chunking import Chunker, Chunks

__all__ = ["TokenizerPool", "tokenize_async"]


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class TokenizerPool:
    """A thread pool that runs `Chunker.chunk` so that a long document never stalls the event loop.

    ``max_workers`` defaults to the number of CPUs this process may use. Use as a (async) context manager,
    or call `shutdown` when done.
    """

    def __init__(self, max_workers: int | None = None) -> None:
        workers = max_workers if max_workers is not None else _cpu_count()
        if workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {workers}")
        self._max_workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="logicd-tokenize")

    @property
    def max_workers(self) -> int:
        """Number of threads."""
        return self._max_workers

    async def chunk(self, chunker: Chunker, texts: Sequence[str]) -> Chunks:
        """``chunker.chunk(texts)`` on a pool thread; the event loop keeps serving other tasks meanwhile."""
        if isinstance(texts, str):
            raise TypeError("chunk() takes a sequence of texts, not one string")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, chunker.chunk, list(texts))

    def shutdown(self, wait: bool = True) -> None:
        """Stop the threads (after the queued work when ``wait``)."""
        self._executor.shutdown(wait=wait)

    def __enter__(self) -> TokenizerPool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    async def __aenter__(self) -> TokenizerPool:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"TokenizerPool(max_workers={self._max_workers})"


_default_pool: TokenizerPool | None = None
_default_lock = threading.Lock()


def _shared_pool() -> TokenizerPool:
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = TokenizerPool()
        return _default_pool


async def tokenize_async(chunker: Chunker, texts: Sequence[str], *, pool: TokenizerPool | None = None) -> Chunks:
    """Chunk ``texts`` off the event loop, on ``pool`` or on a process-wide pool sized from the CPU count."""
    return await (pool or _shared_pool()).chunk(chunker, texts)
