"""The doc_classifier pair for the soak and overload scripts: started as two real processes (``modelsvc serve`` and
``logicd serve``) or attached to by URL and PIDs; and each half's resources from /proc (the process and its
children): resident memory, open file descriptors, threads, CPU seconds."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtests.harness import _servers

SERVICE = "doc_classifier"
ROUTE = "/v1/classify"


@dataclass(frozen=True)
class Pair:
    """The logic server's base URL and the PID of each half."""

    url: str
    model_pid: int
    logic_pid: int
    started: bool
    """True when this script started the pair (and stops it), False when it attached to a running one."""


@dataclass(frozen=True)
class ProcStats:
    """One half at one moment: summed over the process and its descendants."""

    rss_mib: float
    fds: int
    threads: int
    cpu_s: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def proc_stats(pid: int) -> ProcStats:
    """RSS (VmRSS), open descriptors (entries of /proc/PID/fd) and threads (Threads:) of ``pid`` and its
    descendants; a process that ends while being read is left out."""
    rss_kib = fds = threads = 0
    for p in _servers._tree_pids(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss_kib += int(line.split()[1])
            elif line.startswith("Threads:"):
                threads += int(line.split()[1])
    return ProcStats(rss_kib / 1024, fds, threads, _servers.tree_cpu_seconds(pid))


def own_sockets() -> int:
    """Sockets this process has open: the load generator's connections to the logic server (and a constant few of
    asyncio's), each of which is one descriptor in the logic server; its idle keep-alive connections come and go
    with the bursts of the load."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return count


def own_cpu_seconds() -> float:
    """This process's user + system CPU seconds (the load generator's cost)."""
    t = os.times()
    return t.user + t.system


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the pair (default: start doc_classifier as modelsvc + logicd)")
    group.add_argument("--url", help="attach to a running logic server at this base URL instead of starting one")
    group.add_argument("--model-pid", type=int, help="with --url: the model service's PID (for /proc stats)")
    group.add_argument("--logic-pid", type=int, help="with --url: the logic server's PID (for /proc stats)")


def check_pair_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    attach = (args.url, args.model_pid, args.logic_pid)
    if any(a is not None for a in attach) and not all(a is not None for a in attach):
        parser.error("--url, --model-pid and --logic-pid go together (attach to a running pair)")
    for pid in (args.model_pid, args.logic_pid):
        if pid is not None and not Path(f"/proc/{pid}").exists():
            parser.error(f"no process {pid}")


@contextmanager
def pair_from(args: argparse.Namespace) -> Iterator[Pair]:
    """The pair the arguments name: attached to (``--url``), or started here and stopped on exit."""
    if args.url is not None:
        yield Pair(args.url.rstrip("/"), args.model_pid, args.logic_pid, started=False)
        return
    folder = _servers.ROOT / "services" / SERVICE
    missing = [p for p in (folder / "model_repository" / "minilm" / "1", folder / "tokenizer") if not p.exists()]
    if missing:
        raise SystemExit(f"the model is not built ({', '.join(map(str, missing))}): run python -m services.build")
    with ExitStack() as stack:
        model = stack.enter_context(_servers.modelsvc_server(folder / "model_repository", 120.0))
        logic = stack.enter_context(_servers.logicd_server(folder, model.base_url, 120.0))
        assert model.proc is not None
        assert logic.proc is not None
        yield Pair(logic.base_url, model.proc.pid, logic.proc.pid, started=True)
