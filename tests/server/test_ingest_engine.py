"""The engine's end of the ingest channel on its own (``_engine.WorkerLink`` over a fake data plane): every call a
worker sends is answered exactly once, whatever comes with it or after it."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry import propagate
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator

from modelsvc.protocol import InferRequest, InferResponse, InternalError, Tensor
from modelsvc.server._options import ServeOptions
from modelsvc.server.ingest import Ingest, _wire, available_cpus
from modelsvc.server.ingest._arena import ArenaView, OwnedArena
from modelsvc.server.ingest._engine import EngineChannel, WorkerLink
from modelsvc.server.ingest._remote import EngineLink, ForwardTracing, RemoteDataPlane
from modelsvc.server.ingest._wire import Cancel, FrameReader, Reply, call_for, decode_to_worker, frame


class _Transport:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.reader = FrameReader()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.replies += [m for m in map(decode_to_worker, self.reader.feed(data)) if isinstance(m, Reply)]

    def close(self) -> None:
        self.closed = True


class _Plane:
    tracing: Any = None

    def __init__(self, outputs: list[Tensor] | None = None) -> None:
        self.outputs = outputs

    async def infer(self, name: str, version: str | None, request: InferRequest, trace: Any = None,
                    *, endpoint: str | None = None) -> InferResponse:  # fmt: skip
        await asyncio.sleep(0.01)
        return InferResponse(name, "1", request.inputs if self.outputs is None else self.outputs)


def _link(plane: _Plane) -> tuple[WorkerLink, _Transport]:
    channel = EngineChannel(plane, "/nonexistent")  # type: ignore[arg-type]
    link = WorkerLink(channel, asyncio.get_running_loop())
    transport = _Transport()
    link.connection_made(transport)  # type: ignore[arg-type]
    return link, transport


def _call(ident: int) -> bytes:
    data = np.ones((1, 4), np.float32)
    request = InferRequest([Tensor("X", "FP32", data.shape, data)])
    return frame(call_for(ident, "m", None, request, endpoint=None, trace_headers=None, arena=None, blocks=[]))


async def test_a_call_cancelled_before_its_task_ran_is_still_answered() -> None:
    """A Cancel in the same read as its Call (the caller went away at once): the worker frees the call's input
    blocks only on its final reply, so that reply must come, and the engine keeps nothing of the call."""
    link, transport = _link(_Plane())
    link.data_received(_call(1) + frame(Cancel(1)) + _call(2))
    await asyncio.sleep(0.05)
    assert sorted(r.id for r in transport.replies) == [1, 2]
    (cancelled,) = [r for r in transport.replies if r.id == 1]
    assert cancelled.final
    assert cancelled.error is not None
    assert cancelled.error.kind == "cancelled"
    assert link.tasks == {}


async def test_a_response_the_wire_cannot_carry_is_answered_with_an_error() -> None:
    """Packing a reply can fail (a BYTES output of objects that are not bytes): the worker gets an error reply,
    not silence (its client would wait for ever)."""
    link, transport = _link(_Plane([Tensor("Y", "BYTES", (2,), np.array([b"a", None], dtype=np.object_))]))
    link.data_received(_call(1))
    await asyncio.sleep(0.05)
    (reply,) = transport.replies
    assert reply.final
    assert reply.error is not None
    assert reply.error.kind == "internal"
    assert link.tasks == {}


async def test_a_reply_over_the_frame_limit_is_an_error_not_a_dead_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame of MAX_FRAME bytes or more ends the link of whoever reads it (all of that worker's requests): it is
    never sent; the call gets an error that says why, and its output blocks go back to the arena."""
    monkeypatch.setattr(_wire, "MAX_FRAME", 1024)
    link, transport = _link(_Plane([Tensor("Y", "FP32", (1, 1000), np.ones((1, 1000), np.float32))]))
    link.data_received(_call(1))
    await asyncio.sleep(0.05)
    (reply,) = transport.replies
    assert reply.error is not None
    assert reply.error.kind == "internal"
    assert "limit" in reply.error.message


async def test_a_call_over_the_frame_limit_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's side: the request fails with the reason, nothing of it stays pending or in the arena."""
    monkeypatch.setattr(_wire, "MAX_FRAME", 50_000)
    arena = OwnedArena(1 << 20)
    link = EngineLink(arena, ArenaView(arena.fd, arena.size), 0)
    written: list[bytes] = []
    link.connection_made(type("T", (), {"write": lambda self, data: written.append(data)})())
    big = np.ones((1, 40_000), np.float32)  # through the arena
    inline = np.ones((1, 15_000), np.float32)  # under SHARED_FROM: inline, over the limit
    request = InferRequest([Tensor("A", "FP32", big.shape, big), Tensor("B", "FP32", inline.shape, inline)])
    with pytest.raises(InternalError, match="limit"):
        await asyncio.wait_for(RemoteDataPlane(link, None).infer("m", None, request), 1)
    await asyncio.sleep(0.01)
    assert link.pending == {}
    assert arena.in_use == 0
    assert written == []


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.5),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 0.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_available_cpus_reads_a_cgroup_v1_quota_too(tmp_path: Path, files: dict[str, str], limit: float | None) -> None:
    """``--workers auto`` on a node whose pods have cgroup v1 (no ``cpu.max``) still sees the pod's CPU limit."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    affinity = float(len(os.sched_getaffinity(0)))
    assert available_cpus(tmp_path) == (affinity if limit is None else min(affinity, limit))


class _B3Like(TextMapPropagator):
    """A propagator of other headers than W3C's (as OTEL_PROPAGATORS=b3 or jaeger sets)."""

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return context

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        pass

    @property
    def fields(self) -> set[str]:
        return {"X-B3-TraceId", "X-B3-SpanId"}


def test_a_worker_forwards_the_headers_of_the_propagators_the_engine_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine extracts a request's context with the configured propagators (OTEL_PROPAGATORS, inherited by the
    workers): their headers reach it, not only W3C's."""
    headers = [(b"x-b3-traceid", b"1"), (b"x-b3-spanid", b"2"), (b"baggage", b"k=v"), (b"content-type", b"x")]
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", CompositePropagator([_B3Like(), W3CBaggagePropagator()]))
    assert ForwardTracing().start("m", None, headers).headers == headers[:3]


async def test_outputs_of_a_reply_whose_caller_left_as_it_came_go_back_to_the_engine() -> None:
    """The reply came (its waiter done) and the caller was cancelled before it read it (its client went away in
    the same turn): nobody copies the outputs out, so their blocks of the engine's arena are released all the
    same, or the arena fills up and every large tensor goes inline from then on."""
    arena, engine_arena = OwnedArena(1 << 20), OwnedArena(1 << 20)
    link = EngineLink(arena, ArenaView(engine_arena.fd, engine_arena.size), 0)
    reader, sent = FrameReader(), list[Any]()
    transport = type("T", (), {"write": lambda self, data: sent.extend(map(_wire.decode_to_engine, reader.feed(data)))})
    link.connection_made(transport())
    data = np.ones((1, 40_000), np.float32)
    call = asyncio.ensure_future(RemoteDataPlane(link, None).infer("m", None, InferRequest([])))
    await asyncio.sleep(0.01)
    blocks: list[tuple[int, int]] = []
    response = InferResponse("m", "1", [Tensor("Y", "FP32", data.shape, data)])
    link.data_received(frame(_wire.reply_for(sent[0].id, response, True, engine_arena, blocks)))
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.sleep(0.01)
    assert blocks
    assert [m.blocks for m in sent if isinstance(m, _wire.Release)] == [blocks]


class _Recorder:
    def __init__(self) -> None:
        self.attributes: dict[str, Any] = {}
        self.ended: int | None = None

    def request(self, request_id: str | None) -> None:
        pass

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def end(self, status: int, error: BaseException | None) -> None:
        self.ended = status


async def test_the_span_of_a_grpc_call_through_a_worker_is_a_grpc_span() -> None:
    """As in one process (``grpc._status._end_trace``): rpc.system and the call's gRPC status code on its span."""
    plane = _Plane([Tensor("Y", "BYTES", (1,), np.array([None], dtype=np.object_))])  # cannot be packed: INTERNAL
    spans: list[_Recorder] = []

    class _Tracing:
        def start(self, *args: Any) -> _Recorder:
            spans.append(_Recorder())
            return spans[-1]

    plane.tracing = _Tracing()
    link, transport = _link(plane)
    data = np.ones((1, 4), np.float32)
    for ident, endpoint in ((1, "ModelInfer RPC"), (2, "HTTP end point")):
        call = call_for(ident, "m", None, InferRequest([Tensor("X", "FP32", data.shape, data)]),
                        endpoint=endpoint, trace_headers=[], arena=None, blocks=[])  # fmt: skip
        link.data_received(frame(call))
    await asyncio.sleep(0.05)
    assert len(transport.replies) == 2
    grpc_span, http_span = spans
    assert grpc_span.attributes == {"rpc.system": "grpc", "rpc.grpc.status_code": 13}
    assert grpc_span.ended == 500
    assert http_span.attributes == {}
    assert http_span.ended == 500


def test_a_large_frame_is_cut_in_linear_time() -> None:
    """A tensor larger than the arena crosses inline, in a frame that arrives in many reads: joined once when
    whole, not again at every read (64 MiB in 256 KiB reads took 25 s, the engine's loop blocked all along)."""
    size = 64 << 20
    data = _wire.HEADER.pack(size) + bytes(size)
    reader, frames = FrameReader(), []
    began = time.perf_counter()
    for i in range(0, len(data), 256 * 1024):
        frames += reader.feed(data[i : i + 256 * 1024])
    assert time.perf_counter() - began < 2
    assert [len(f) for f in frames] == [size]


async def test_a_worker_that_cannot_be_started_fails_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawning a worker can fail (no such interpreter, no processes left): ``start`` says so (the server exits 1)
    instead of waiting for ever for a worker that never came."""
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    ingest = Ingest(ServeOptions(model_repository="/nonexistent", workers=1, ingest_arena_bytes=1 << 20))
    try:
        with pytest.raises(OSError, match="ingest worker 0"):
            await asyncio.wait_for(ingest.start(_Plane()), 10)  # type: ignore[arg-type]
    finally:
        await ingest.stop(0)
