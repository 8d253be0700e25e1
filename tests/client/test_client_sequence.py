"""The typed client's sequences: the request parameters exactly as tritonclient sends them (compared with
tritonclient's own request builders, HTTP JSON and gRPC), the start/end flags through a sequence's life, and over
real modelsvc processes: int and str ids on HTTP and gRPC as the python backend reads them, every request of a
sequence on one replica of two, and a replica killed mid-sequence as ``SequenceLost``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import _utils as grpc_utils
from tritonclient.http import _utils as http_utils

from loadtests.harness._servers import free_port
from modelsvc.client import AsyncClient, Client, ClientError, InferResult, SequenceLost
from modelsvc.client._core import build_infer
from modelsvc.client._grpc import build_request
from modelsvc.client._sequence import new_sequence_id, sequence_parameters
from modelsvc.protocol import Tensor
from tests._server import ModelsvcProcess

REPO = Path(__file__).parents[1] / "data" / "edge_seqecho"
ACCUMULATE = Path(__file__).parents[1] / "data" / "seq_models" / "accumulate_state"
START, END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
ONE = Tensor("IN", "FP32", (1,), np.ones(1, np.float32))
CASES = [(42, True, False), (7, False, False), (2**40, False, True), ("doc-1", True, True), ("é", False, True)]


# -- no I/O: the parameters as tritonclient sends them ----------------------------------------------------


@pytest.mark.parametrize(("sequence_id", "start", "end"), CASES)
def test_grpc_parameters_equal_tritonclients(sequence_id: int | str, start: bool, end: bool) -> None:
    ours = build_request("m", None, [ONE], None, None, sequence_parameters(sequence_id, start, end))
    theirs = grpc_utils._get_inference_request(
        "m", [], "", "", None, sequence_id, start, end, 0, None, None
    )  # positional: model, inputs, version, id, outputs, sequence_id, start, end, priority, timeout, parameters
    assert dict(ours.parameters) == dict(theirs.parameters)
    kind = "string_param" if isinstance(sequence_id, str) else "int64_param"
    assert ours.parameters["sequence_id"].WhichOneof("parameter_choice") == kind
    assert ours.parameters["sequence_start"].WhichOneof("parameter_choice") == "bool_param"


@pytest.mark.parametrize(("sequence_id", "start", "end"), CASES)
def test_http_parameters_equal_tritonclients(sequence_id: int | str, start: bool, end: bool) -> None:
    prepared = build_infer(
        "m", None, [ONE], ["OUT"], binary=False, parameters=sequence_parameters(sequence_id, start, end)
    )
    assert prepared.body is not None
    ours = json.loads(prepared.body)["parameters"]
    theirs = http_utils._get_inference_request([], "", None, sequence_id, start, end, 0, None, None)
    expected = {k: v for k, v in json.loads(theirs[0])["parameters"].items() if k != "binary_data_output"}
    assert ours == expected
    assert type(ours["sequence_id"]) is type(sequence_id)


def test_generated_ids_are_distinct_nonzero_and_fit_31_bits() -> None:
    ids = [new_sequence_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(0 < i < 2**31 for i in ids)


def test_a_forked_process_generates_other_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, str(new_sequence_id()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = int(os.read(read, 64))
    os.close(read)
    os.close(write)
    assert abs(child - new_sequence_id()) > 1000  # not the parent's next ones (random starts; 1 in 10^6 close)


@pytest.mark.parametrize("bad", [0, "", True, 2**64, 1.5])
def test_bad_sequence_ids_are_refused_before_sending(bad: Any) -> None:
    with Client("127.0.0.1:1") as client, pytest.raises((TypeError, ValueError)):
        client.sequence("m", bad)


# -- real processes -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ModelsvcProcess]]:
    """Two replicas of a repository of seqecho, seq's accumulate_state (the server keeps each sequence's sum as
    implicit state, starting at 100) and accumulate (the model keeps the sums; direct strategy, 2 slots)."""
    repo = tmp_path_factory.mktemp("sequences")
    (repo / "seqecho").symlink_to(REPO / "seqecho")
    # a copy whose idle release is 2 s, not 300 ms: a step held up on a busy machine must not end a sequence here
    # (tests/scheduler/test_sequence_models.py tests the release)
    shutil.copytree(ACCUMULATE, repo / "accumulate_state")
    config = repo / "accumulate_state" / "config.pbtxt"
    idle = "max_sequence_idle_microseconds: "
    slow = config.read_text().replace(idle + "300000", idle + "2000000")
    assert "2000000" in slow, "accumulate_state's idle time changed: update this copy"
    config.write_text(slow)
    (repo / "accumulate").symlink_to(ACCUMULATE.parent / "accumulate")
    servers = [ModelsvcProcess(repo).start(), ModelsvcProcess(repo).start()]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.terminate()


def _seen(result: InferResult) -> tuple[str, int]:
    return result["CORRID"][0].decode(), int(result["FLAGS"][0])


@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_sync_sequence_flags_and_ids_reach_the_model(replicas: list[ModelsvcProcess], scheme: str) -> None:
    server = replicas[0]
    url = server.base if scheme == "http" else f"grpc://127.0.0.1:{server.grpc_port}"
    with Client(url) as client:
        with client.sequence("seqecho", 123) as seq:
            seen = [_seen(seq.infer(IN=np.array([float(i)], np.float32))) for i in range(3)]
            seen.append(_seen(seq.infer(IN=np.array([3.0], np.float32), end=True)))
        assert seen == [("int:123", START), ("int:123", 0), ("int:123", 0), ("int:123", END)]
        assert seq.ended
        assert seq.steps == 4
        with pytest.raises(ClientError, match="has ended"):
            seq.infer(IN=np.ones(1, np.float32))
        with client.sequence("seqecho", "doc-7") as text:  # one request both starts and ends
            assert _seen(text.infer(IN=np.ones(1, np.float32), end=True)) == ("str:doc-7", START | END)


@pytest.mark.integration
def test_leaving_the_block_ends_the_sequence_even_after_an_error(replicas: list[ModelsvcProcess]) -> None:
    sent: list[tuple[str, int]] = []

    async def main() -> None:
        async with AsyncClient(replicas[0].base) as client:
            seq = client.sequence("seqecho")

            async def fail() -> None:
                async with seq:
                    sent.append(_seen(await seq.infer(IN=np.ones(1, np.float32))))
                    raise RuntimeError("the caller failed mid-sequence")

            with pytest.raises(RuntimeError):
                await fail()
            assert seq.ended
            assert isinstance(seq.id, int)
            # the end went out with the last inputs again; a fresh sequence that never sent anything sends nothing
            async with client.sequence("seqecho") as idle:
                pass
            assert idle.ended
            assert idle.steps == 0

    asyncio.run(main())
    assert sent[0][1] == START


@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_a_sequence_sticks_to_one_replica_and_a_lost_replica_is_sequence_lost(
    replicas: list[ModelsvcProcess], scheme: str
) -> None:
    def url(server: ModelsvcProcess) -> str:
        return server.base if scheme == "http" else f"grpc://127.0.0.1:{server.grpc_port}"

    async def main() -> None:
        async with AsyncClient([url(s) for s in replicas]) as client:

            async def one(n: int) -> set[int]:
                async with client.sequence("seqecho") as seq:
                    pids = {int((await seq.infer(IN=np.ones(1, np.float32)))["PID"][0]) for _ in range(n)}
                    pids.add(int((await seq.infer(IN=np.ones(1, np.float32), end=True))["PID"][0]))
                return pids

            spread = await asyncio.gather(*(one(4) for _ in range(8)))
            assert all(len(pids) == 1 for pids in spread)  # each sequence on one replica
            assert len(set().union(*spread)) == 2  # and both replicas used (least outstanding, 8 at once)
            assert [s.outstanding for s in client.replicas()] == [0, 0]

    asyncio.run(main())


@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_interleaved_sequences_over_two_replicas_keep_their_own_state(
    replicas: list[ModelsvcProcess], scheme: str
) -> None:
    urls = [s.base if scheme == "http" else f"grpc://127.0.0.1:{s.grpc_port}" for s in replicas]
    rng = np.random.default_rng(7)
    values = [rng.integers(-50, 50, size=int(rng.integers(1, 8))).tolist() for _ in range(16)]

    async def main() -> None:
        async with AsyncClient(urls) as client:

            async def one(steps: list[int]) -> list[int]:
                sums = []
                async with client.sequence("accumulate_state") as seq:
                    for i, value in enumerate(steps):
                        result = await seq.infer(INPUT=np.array([[value]], np.int32), end=i == len(steps) - 1)
                        assert int(result["CORRID_OUT"][0][0]) == seq.id
                        sums.append(int(result["OUTPUT"][0][0]))
                        await asyncio.sleep(0)
                return sums

            got = await asyncio.gather(*(one(v) for v in values))
            assert got == [(100 + np.cumsum(v)).tolist() for v in values]

    asyncio.run(main())


@pytest.mark.integration
def test_over_http_waiting_starts_leave_connections_to_live_sequences(replicas: list[ModelsvcProcess]) -> None:
    """64 sequences on accumulate's 2 slots over 32 connections: the starts waiting for a slot hold at most 16,
    so the live sequences' next requests still go out before their idle time (2 s) runs out. (Without that
    bound, 31 of 64 sequences were released mid-way and failed with Triton's "must specify the START flag".)"""

    async def main() -> None:
        async with AsyncClient(replicas[0].base, max_connections=32) as client:

            async def one() -> list[int]:
                async with client.sequence("accumulate") as seq:
                    return [
                        int((await seq.infer(INPUT=np.array([[1]], np.int32), end=i == 3))["OUTPUT"][0][0])
                        for i in range(4)
                    ]

            assert await asyncio.gather(*(one() for _ in range(64))) == [[1, 2, 3, 4]] * 64

    asyncio.run(main())


@pytest.mark.integration
def test_a_sequence_start_fails_over_and_the_rest_follow_it(replicas: list[ModelsvcProcess]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"

    async def main() -> None:
        async with AsyncClient([dead, replicas[0].base]) as client:
            for _ in range(3):  # a start that tries the dead replica first fails over and pins the live one
                async with client.sequence("seqecho") as seq:
                    flags = [_seen(await seq.infer(IN=np.ones(1, np.float32), end=i == 2))[1] for i in range(3)]
                assert flags == [START, 0, END]
            assert client._t.sequence_replica(seq.id) is None  # type: ignore[attr-defined]  # unpinned at its end

    asyncio.run(main())


@pytest.mark.integration
def test_a_replica_killed_mid_sequence_raises_sequence_lost(replicas: list[ModelsvcProcess]) -> None:
    """Last test of the module: it kills one replica."""

    async def main() -> None:
        urls = [s.base for s in replicas]
        async with AsyncClient(urls, timeout=5) as client:
            seq = client.sequence("seqecho")
            await seq.infer(IN=np.ones(1, np.float32))
            pinned = client._t.sequence_replica(seq.id)  # type: ignore[attr-defined]
            holder = next(s for s in replicas if s.base == pinned)
            assert holder.proc is not None
            holder.proc.kill()
            holder.proc.wait()
            with pytest.raises(SequenceLost, match="failed mid-sequence"):
                await seq.infer(IN=np.ones(1, np.float32))
            with pytest.raises(SequenceLost, match="no replica holds it"):
                await seq.infer(IN=np.ones(1, np.float32), end=True)
            async with client.sequence("seqecho") as fresh:  # a new sequence starts on the survivor
                assert _seen(await fresh.infer(IN=np.ones(1, np.float32), end=True))[1] == START | END

    asyncio.run(main())
