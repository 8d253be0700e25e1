"""logicd's per-document sequences (``Context.infer_sequence``) on a real modelsvc with a sequence model that
keeps running totals per sequence: each document's windows arrive in order as one sequence, and its row is the
state after its last window, also with many documents in flight at once (more than the model's slots), and a
document whose sequence is lost mid-way is sent again from its first window."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from logicd import Context, Service
from modelsvc.client import AsyncInferSequence, SequenceLost
from tests._edge_app import WORDS, serve, service_yaml
from tests._server import ModelsvcProcess

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[1] / "data" / "edge_docseq"


class Docs(msgspec.Struct):
    texts: list[str]


class Totals(msgspec.Struct):
    model: list[list[int]]
    """The model's [windows, tokens, id sum] after each document's last window."""
    expected: list[list[int]]
    """The same, counted here from the document's windows."""


service = Service()


@service.post("/v1/totals")
async def totals(request: Docs, ctx: Context) -> Totals:
    chunks = await ctx.chunk(request.texts)
    rows = await ctx.infer_sequence("doc_state", chunks, "TOTAL")
    expected = [
        [len(span), sum(len(chunks.input_ids[i]) for i in span), sum(int(chunks.input_ids[i].sum()) for i in span)]
        for span in chunks.spans
    ]
    return Totals(rows.tolist(), expected)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with ModelsvcProcess(REPO) as models:
        config = service_yaml(tmp_path_factory.mktemp("docseq"), f"grpc://127.0.0.1:{models.grpc_port}", ["doc_state"])
        with serve(service, config) as url:
            yield url


def _text(words: int, shift: int) -> str:
    return " ".join(WORDS[(i * 3 + shift) % len(WORDS)] for i in range(words))


def test_each_document_is_one_sequence_and_its_row_is_the_final_state(base: str) -> None:
    texts = [_text(3, 0), _text(20, 1), _text(45, 2)]  # 1, 4 and 8 windows of at most 6 words
    answer = httpx.post(f"{base}/v1/totals", json={"texts": texts}, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == body["expected"]
    assert [row[0] for row in body["model"]] == [1, 4, 8]


def test_many_documents_in_flight_keep_their_own_state(base: str) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            answers = await asyncio.gather(
                *(
                    client.post("/v1/totals", json={"texts": [_text(5 + 7 * k, k), _text(30 - k, k + 1)]})
                    for k in range(6)
                )
            )
        for answer in answers:
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == answer.json()["expected"]

    asyncio.run(main())


def test_a_document_whose_sequence_is_lost_is_sent_again_from_its_first_window(
    base: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The loss of a replica mid-document (``SequenceLost`` on the document's second window, injected once
    here) makes logicd send the document's windows again as a new sequence: the row is still the whole
    document's."""
    real = AsyncInferSequence.infer
    lost: list[int | str] = []

    async def infer(self: AsyncInferSequence, *args: Any, **kwargs: Any) -> Any:
        if self.steps == 1 and not lost:
            lost.append(self.id)
            raise SequenceLost(f"sequence {self.id!r}: its replica failed mid-sequence (injected)")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(AsyncInferSequence, "infer", infer)
    with caplog.at_level(logging.WARNING, logger="logicd"):
        answer = httpx.post(f"{base}/v1/totals", json={"texts": [_text(30, 3)]}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == answer.json()["expected"]
    assert lost
    assert "sending its windows again from the first" in caplog.text
