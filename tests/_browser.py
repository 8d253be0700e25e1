"""A real headless Chromium for the tests, driven over the Chrome DevTools Protocol (CDP) with a small client.

``ensure_chromium()`` finds Chromium, installing Debian's ``chromium`` package with apt-get when it is missing and
we are root (as CI is); it skips only when Chromium is missing and cannot be installed without root.
``Browser`` starts it headless on a free DevTools port behind a proxy that refuses everything, so a request to
any host but loopback fails. ``Browser.new_page()`` opens a tab, a ``Page``: ``goto``, ``evaluate`` (JavaScript,
promises awaited), ``wait_for`` (a JavaScript condition, polled in the page) and what the tab saw: requested URLs,
failed requests, console errors (CSP violations among them), uncaught exceptions and dialogs (dismissed at once).
The ``websockets`` package (from ``uvicorn[standard]``, which ``litestar[standard]`` pulls in) carries CDP.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from loadtests.harness._servers import die_with_parent

CHROMIUM_ENV = "CHROMIUM"
"""Names the Chromium (or Chrome) binary to use instead of the one on PATH."""

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    given = os.environ.get(CHROMIUM_ENV)
    if given:
        return given
    return next((found for name in _NAMES if (found := shutil.which(name))), None)


def ensure_chromium() -> str:
    """Chromium's path; installs Debian's ``chromium`` with apt-get when it is missing and we are root."""
    found = find_chromium()
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"chromium is not installed (apt-get install chromium, as root) and {CHROMIUM_ENV} is not set")
    lock_path = Path(tempfile.gettempdir()) / "modelsvc-chromium.lock"
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent test runs install it once
        try:
            if not find_chromium():
                env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
                install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
                for command in (["apt-get", "update"], install):
                    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
                    if done.returncode != 0:
                        pytest.fail(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    found = find_chromium()
    if not found:
        pytest.fail("apt-get installed chromium, but no chromium is on PATH")
    return found


class CDPError(RuntimeError):
    """A CDP command failed, or JavaScript run by ``evaluate`` threw."""


class Page:
    """One tab over its CDP WebSocket: commands by id, events recorded as they arrive."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.requests: list[str] = []
        self._urls: dict[str, str] = {}
        self.failed: list[str] = []
        self.console_errors: list[str] = []
        self.exceptions: list[str] = []
        self.dialogs: list[str] = []
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable")

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> dict[str, Any]:
        ident = next(self.ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CDPError(f"no answer to {method} after {timeout}s")
            try:
                message = json.loads(self.ws.recv(timeout=remaining))
            except TimeoutError:
                continue
            if message.get("id") == ident:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            if "method" in message:
                self._event(message["method"], message.get("params", {}))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
            self._urls[params["requestId"]] = params["request"]["url"]
        elif method == "Network.loadingFailed":
            url = self._urls.get(params["requestId"], "?")
            why = params.get("blockedReason") or params.get("corsErrorStatus") or params.get("errorText")
            self.failed.append(f"{url}: {why}")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            self.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.console_errors.append(f"{entry['source']}: {entry['text']} {entry.get('url', '')}".strip())
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.exceptions.append(details.get("exception", {}).get("description") or details["text"])
        elif method == "Page.javascriptDialogOpening":
            self.dialogs.append(f"{params['type']}: {params['message']}")
            ident = next(self.ids)  # answered without waiting: an open dialog blocks the page's script
            answer = {"id": ident, "method": "Page.handleJavaScriptDialog", "params": {"accept": False}}
            self.ws.send(json.dumps(answer))

    def goto(self, url: str, timeout: float = 30.0) -> None:
        """Navigate and wait for the load event."""
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'", timeout=timeout)

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        """Run JavaScript in the page and return its value (a promise is awaited); raise CDPError if it throws."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True, "userGesture": True},
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise CDPError(details.get("exception", {}).get("description") or details["text"])
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout: float = 30.0) -> Any:
        """Poll the JavaScript expression ``condition`` in the page until it is truthy; return its value
        (``True`` for an object such as an element, which cannot be sent back by value)."""
        script = f"""new Promise((resolve, reject) => {{
            const deadline = Date.now() + {timeout * 1000};
            const poll = () => {{
                let value;
                try {{ value = ({condition}); }} catch (e) {{ value = undefined; }}
                if (value) resolve(typeof value === 'object' ? true : value);
                else if (Date.now() > deadline) reject(new Error("timed out waiting for: " + {json.dumps(condition)}));
                else setTimeout(poll, 50);
            }};
            poll();
        }})"""
        return self.evaluate(script, timeout=timeout + 10)


class Browser:
    """Headless Chromium in a child process with its own profile; ``new_page()`` opens a tab over CDP."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
        self.log_path = self.profile.parent / f"{self.profile.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.devtools = ""

    def start(self, timeout: float = 60.0) -> Self:
        args = [
            self.binary,
            "--headless",
            "--no-sandbox",  # as root, Chromium refuses to start with its sandbox
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-features=Translate,OptimizationHints,MediaRouter",
            # every request goes to a proxy that refuses it, except loopback (bypassed by default):
            # a page that reaches for another host fails, visibly, even on a machine with internet access
            "--proxy-server=http://127.0.0.1:9",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={self.profile}",
            "about:blank",
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"chromium opened no DevTools port after {timeout}s:\n{self.log()}")
            time.sleep(0.05)
        port = port_file.read_text().split()[0]
        self.devtools = f"http://127.0.0.1:{port}"
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @contextmanager
    def new_page(self) -> Iterator[Page]:
        """A new tab, closed on leaving the block."""
        target = httpx.put(f"{self.devtools}/json/new?about:blank", timeout=30).json()
        try:
            with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
                yield Page(ws)
        finally:
            httpx.get(f"{self.devtools}/json/close/{target['id']}", timeout=30)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
