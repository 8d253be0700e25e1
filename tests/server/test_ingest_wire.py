"""The ingest channel's parts on their own: frames cut from any split of the stream, every datatype there and back
(inline and through the shared-memory arena), the arena's blocks, and how many workers ``--workers auto`` means."""

from __future__ import annotations

import asyncio
import itertools
import os
import random

import numpy as np
import pytest

from modelsvc.protocol import (
    InferRequest,
    InferResponse,
    InvalidArgument,
    NotFound,
    RequestedOutput,
    Tensor,
    numpy_dtype,
    tensor_bytes,
)
from modelsvc.server.ingest import resolve_workers
from modelsvc.server.ingest._arena import ArenaView, OwnedArena
from modelsvc.server.ingest._remote import EngineLink, RemoteDataPlane
from modelsvc.server.ingest._wire import (
    SHARED_FROM,
    Call,
    Cancel,
    FrameReader,
    Release,
    call_for,
    decode_to_engine,
    decode_to_worker,
    error_of,
    error_reply,
    frame,
    reply_for,
    request_of,
    response_of,
)
from tests.conftest import DTYPES


def _array(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape))
    if datatype == "BYTES":
        return np.array([f"item-{i}".encode() * (i % 3) for i in range(count)], dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        return (np.arange(count) % 2 == 0).reshape(shape)
    return (np.arange(count) % 100).astype(numpy_dtype(datatype)).reshape(shape)


@pytest.fixture
def arena() -> OwnedArena:
    return OwnedArena(4 << 20)


@pytest.mark.parametrize("datatype", [*DTYPES, "BF16"])
@pytest.mark.parametrize("rows", [1, 40_000])
def test_every_datatype_crosses_inline_or_through_the_arena(datatype: str, rows: int, arena: OwnedArena) -> None:
    data = _array(datatype, (rows, 4))
    wanted = [RequestedOutput("Y", True, {"classification": 2})]
    request = InferRequest([Tensor("X", datatype, data.shape, data, {"p": 1})], "id-1", wanted, {"priority": 2})
    blocks: list[tuple[int, int]] = []
    call = call_for(7, "m", "2", request, endpoint="HTTP end point", trace_headers=None, arena=arena, blocks=blocks)
    (body,) = FrameReader().feed(frame(call))
    decoded = decode_to_engine(body)
    assert decoded.id == 7
    assert (decoded.model, decoded.version, decoded.endpoint) == ("m", "2", "HTTP end point")
    assert bool(blocks) == (len(tensor_bytes(datatype, data)) >= SHARED_FROM)  # large ones through the arena
    back = request_of(decoded, ArenaView(arena.fd, arena.size))
    (tensor,) = back.inputs
    assert (tensor.name, tensor.datatype, tensor.shape, tensor.parameters) == ("X", datatype, data.shape, {"p": 1})
    assert tensor.data.dtype == data.dtype
    np.testing.assert_array_equal(tensor.data, data)
    assert (back.id, back.parameters) == ("id-1", {"priority": 2})
    assert back.outputs == [RequestedOutput("Y", True, {"classification": 2})]

    response = InferResponse("m", "2", [Tensor("Y", datatype, data.shape, data)], "id-1", {"x": "y"})
    (body,) = FrameReader().feed(frame(reply_for(7, response, True, arena, [])))
    reply = decode_to_worker(body)
    got = response_of(reply, ArenaView(arena.fd, arena.size))
    assert (got.model_name, got.model_version, got.id, got.parameters) == ("m", "2", "id-1", {"x": "y"})
    np.testing.assert_array_equal(got.outputs[0].data, data)


def test_frames_come_out_whole_however_the_stream_is_cut() -> None:
    messages = [Cancel(i) for i in range(50)]
    stream = b"".join(frame(m) for m in messages)
    rng = random.Random(1)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(stream)), 15))
        reader = FrameReader()
        got = []
        for a, b in itertools.pairwise([0, *cuts, len(stream)]):
            got += [decode_to_engine(body) for body in reader.feed(stream[a:b])]
        assert got == messages


def test_errors_keep_their_kind_and_words() -> None:
    for exc in (InvalidArgument("bad input 'X'"), NotFound("no model 'm'")):
        (body,) = FrameReader().feed(frame(error_reply(3, exc)))
        reply = decode_to_worker(body)
        again = error_of(reply.error)
        assert type(again) is type(exc)
        assert again.message == exc.message
    (body,) = FrameReader().feed(frame(error_reply(3, RuntimeError("secret path /srv/x"))))
    hidden = error_of(decode_to_worker(body).error)
    assert "secret" not in hidden.message  # an unexpected error shows nothing of itself, as the doors do


def test_the_arena_hands_out_blocks_first_fit_and_merges_what_is_freed(arena: OwnedArena) -> None:
    one = arena.put(memoryview(b"a" * 100))
    two = arena.put(memoryview(b"b" * 1000))
    three = arena.put(memoryview(b"c" * 10))
    assert one == (0, 100)
    assert two == (128, 1000)  # blocks start on ALIGN-byte boundaries
    assert three is not None
    assert three[0] == 128 + 1024
    assert bytes(arena.view(two)) == b"b" * 1000
    arena.free(two)
    assert arena.put(memoryview(b"d" * 900)) == (128, 900)  # the freed block is used again
    assert arena.put(memoryview(b"e" * arena.size)) is None  # no room: the caller sends it inline
    arena.free(one)
    arena.free((128, 900))
    assert three is not None
    arena.free(three)
    assert arena.in_use == 0
    assert arena.put(memoryview(b"f" * arena.size)) == (0, arena.size)  # merged back into one block


def test_the_peer_reads_an_arena_through_its_own_descriptor() -> None:
    owned = OwnedArena(4096)
    block = owned.put(memoryview(b"x" * 10))
    assert block is not None
    peer_fd = os.dup(owned.fd)  # what a child inherits
    owned.close_fd()
    view = ArenaView(peer_fd, 4096)
    os.close(peer_fd)
    assert bytes(view.view(block)) == b"x" * 10  # the mappings outlive the descriptors


@pytest.mark.parametrize(
    ("value", "cpus", "workers"),
    [("auto", 1, 0), ("auto", 2, 0), ("auto", 2.5, 1), ("auto", 3, 2), ("auto", 16, 15), ("4", 2, 4), ("0", 16, 0)],
)
def test_auto_means_one_process_up_to_two_cpus_then_a_worker_per_cpu_but_the_engines(
    value: str, cpus: float, workers: int
) -> None:
    assert resolve_workers(value, cpus) == workers


class _Transport:
    def __init__(self) -> None:
        self.frames: list[object] = []
        self.reader = FrameReader()

    def write(self, data: bytes) -> None:
        self.frames += [decode_to_engine(body) for body in self.reader.feed(data)]


async def test_outputs_of_a_call_whose_caller_went_away_go_back_to_the_engine(arena: OwnedArena) -> None:
    """The engine's arena is not left holding the outputs of a request nobody reads any more."""
    engine_arena = OwnedArena(1 << 20)
    link = EngineLink(arena, ArenaView(engine_arena.fd, engine_arena.size), 0)
    transport = _Transport()
    link.connection_made(transport)  # type: ignore[arg-type]
    plane = RemoteDataPlane(link, None)
    data = np.arange(40_000, dtype=np.float32).reshape(1, 40_000)
    request = InferRequest([Tensor("X", "FP32", data.shape, data)])
    call = asyncio.ensure_future(plane.infer("m", None, request))
    await asyncio.sleep(0.01)
    (sent,) = [f for f in transport.frames if isinstance(f, Call)]
    assert sent.inputs[0].block is not None  # the input went through the worker's arena
    call.cancel()
    await asyncio.sleep(0.01)
    assert any(isinstance(f, Cancel) and f.id == sent.id for f in transport.frames)
    assert arena.in_use > 0  # the engine may still read the input: kept until its final reply
    blocks: list[tuple[int, int]] = []
    response = InferResponse("m", "1", [Tensor("Y", "FP32", data.shape, data)])
    link.data_received(frame(reply_for(sent.id, response, True, engine_arena, blocks)))
    await asyncio.sleep(0.01)
    assert blocks
    assert [f.blocks for f in transport.frames if isinstance(f, Release)] == [blocks]
    assert arena.in_use == 0
