"""A real ``modelsvc serve`` fuzzed over HTTP and gRPC (issue 17, part 4): the protocol fuzzing's bodies and
messages, and HTTP requests mangled in their request line, headers and framing (loadtests/fuzz/_live.py). No
answer is a 500 or a gRPC INTERNAL/UNKNOWN, every HTTP error is ``{"error": ...}``, the server answers after each
and logs no internal error. ``python -m loadtests.fuzz --modelsvc`` runs the same with many more examples."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from loadtests.fuzz import _live as live
from loadtests.fuzz._protocol import Target
from tests._server import ModelsvcProcess

FUZZ = settings(
    max_examples=int(os.environ.get("MODELSVC_FUZZ_LIVE_EXAMPLES", "20")),
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def targets(server: ModelsvcProcess) -> Iterator[dict[str, Target]]:
    running = live.Modelsvc(server.base, f"127.0.0.1:{server.grpc_port}", "identity", ("INPUT0",))
    with httpx.Client(base_url=server.base, timeout=30) as client, grpc.insecure_channel(running.grpc_url) as channel:
        yield {t.name.split(" (")[0]: t for t in live.modelsvc_targets(running, client, channel)}


def _fuzz(target: Target) -> None:
    @FUZZ
    @given(target.strategy)
    def run(case: object) -> None:
        target.check(case)

    run()


@pytest.mark.parametrize(
    "name",
    [
        "modelsvc HTTP infer bodies",
        "modelsvc HTTP raw requests",
        "modelsvc gRPC ModelInfer",
        "modelsvc HTTP repository index bodies",
    ],
)
def test_live_fuzzing(server: ModelsvcProcess, targets: dict[str, Target], name: str) -> None:
    before = len(live.log_errors(server.log_path))
    _fuzz(targets[name])
    assert live.log_errors(server.log_path)[before:] == []


@pytest.mark.parametrize(
    "message",
    [
        b"\x0b" * 100_000,  # field 1 as a group, opened 100,000 times: protobuf's own depth limit refuses it
        b"\x2a\xff\xff\xff\xff\x0f",  # inputs (field 5) said to be 4 GiB long, in a message of 6 bytes
        b"\x0a\x08identity\x2a" + b"\x2a\x02" * 1000,
    ],
)
def test_grpc_message_that_does_not_parse(server: ModelsvcProcess, message: bytes) -> None:
    """The gRPC side of the deep-nesting case: a ModelInfer message protobuf cannot parse is INTERNAL "Exception
    deserializing request!", as grpcio's own server answers it (there is no JSON on gRPC to nest), and the server
    keeps serving."""
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call: Any = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as caught:
            call(message, timeout=30)
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert caught.value.details() == "Exception deserializing request!"
        live: Any = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        assert live(b"", timeout=30) == b"\x08\x01"  # ServerLiveResponse(live=True)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v2/repository/index", b'{"ready": "\xc0"}'),
        ("/v2/repository/models/no_such_model/load", b'{"parameters": {"config": "\xff"}}'),
        ("/v2/repository/models/no_such_model/unload", b'{"parameters": {"\xc0": true}}'),
    ],
)
def test_control_body_not_utf8_is_a_400_naming_it(server: ModelsvcProcess, path: str, body: bytes) -> None:
    """A 500 (msgspec's UnicodeDecodeError) before 7c6e1a0; the body is read before the model is looked up."""
    response = httpx.post(f"{server.base}{path}", content=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "not UTF-8" in response.json()["error"]
