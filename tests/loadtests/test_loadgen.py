"""The load generator (loadtests.loadgen): pure rules without a clock, then real modelsvc and logicd processes."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from loadtests import loadgen
from loadtests.loadgen.__main__ import main, parse_range
from tests._server import LogicdProcess, ModelsvcProcess
from tests.logicd.test_logicd_cli import VALUES, make_service

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: short windows keep the file fast; fixed counts keep it deterministic
QUICK = {"warmup_s": 0.2, "window_s": 0.3, "windows": 2}


# --- pure rules --------------------------------------------------------------------------------------------


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert loadgen.percentile(values, 50) == 50.0
    assert loadgen.percentile(values, 99) == 99.0
    assert loadgen.percentile(values, 100) == 100.0
    assert loadgen.percentile([7.0], 99) == 7.0
    assert loadgen.percentile([1.0, 2.0, 3.0, 4.0], 90) == 4.0
    assert loadgen.percentile([1.0, 2.0, 3.0, 4.0], 25) == 1.0
    assert math.isnan(loadgen.percentile([], 50))


def window(rate: float, latency_ms: float, seconds: float = 1.0) -> loadgen.Window:
    return loadgen.Window(seconds, [latency_ms / 1000.0] * round(rate * seconds))


def test_stability_wants_three_windows_within_the_percentage():
    steady = [window(1000, 1.0), window(1050, 1.02), window(980, 0.99)]
    assert loadgen.is_stable(steady, 10)
    assert not loadgen.is_stable(steady[:2], 10), "fewer than three windows is never stable"
    assert not loadgen.is_stable(steady, 2), "throughput spread of ~7 % is beyond ±2 %"
    slow_tail = [window(1000, 1.0), window(1000, 1.0), window(1000, 1.5)]
    assert not loadgen.is_stable(slow_tail, 10), "latency counts as well as throughput"
    only_last_three = [window(10, 50.0), *steady]
    assert loadgen.is_stable(only_last_three, 10)
    assert not loadgen.is_stable([*steady[:2], loadgen.Window(1.0)], 50), "an empty window is never stable"


def test_server_split_is_the_difference_of_two_snapshots():
    def stats(requests: int, queue_ns: int, infer_ns: int, inferences: int, executions: int) -> dict:
        return {
            "model_stats": [
                {
                    "name": "m",
                    "version": "1",
                    "inference_count": inferences,
                    "execution_count": executions,
                    "inference_stats": {
                        "success": {"count": requests, "ns": 0},
                        "queue": {"count": requests, "ns": queue_ns},
                        "compute_input": {"count": requests, "ns": 0},
                        "compute_infer": {"count": requests, "ns": infer_ns},
                        "compute_output": {"count": requests, "ns": 0},
                    },
                }
            ]
        }

    before = loadgen.ServerCounters.from_stats_json(stats(10, 10_000, 50_000, 10, 10))
    after = loadgen.ServerCounters.from_stats_json(stats(110, 210_000, 350_000, 110, 35))
    split = loadgen.ServerSplit.between(before, after)
    assert split.requests == 100
    assert split.queue_us == pytest.approx(2.0)
    assert split.compute_us == pytest.approx(3.0)
    assert split.avg_batch == pytest.approx(4.0)
    assert loadgen.ServerCounters.from_stats_json(stats(5, 0, 0, 5, 5), version="2").counts.get("success", 0) == 0


def test_ranges_and_shapes_parse_like_perf_analyzer():
    assert parse_range("1:8:2", int) == [1, 3, 5, 7]
    assert parse_range("4", int) == [4]
    assert parse_range("1:3", int) == [1, 2, 3]
    assert loadgen.parse_shape("input_ids:1,128") == ("input_ids", (1, 128))
    with pytest.raises(loadgen.LoadgenError):
        loadgen.parse_shape("nodims")


def test_progress_writes_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    show = loadgen.ProgressLine(out)
    show(loadgen.Progress(loadgen.Load(concurrency=4), 2, 1234.0, 0.56, 0, True))
    assert out.getvalue() == "concurrency 4: window 2  1,234 req/s  p99 0.56 ms  errors 0  stable\n"


# --- against real servers ----------------------------------------------------------------------------------


def assert_sane_split(result: loadgen.Result) -> None:
    split = result.server
    assert split is not None, "the server-side split is read from /v2/models/{m}/stats"
    assert split.avg_batch >= 1.0
    assert split.queue_us >= 0
    assert split.compute_us > 0
    # the server's count over the windows matches the client's: the statistics are read before each window ends,
    # so only the requests in flight at a boundary can straddle it (a relative band, with a floor for short runs)
    assert abs(split.requests - result.requests) <= max(20, 0.05 * result.requests), (split, result.requests)


@pytest.mark.integration
def test_closed_loop_http_with_the_server_split(server: ModelsvcProcess):
    result = loadgen.run(loadgen.Target(server.base, "identity"), loadgen.Load(concurrency=4, **QUICK))
    assert result.errors == {}
    assert result.requests > 50
    assert result.windows == 2
    assert result.stable is None, "a fixed window count is not checked for stability"
    assert result.p(50) <= result.p(90) <= result.p(99) <= result.latency_ms["max"]
    assert result.throughput == pytest.approx(result.requests / result.seconds)
    assert_sane_split(result)


@pytest.mark.integration
def test_closed_loop_grpc_with_the_server_split(server: ModelsvcProcess):
    target = loadgen.Target(f"grpc://127.0.0.1:{server.grpc_port}", "identity")
    result = loadgen.run(target, loadgen.Load(concurrency=4, **QUICK))
    assert result.protocol == "grpc"
    assert result.errors == {}
    assert result.requests > 20
    assert_sane_split(result)


@pytest.mark.integration
def test_open_loop_reaches_about_the_asked_rate(server: ModelsvcProcess):
    # 2 s of Poisson arrivals at 200/s: about 400 sends (standard deviation 20), so ±50 % is ~10 sigma wide and
    # leaves room for a loaded machine's scheduling, yet a rate off by half or double still fails
    load = loadgen.Load(request_rate=200, warmup_s=0.2, window_s=1.0, windows=2)
    result = loadgen.run(loadgen.Target(server.base, "identity"), load)
    assert result.concurrency is None
    assert result.request_rate == 200
    assert 100 <= result.sent_per_s <= 300, result.sent_per_s
    assert 100 <= result.throughput <= 300, result.throughput
    assert result.dropped == 0
    assert result.errors == {}


@pytest.mark.integration
def test_input_data_file_in_perf_analyzer_format_and_batches(server: ModelsvcProcess, tmp_path: Path):
    data = tmp_path / "inputs.json"
    rows = [{"INPUT0": {"content": [float(i)] * 16, "shape": [16]}} for i in range(3)]
    data.write_text(json.dumps({"data": [*rows, {"INPUT0": [0.5] * 16}]}))
    target = loadgen.Target(server.base, "identity")
    inputs = loadgen.InputSpec(str(data), batch_size=2)
    payloads = loadgen.prepare(target, inputs)
    assert len(payloads.items) == 4
    assert payloads.batch_size == 2
    assert b'"shape":[2,16]' in payloads.items[0]
    result = loadgen.run(target, loadgen.Load(concurrency=2, **QUICK), payloads=payloads)
    assert result.errors == {}
    assert result.infer_per_s == pytest.approx(2 * result.throughput)
    assert result.server is not None
    assert result.server.avg_batch >= 2.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [{"OTHER": [1.0]}]}))
    with pytest.raises(loadgen.LoadgenError, match="lacks input INPUT0"):
        loadgen.prepare(target, loadgen.InputSpec(str(bad)))


@pytest.mark.integration
def test_rest_route_of_a_logic_server(server: ModelsvcProcess, tmp_path: Path):
    bodies = tmp_path / "bodies.json"
    bodies.write_text(json.dumps([{"values": VALUES}, {"values": [1.0] * 16}]))
    with LogicdProcess(make_service(tmp_path / "echo"), server.base) as logic:
        target = loadgen.Target(f"{logic.base}/v1/echo", model="identity", rest=True, stats_url=server.base)
        result = loadgen.run(target, loadgen.Load(concurrency=2, **QUICK), loadgen.InputSpec(str(bodies)))
        missing = loadgen.Target(f"{logic.base}/v1/nothing-here", rest=True)
        lost = loadgen.run(missing, loadgen.Load(concurrency=1, **QUICK), loadgen.InputSpec(str(bodies)))
    assert result.protocol == "rest"
    assert result.errors == {}
    assert result.requests > 10
    assert result.server is not None, "--stats-url reads the model service behind the route"
    assert result.server.requests > 0
    assert set(lost.errors) == {"http 404"}
    assert lost.server is None
    with pytest.raises(loadgen.LoadgenError, match="need --input-data"):
        loadgen.prepare(target)
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"values": VALUES}))
    assert len(loadgen.prepare(target, loadgen.InputSpec(str(one))).items) == 1, "an object is one body"


@pytest.mark.integration
def test_errors_by_kind_unknown_model(server: ModelsvcProcess):
    http = loadgen.Target(server.base, "identity")
    good = loadgen.prepare(http)
    wrong = loadgen.Payloads([p.replace(b"/v2/models/identity/", b"/v2/models/nope/") for p in good.items])
    result = loadgen.run(http, loadgen.Load(concurrency=2, **QUICK), payloads=wrong)
    assert result.requests == 0
    assert set(result.errors) == {"http 404"}
    assert result.error_count > 10

    grpc_target = loadgen.Target(f"grpc://127.0.0.1:{server.grpc_port}", "identity")
    messages = list(loadgen.prepare(grpc_target).items)
    for message in messages:
        message.model_name = "nope"
    result = loadgen.run(grpc_target, loadgen.Load(concurrency=2, **QUICK), payloads=loadgen.Payloads(messages))
    assert set(result.errors) == {"grpc NOT_FOUND"}


@pytest.mark.integration
def test_errors_by_kind_stopped_server(main_repository: Path):
    with ModelsvcProcess(main_repository) as proc:
        target = loadgen.Target(proc.base, "identity")
        payloads = loadgen.prepare(target)
    result = loadgen.run(target, loadgen.Load(concurrency=2, **QUICK), payloads=payloads)
    assert result.requests == 0
    assert set(result.errors) == {"connection error"}
    assert result.server is None
    assert "connection error" in loadgen.format_table([result])


@pytest.mark.integration
def test_command_line_writes_csv_json_and_a_png(server: ModelsvcProcess, tmp_path: Path, capsys):
    files = {"csv": tmp_path / "r.csv", "json": tmp_path / "r.json", "plot": tmp_path / "r.png"}
    argv = ["--url", server.base, "--model", "identity", "--concurrency-range", "1:3:2", "--warmup-seconds", "0.1",
            "--window-seconds", "0.3", "--windows", "1", "-q"]  # fmt: skip
    argv += [arg for key, path in files.items() for arg in (f"--{key}", str(path))]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "p99 ms" in table
    assert "Server:" in table
    rows = list(csv.DictReader(io.StringIO(files["csv"].read_text())))
    assert [row["concurrency"] for row in rows] == ["1", "3"]
    assert all(float(row["throughput"]) > 0 and float(row["avg_batch"]) >= 1 for row in rows)
    doc = json.loads(files["json"].read_text())
    assert [d["concurrency"] for d in doc] == [1, 3]
    assert doc[0]["server"]["avg_batch"] >= 1
    assert files["plot"].read_bytes().startswith(PNG_SIGNATURE)


def test_command_line_explains_a_missing_model(capsys):
    assert main(["--url", "http://127.0.0.1:1", "--windows", "1"]) == 2
    assert "--model is required" in capsys.readouterr().err


def test_merge_adds_windows_up():
    a = loadgen.Window(1.0, [0.001], Counter({"timeout": 1}), sent=2)
    b = loadgen.Window(0.5, [0.002, 0.003], Counter({"timeout": 1, "http 503": 2}), sent=4, late=1)
    from loadtests.loadgen._stats import merge

    total = merge([a, b])
    assert total.seconds == 1.5
    assert total.latencies == [0.001, 0.002, 0.003]
    assert total.errors == {"timeout": 2, "http 503": 2}
    assert (total.sent, total.late) == (6, 1)


# --- failures inside the generator ------------------------------------------------------------------------


class _Flaky:
    """A transport whose every third request raises (a bug in the generator, or a loop-level error)."""

    def __init__(self) -> None:
        self.calls = 0

    async def request(self, payload: object) -> str | None:
        self.calls += 1
        if self.calls % 3 == 0:
            raise RuntimeError("boom")
        return None

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("load", [loadgen.Load(concurrency=2, **QUICK), loadgen.Load(request_rate=300, **QUICK)])
def test_a_request_that_raises_is_counted_and_the_workers_go_on(load: loadgen.Load):
    from loadtests.loadgen._runner import _event_loop_runner, measure
    from loadtests.loadgen._transports import StatsReader

    target = loadgen.Target("http://127.0.0.1:1/v1/route", rest=True)
    transport = _Flaky()

    async def go() -> loadgen.Result:
        return await measure(target, transport, StatsReader(target, transport), loadgen.Payloads([b"x"]), load)

    result = _event_loop_runner()(go())
    assert set(result.errors) == {"client error: RuntimeError"}
    assert result.requests > 10, "the workers survived their first exception"
    assert result.error_count >= result.requests // 2 - 2  # one in three raised
    sent = round(result.sent_per_s * result.seconds)
    assert result.requests + result.error_count >= sent - 2 * (load.concurrency or 1), "every request sent ends"


def test_unreadable_statistics_leave_the_split_out_with_a_note():
    from loadtests.harness import _servers
    from loadtests.loadgen._runner import _event_loop_runner, measure
    from loadtests.loadgen._transports import StatsReader

    port = _servers.free_port()  # nothing listens there: each statistics read is refused
    target = loadgen.Target(f"http://127.0.0.1:{port}", "identity")
    transport = _Flaky()

    async def go() -> loadgen.Result:
        return await measure(target, transport, StatsReader(target, transport), loadgen.Payloads([b"x"]),
                             loadgen.Load(concurrency=1, **QUICK))  # fmt: skip

    result = _event_loop_runner()(go())
    assert result.server is None
    assert any("server statistics unreadable before window 1" in n for n in result.notes), result.notes
    assert all(w["server_requests"] is None for w in result.window_log)
    assert "server statistics unreadable" in loadgen.format_table([result])


def test_grpc_connection_refused_is_a_connection_error():
    from tritonclient.grpc import service_pb2

    from loadtests.harness import _servers
    from loadtests.loadgen._runner import _event_loop_runner
    from loadtests.loadgen._transports import GrpcTransport

    async def go() -> str | None:
        transport = GrpcTransport("127.0.0.1", _servers.free_port(), 5.0)
        try:
            return await transport.request(service_pb2.ModelInferRequest(model_name="identity"))
        finally:
            await transport.close()

    assert _event_loop_runner()(go()) == "connection error"


def test_a_server_that_fails_to_start_keeps_its_log(capsys):
    from loadtests.harness import _servers

    server = _servers.ServerProcess("failing", ["sh", "-c", "echo it went wrong; exit 3"], _servers.free_port())
    with pytest.raises(RuntimeError, match="exited with code 3") as caught:
        server.__enter__()
    log = server.log_path
    assert log is not None
    try:
        assert str(log) in str(caught.value)
        assert str(log) in capsys.readouterr().err
        assert "it went wrong" in log.read_text()
    finally:
        log.unlink()
    unstarted = _servers.ServerProcess("unstarted", ["true"], 0)
    assert unstarted.log_path is None, "a server never started leaves no log"
