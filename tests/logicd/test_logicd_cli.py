"""The ``logicd`` command line on real processes: ``serve`` against a model service, ``up`` end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from logicd import __version__
from logicd._cli import config_path, main
from modelsvc.tools import onnx_models as om
from tests._server import ROOT, LogicdProcess, ModelsvcProcess, Up, free_port, gone
from tests.conftest import identity_config

pytestmark = pytest.mark.integration

WAIT = 60.0
STOP_BOUND = 20.0

ECHO_SERVICE = '''\
"""A test service: POST /v1/echo sends 16 numbers through the identity model."""

import numpy as np
from msgspec import Struct

from logicd import Context, Service


class Echo(Struct):
    values: list[float]


service = Service()


@service.post("/v1/echo")
async def echo(request: Echo, ctx: Context) -> Echo:
    """Send the values through the identity model."""
    async with ctx.stage("model"):
        out = await ctx.model("identity").infer(INPUT0=np.asarray([request.values], np.float32))
    return Echo(values=out["OUTPUT0"][0].tolist())
'''

VALUES = [float(i) / 2 for i in range(16)]


def make_service(folder: Path, *, model_url: str = "http://127.0.0.1:1", port: int = 0, config: str = "") -> Path:
    """A service folder: service.yaml, echo_service.py, example.json and a model repository with identity."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "echo_service.py").write_text(ECHO_SERVICE)
    (folder / "example.json").write_text(json.dumps({"values": VALUES}))
    om.write_model(folder / "model_repository", "identity", om.identity(), identity_config("identity"))
    (folder / "service.yaml").write_text(
        config
        or f"""\
name: echo
service: echo_service:service
model_service:
  url: {model_url}
  timeout_s: 10
models: [identity]
server:
  host: 127.0.0.1
  port: {port}
"""
    )
    return folder


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if not gone(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if not gone(pid)]


def run_cli(*args: str, timeout: float = WAIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logicd", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


# --- in-process: arguments and configuration errors ---------------------------------------------------


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"logicd {__version__}"


def test_config_path_takes_a_folder_a_file_or_the_environment(tmp_path):
    assert config_path(tmp_path) == tmp_path / "service.yaml"
    assert config_path(tmp_path / "other.yaml") == tmp_path / "other.yaml"
    assert config_path(None, {"LOGICD_CONFIG": str(tmp_path)}) == tmp_path / "service.yaml"
    assert config_path(None, {}) == Path("service.yaml")


def test_serve_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    folder = make_service(tmp_path / "svc")
    text = (folder / "service.yaml").read_text().replace("timeout_s: 10", "timeout_s: soon")
    (folder / "service.yaml").write_text(text)
    assert main(["serve", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "model_service.timeout_s" in err
    assert "service.yaml" in err


def test_serve_bad_model_url_flag_exits_2_naming_the_flag(tmp_path, capsys):
    folder = make_service(tmp_path / "svc")
    assert main(["serve", str(folder), "--model-url", "ftp://nowhere"]) == 2
    assert "--model-url: must be http(s)://" in capsys.readouterr().err


def test_serve_missing_service_module_exits_2(tmp_path, capsys):
    folder = make_service(tmp_path / "svc")
    text = (folder / "service.yaml").read_text().replace("echo_service:service", "no_such_module:service")
    (folder / "service.yaml").write_text(text)
    assert main(["serve", str(folder)]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err


def test_up_without_model_repository_exits_2(tmp_path, capsys):
    folder = make_service(tmp_path / "svc")
    for path in sorted((folder / "model_repository").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (folder / "model_repository").rmdir()
    assert main(["up", str(folder)]) == 2
    assert "no model repository" in capsys.readouterr().err


# --- real processes -------------------------------------------------------------------------------------


def test_serve_bad_config_in_a_process_exits_2(tmp_path):
    folder = make_service(tmp_path / "svc")
    text = (folder / "service.yaml").read_text().replace("models: [identity]", "models: []")
    (folder / "service.yaml").write_text(text)
    result = run_cli("serve", str(folder))
    assert result.returncode == 2, result.stderr
    assert "models: at least one model is required" in result.stderr


def test_serve_on_a_taken_port_exits_1(tmp_path):
    folder = make_service(tmp_path / "svc")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_cli("serve", str(folder), "--port", str(taken.getsockname()[1]))
    assert result.returncode == 1, result.stderr
    assert "address already in use" in result.stderr
    assert "logicd serve: the server could not start" in result.stderr


def test_serve_against_a_model_service(tmp_path):
    folder = make_service(tmp_path / "svc")
    with ModelsvcProcess(folder / "model_repository") as models, LogicdProcess(folder, models.base) as logic:
        r = httpx.post(f"{logic.base}/v1/echo", json={"values": VALUES}, timeout=10.0)
        assert r.status_code == 200, r.text
        assert r.json() == {"values": VALUES}
        assert httpx.get(f"{logic.base}/health/live").status_code == 200
        logic.proc.send_signal(signal.SIGTERM)
        assert logic.wait_exit(STOP_BOUND) == 0, logic.log()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_up_end_to_end_and_a_signal_stops_both(tmp_path, stop_signal):
    folder = make_service(tmp_path / "svc", port=free_port())
    up = Up(tmp_path, str(folder), "--quiet")
    try:
        up.wait_for(r"^logicd up: echo is ready$")
        out = up.output()
        logic = re.search(r"logic server\s+(http://\S+)\s+\(pid (\d+)\)", out)
        model = re.search(r"model service\s+(http://\S+)\s+\(pid (\d+)\)", out)
        curl = re.search(r"curl -X POST (http://\S+) -H 'content-type: application/json' -d '(.*)'$", out, re.M)
        assert logic, out
        assert model, out
        assert curl, out
        assert re.search(rf"API docs\s+{re.escape(logic[1])}/docs", out)
        assert re.search(rf"metrics\s+{re.escape(logic[1])}/metrics", out)
        assert up.pids() == {"model service": int(model[2]), "logic server": int(logic[2])}
        assert curl[1] == f"{logic[1]}/v1/echo"
        r = httpx.post(curl[1], content=curl[2], headers={"content-type": "application/json"}, timeout=10.0)
        assert r.status_code == 200, r.text
        assert r.json() == {"values": VALUES}
        assert httpx.get(f"{model[1]}/v2/health/ready").status_code == 200
        assert httpx.get(f"{logic[1]}/metrics").status_code == 200
        # the example was sent once both were ready, and its answer shown
        shown = up.wait_for(r"^logicd up: example\.json sent to POST /v1/echo: 200 in \d+ ms$")
        assert json.loads(up.output()[shown.end() :].split("Ctrl-C stops both.")[0]) == {"values": VALUES}
        assert 'logicd_requests_total{route="/v1/echo",status="200"} 2.0' in httpx.get(f"{logic[1]}/metrics").text

        t0 = time.monotonic()
        up.proc.send_signal(stop_signal)
        assert up.wait() == 0, up.output() + up.errors()
        assert time.monotonic() - t0 < STOP_BOUND
        assert wait_gone(list(up.pids().values())) == []
        assert f"logicd up: stopping ({stop_signal.name})" in up.output()
        assert "logicd up: stopped" in up.output()
    finally:
        up.close()


def test_up_with_a_broken_model_repository_shows_the_model_service_log(tmp_path):
    folder = make_service(tmp_path / "svc")
    (folder / "model_repository" / "identity" / "config.pbtxt").write_text('name: "identity"\nmax_batch_size: [oops\n')
    up = Up(tmp_path, str(folder), "--quiet")
    try:
        assert up.wait(WAIT) != 0
        assert "model service" in up.pids()
        assert "the model service exited with status 1 before it was ready; its last log lines:" in up.errors()
        assert "config.pbtxt" in up.errors()  # the model service's own words, naming the file
        assert "logic server" not in up.pids()
        assert wait_gone(list(up.pids().values())) == []
    finally:
        up.close()


def test_up_when_a_child_dies_stops_the_other(tmp_path):
    folder = make_service(tmp_path / "svc")
    up = Up(tmp_path, str(folder), "--quiet")
    try:
        up.wait_for(r"^logicd up: echo is ready$")
        pids = up.pids()
        os.kill(pids["model service"], signal.SIGKILL)
        assert up.wait() == 1
        assert "the model service exited with status -9; its last log lines:" in up.errors()
        assert wait_gone(list(pids.values())) == []
    finally:
        up.close()


def test_killing_up_takes_its_servers_with_it(tmp_path):
    """Even SIGKILL (an OOM kill, a CI timeout): the children get SIGTERM when up dies."""
    folder = make_service(tmp_path / "svc")
    up = Up(tmp_path, str(folder), "--quiet")
    try:
        up.wait_for(r"^logicd up: echo is ready$")
        pids = up.pids()
        up.proc.kill()
        up.proc.wait()
        assert wait_gone(list(pids.values())) == []
    finally:
        up.close()


def test_up_refuses_a_port_another_server_holds(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        folder = make_service(tmp_path / "svc", port=port)
        result = run_cli("up", str(folder), "--host", "127.0.0.1", "--quiet")
    assert result.returncode == 2
    assert f"port {port} is already in use" in result.stderr
    assert "is ready" not in result.stdout


def test_up_no_example_sends_nothing(tmp_path):
    folder = make_service(tmp_path / "svc", port=free_port())
    up = Up(tmp_path, str(folder), "--quiet", "--no-example")
    try:
        up.wait_for(r"^Ctrl-C stops both\.$")
        assert "example.json sent" not in up.output()
        metrics = re.search(r"metrics\s+(http://\S+)", up.output())
        assert metrics, up.output()
        assert 'logicd_requests_total{route="/v1/echo"' not in httpx.get(metrics[1]).text
        up.proc.send_signal(signal.SIGTERM)
        assert up.wait() == 0
    finally:
        up.close()
