"""Embedded mode: the engine in-process behind the client's API behaves as the model service does."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from logicd._embedded import EmbeddedModelService
from modelsvc.client import AsyncClient, Client, InvalidInput, ModelNotFound


@pytest.fixture
async def engine(main_repository):
    service = EmbeddedModelService(main_repository)
    await service.start()
    yield service
    await service.close()


async def test_same_answers_as_the_model_service_over_http(engine, server):
    ids = np.random.default_rng(3).integers(0, 1000, (2, 40), dtype=np.int64)
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    async with AsyncClient(binding=engine.binding()) as embedded:
        local = (await (await embedded.model("token")).infer(inputs))["logits"]
    with Client(server.url) as remote:
        over_http = remote.model("token").infer(inputs)["logits"]
    np.testing.assert_allclose(local, over_http, rtol=1e-6)


async def test_typed_handles_errors_and_datatypes(engine):
    async with AsyncClient(binding=engine.binding()) as client:
        assert await client.server_ready()
        add_sub = await client.model("add_sub")
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        out = await add_sub.infer(INPUT0=a, INPUT1=a)
        assert np.array_equal(out["OUTPUT0"], 2 * a)
        words = await (await client.model("identity_bytes")).infer(INPUT0=[["a", "b", "c", "d"]])
        assert words["OUTPUT0"].tolist() == [[b"a", b"b", b"c", b"d"]]
        with pytest.raises(ModelNotFound):
            await client.model("nope")
        with pytest.raises(InvalidInput) as info:  # refused by the engine's own checks, as over HTTP
            await client.infer("identity", {"INPUT0": np.ones((1, 17), np.float32)})
        assert info.value.status == 400


async def test_concurrent_callers_are_batched_and_counted_as_by_the_model_service(engine):
    async with AsyncClient(binding=engine.binding()) as client:
        token = await client.model("token")
        ids = np.ones((1, 32), np.int64)
        await asyncio.gather(*(token.infer(input_ids=ids * i, attention_mask=ids) for i in range(24)))
    stats = engine.dataplane.statistics("token")["model_stats"][0]
    assert stats["inference_count"] == 24
    assert stats["execution_count"] < 24
    metrics = engine.metrics.render().decode()
    assert 'nv_inference_request_success{model="token",version="1"} 24.0' in metrics
