"""The engine's ingest workers: how many (``--workers``), their private folder, starting, restarting and draining.

``Ingest`` is what ``modelsvc serve --workers N`` adds to the engine process: a folder only this pod's processes can
enter (mode 0700) with the channel's socket and the engine's own HTTP and gRPC doors on Unix sockets, and N worker
processes (``python -m modelsvc.server.ingest``) that share the public ports. A worker that exits while the server
runs is started again; on shutdown every worker is asked to drain (SIGTERM) before the engine closes its models.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric

from ._arena import ArenaView, OwnedArena, memfd
from ._engine import EngineChannel

if TYPE_CHECKING:
    from ...engine import DataPlane
    from .._options import ServeOptions
    from ..grpc import H2Limits

logger = logging.getLogger("modelsvc.ingest")

START_TIMEOUT_S = 60
"""How long ``start`` waits for every worker to open its ports."""

RESTART_BACKOFF_S = 1.0
"""A worker that exits within this long of its start, or drains and exits on a signal, is started again only after
this long (no restart storm; the engine's own signal comes first)."""


def available_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> float:
    """The CPUs this process may use: its affinity, capped by a cgroup quota (a pod's CPU limit) when set: v2's
    ``cpu.max``, or v1's ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    cpus = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        quota, period = _cgroup_v1_quota(cgroup)
    with contextlib.suppress(ValueError, ZeroDivisionError):
        if quota not in ("max", "-1") and int(quota) > 0:
            cpus = min(cpus, int(quota) / int(period))
    return cpus


def _cgroup_v1_quota(cgroup: Path) -> tuple[str, str]:
    for folder in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        with contextlib.suppress(OSError):
            quota = (cgroup / folder / "cpu.cfs_quota_us").read_text().strip()
            return quota, (cgroup / folder / "cpu.cfs_period_us").read_text().strip()
    return "max", "100000"


def resolve_workers(value: str, cpus: float | None = None) -> int:
    """``--workers``: a count, or ``auto``: none (one process, no channel) with 2 CPUs or fewer, else one worker
    per CPU but the engine's."""
    if value != "auto":
        return int(value)
    cpus = available_cpus() if cpus is None else cpus
    return 0 if cpus <= 2 else max(1, int(cpus) - 1)


@dataclass(slots=True)
class WorkerSpec:
    """What a worker needs to know, handed to it as a pickle in the private folder."""

    options: ServeOptions
    channel: str
    http_socket: str
    grpc_socket: str
    arena_bytes: int
    tracing: bool


class Ingest:
    """The ingest workers of one engine."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.count = options.workers
        self.folder = Path(tempfile.mkdtemp(prefix="modelsvc-ingest-"))
        self.channel_path = str(self.folder / "channel.sock")
        self.http_socket = str(self.folder / "http.sock")
        self.grpc_socket = str(self.folder / "grpc.sock")
        self.channel: EngineChannel | None = None
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.restarts = 0
        self.stopping = False
        self.failed: str | None = None
        """Why ``start`` fails: a worker exited before every worker served its ports (as one process that cannot
        open its endpoints exits, rather than starting it again and again)."""
        self._serving = False
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self, dataplane: DataPlane) -> None:
        """Open the channel, start the workers, and wait until each has reached the engine."""
        self.channel = EngineChannel(dataplane, self.channel_path)
        await self.channel.start()
        spec = WorkerSpec(
            self.options,
            self.channel_path,
            self.http_socket,
            self.grpc_socket,
            self.options.ingest_arena_bytes,
            dataplane.tracing is not None,
        )
        spec_path = self.folder / "worker.pickle"
        spec_path.write_bytes(pickle.dumps(spec))
        started = [asyncio.get_running_loop().create_future() for _ in range(self.count)]
        self._watchers = [asyncio.ensure_future(self._watch(i, spec_path, started[i])) for i in range(self.count)]
        await asyncio.gather(*started)
        channel = self.channel
        deadline = time.monotonic() + START_TIMEOUT_S
        while channel.listening < self.count and (left := deadline - time.monotonic()) > 0 and not self.failed:
            channel.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(channel.changed.wait(), left)
        if self.failed:
            raise OSError(self.failed)
        self._serving = True
        if channel.listening < self.count:
            late = (channel.listening, self.count, START_TIMEOUT_S)
            logger.warning("%d of %d ingest workers listening after %d s", *late)

    async def _watch(self, index: int, spec_path: Path, started: asyncio.Future[None]) -> None:
        assert self.channel is not None
        size = self.options.ingest_arena_bytes
        while not self._stopped():
            began = time.monotonic()
            # fresh arenas for each life of the worker: nothing of a dead one's blocks is taken for free
            inputs, outputs = memfd(size), OwnedArena(size)
            self.channel.arenas[index] = (ArenaView(inputs, size), outputs)
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "modelsvc.server.ingest", str(spec_path), str(index), str(inputs),
                    str(outputs.fd), pass_fds=(inputs, outputs.fd),
                )  # fmt: skip
            except OSError as exc:  # no process (no such interpreter, no processes left)
                if not self._serving:  # the start fails, as the server's when it cannot open its endpoints
                    if not started.done():
                        started.set_exception(OSError(f"ingest worker {index} cannot be started: {exc}"))
                    return
                logger.error("ingest worker %d cannot be started again: %s", index, exc)
                await asyncio.sleep(RESTART_BACKOFF_S)
                continue
            finally:
                os.close(inputs)  # the mappings stay; the child has its own descriptors
                outputs.close_fd()
            self.procs[index] = proc
            if not started.done():
                started.set_result(None)
            code = await proc.wait()
            if self._stopped():
                return
            if not self._serving:
                self.failed = f"ingest worker {index} exited with {code} before the workers served their ports"
                self.channel.changed.set()
                return
            if code == 0 or time.monotonic() - began < RESTART_BACKOFF_S:
                # died young; or drained on a signal (a terminal's Ctrl-C reaches the whole process group): the
                # engine's own may be handled a moment later, and then it is not started again
                await asyncio.sleep(RESTART_BACKOFF_S)
                if self._stopped():
                    return
            self.restarts += 1
            logger.warning("ingest worker %d (pid %d) exited with %s; starting it again", index, proc.pid, code)

    @property
    def door_limits(self) -> H2Limits:
        """The bounds of the engine's own gRPC door: each worker forwards all its clients' calls there over one
        connection, so the per-connection caps a client has (enforced by the worker's public door) do not apply."""
        unbounded = 2**31 - 1
        return replace(self.options.grpc_limits, max_concurrent_streams=unbounded, max_reset_streams=unbounded)

    def _stopped(self) -> bool:
        return self.stopping

    async def stop(self, grace_s: float) -> None:
        """Every worker drains (its read requests answered, up to ``grace_s``) and exits; then the channel closes."""
        self.stopping = True
        for proc in self.procs.values():
            _signal(proc, signal.SIGTERM)
        waits = [asyncio.ensure_future(p.wait()) for p in self.procs.values()]
        if waits:
            _, late = await asyncio.wait(waits, timeout=grace_s + 5)
            for proc in self.procs.values():
                if proc.returncode is None:
                    _signal(proc, signal.SIGKILL)
            if late:
                await asyncio.wait(late, timeout=5)
        for watcher in self._watchers:
            watcher.cancel()
        if self.channel is not None:
            await self.channel.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def families(self) -> list[Metric]:
        """The workers' metrics (modelsvc's own): how many are connected, the calls each sent, the restarts."""
        connected = Metric("modelsvc_ingest_workers", "Ingest worker processes serving the ports", "gauge")
        connected.add_sample(connected.name, {}, float(self.channel.listening if self.channel else 0))
        calls = Metric("modelsvc_ingest_requests", "Inference requests the engine received from each ingest worker",
                       "counter")  # fmt: skip
        for index, count in sorted((self.channel.calls if self.channel else {}).items()):
            calls.add_sample(calls.name, {"worker": str(index)}, float(count))
        restarts = Metric("modelsvc_ingest_worker_restarts", "Ingest workers started again after they exited",
                          "counter")  # fmt: skip
        restarts.add_sample(restarts.name, {}, float(self.restarts))
        return [connected, calls, restarts]

    def kill(self) -> None:
        """A second signal: the workers close their connections now."""
        self.stopping = True
        for proc in self.procs.values():
            _signal(proc, signal.SIGKILL)


def _signal(proc: Any, sig: signal.Signals) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
