"""doc_classifier end to end, as the README runs it: `logicd up` starts modelsvc and the logic server as two
processes, sends example.json, and then the pair serves concurrent requests over real sockets."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests._server import ROOT, Up, free_port

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
DOCUMENTS: dict[str, list[str]] = json.loads((HERE / "documents.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def up(built: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Up, str, str]]:
    running = Up(tmp_path_factory.mktemp("up"), str(ROOT / "services" / "doc_classifier"), "--port", str(free_port()))
    try:
        running.wait_for(r"^logicd up: doc-classifier is ready$", timeout=180)
        out = running.output()
        logic = re.search(r"logic server\s+(http://\S+)", out)
        model = re.search(r"model service\s+(http://\S+)", out)
        assert logic, out
        assert model, out
        yield running, logic[1], model[1]
        running.proc.send_signal(signal.SIGTERM)
        assert running.wait() == 0, running.output() + running.errors()
    finally:
        running.close()


def test_up_sends_the_example_and_shows_a_real_answer(up):
    running, logic, _ = up
    shown = running.wait_for(r"^logicd up: example\.json sent to POST /v1/classify: 200 in \d+ ms$", timeout=60)
    answer = running.output()[shown.end() :]
    assert re.search(r'^\s+"label": "sports",$', answer, re.M), answer
    curl = re.search(
        r"curl -X POST (http://\S+) -H 'content-type: application/json' -d '(.*)'$", running.output(), re.M
    )
    assert curl, running.output()
    assert curl[1] == f"{logic}/v1/classify"
    r = httpx.post(curl[1], content=curl[2], headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["label"] == "sports"


def test_concurrent_requests_of_every_size_are_all_answered_right(up):
    _, logic, model = up
    long_doc = " ".join(DOCUMENTS["technology"] * 50)
    requests = [{"documents": texts} for texts in DOCUMENTS.values()] + [{"documents": long_doc}] * 4
    expected = list(DOCUMENTS) + ["technology"] * 4

    # a caller that waits 120 s says so (Request-Timeout): a burst the pair works off within it waits its turn,
    # however slow the machine, where one without a deadline gets the service's 6 s budget
    deadline = {"Request-Timeout": "110"}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            posts = (client.post(f"{logic}/v1/classify", json=body, headers=deadline) for body in requests * 2)
            return await asyncio.gather(*posts)

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * len(responses), [r.text for r in responses if r.is_error]
    for response, label in zip(responses, expected * 2, strict=True):
        results = response.json()["results"]
        assert {res["label"] for res in results} == {label}
    stats = httpx.get(f"{model}/v2/models/minilm/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] > 0
    metrics = httpx.get(f"{logic}/metrics").text
    assert 'logicd_stage_duration_seconds_count{route="/v1/classify",stage="model"}' in metrics


def test_a_bad_request_is_a_problem_and_the_pair_keeps_serving(up):
    _, logic, _ = up
    r = httpx.post(f"{logic}/v1/classify", json={"documents": ["ok", ""]})
    assert r.status_code == 422
    assert r.json()["field"] == "documents[1]"
    r = httpx.post(f"{logic}/v1/classify", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert httpx.post(f"{logic}/v1/classify", json={"documents": DOCUMENTS["sports"][1]}, timeout=60).status_code == 200
