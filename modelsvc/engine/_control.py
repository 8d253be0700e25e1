"""Model control at run time: the repository poller of ``--model-control-mode poll``.

Every ``--repository-poll-secs`` seconds the poller refreshes the local copy of a remote repository (an
error is logged and serving goes on with the copy as it is), then asks the model manager to bring the
loaded models in line with the folder: new complete folders load, changed ones reload, removed ones
unload. One poll runs at a time; the next starts an interval after the previous one ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..repository import RemoteRepository
from ._models import ModelManager

logger = logging.getLogger("modelsvc.models")


class RepositoryPoller:
    """Polls ``models``' repository every ``interval_s`` seconds once started, until stopped."""

    def __init__(self, models: ModelManager, interval_s: float, remote: RemoteRepository | None = None) -> None:
        self.models = models
        self.interval_s = interval_s
        self.remote = remote
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop polling; a poll under way is cancelled (each model's load finishes or leaves it as it was)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def poll_once(self) -> None:
        """One poll: refresh the remote copy (if any), then load, reload and unload what changed."""
        if self.remote is not None:
            try:
                result = await asyncio.to_thread(self.remote.sync, allow_empty=True)
            except Exception as exc:  # RemoteRepositoryError, or a fault below it: keep serving what we have
                logger.error("refreshing the model repository failed, serving the copy as it is: %s", exc)
            else:
                if result.models:
                    logger.info("model repository refreshed: %s changed", ", ".join(result.models))
        await self.models.poll(settle=self.remote is None)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except Exception:
                logger.exception("polling the model repository failed; trying again in %g s", self.interval_s)
