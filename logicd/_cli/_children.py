"""The servers ``logicd up`` starts, as child processes: each one's process and the last lines of its log, and
the signals that stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from .._config import CONFIG_ENV

TAIL_LINES = 40
"""How many of a child's last log lines ``up`` shows when the child fails."""


def _die_with_parent() -> None:
    """In a child, before exec: be sent SIGTERM if ``up`` dies, even by SIGKILL (Linux), so no server outlives it."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    """One server ``up`` started: its process, and a thread that keeps its last log lines (and echoes them)."""

    name: str
    proc: subprocess.Popen[bytes]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None

    @classmethod
    def start(cls, name: str, tag: str, command: list[str], echo: bool) -> Child:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop(CONFIG_ENV, None)  # the child is given its file
        # Its own process group: a terminal's Ctrl-C reaches only `up`, which passes it on once, in order.
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            process_group=0,
            preexec_fn=_die_with_parent,
        )
        child = cls(name, proc)
        child.reader = threading.Thread(target=child._pump, args=(tag, echo), name=f"logicd-up-{tag}", daemon=True)
        child.reader.start()
        return child

    def _pump(self, tag: str, echo: bool) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:  # drained to the end, or the child would block on a full pipe
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            if echo:
                try:
                    print(f"[{tag}] {line}", file=sys.stderr, flush=True)
                except (OSError, ValueError):  # our stderr went away: keep the tail only
                    echo = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def stop(self, sig: int, timeout: float) -> bool:
        """Send ``sig`` and wait; kill after ``timeout``. Whether it stopped by itself."""
        self.signal(sig)
        try:
            self.proc.wait(timeout)
            stopped = True
        except subprocess.TimeoutExpired:
            print(f"logicd up: the {self.name} did not stop within {timeout:g}s; killing it", file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
            stopped = False
        if self.reader is not None:
            self.reader.join(5.0)
        return stopped

    def show_tail(self, why: str) -> None:
        if self.reader is not None and not self.alive:
            self.reader.join(5.0)  # the last lines are in the pipe until it is drained
        lines = "\n".join(f"  | {line}" for line in self.tail) or "  | (no output)"
        print(f"logicd up: the {self.name} {why}; its last log lines:\n{lines}", file=sys.stderr, flush=True)


class Signals:
    """SIGTERM, SIGINT and SIGHUP while ``up`` runs: the first asks for a stop; a later one is passed straight
    on to the children that still run (a second Ctrl-C hurries them)."""

    HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: int | None = None
        self.event = threading.Event()
        self.children: list[Child] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.HANDLED}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        forward = signal.SIGTERM if sig == signal.SIGHUP else sig
        if self.received is not None:
            for child in self.children:
                child.signal(forward)
            return
        self.received = forward
        self.event.set()
