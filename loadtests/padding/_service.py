"""The padding benchmark's service rows (``bench_padding``): doc_classifier as it runs (modelsvc + logicd) on a
mix of short and long documents, its model config without (before) and with (after) the padding keys.

Each side is a temporary copy of services/doc_classifier (model.onnx hard-linked, else copied) whose
config.pbtxt is rewritten; services/ itself is never edited. Both pairs run at once and are measured in turns.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtests.harness import _servers
from loadtests.harness._documents import all_short_documents, long_documents
from loadtests.loadgen._inputs import Target, http_request
from loadtests.padding._load import Payload
from loadtests.padding._models import MINILM_PADDING, build_minilm, link_or_copy, with_padding, without_padding

SERVICE = _servers.ROOT / "services" / "doc_classifier"
SIDES = ("before", "after")
LONG_TOKENS = (300, 1500)
"""Long documents of 300 to 1,500 tokens (1 to 3 windows of 512); one body in four is a long one."""
PROBABILITY_TOLERANCE = 1e-3


def write_service_copy(dest: Path, padding: bool) -> Path:
    """services/doc_classifier copied to ``dest`` on MiniLM's ONNX Runtime fp32 build (whatever backend the
    service itself is built for here) with the model's config without or with the padding keys."""
    onnx = build_minilm()
    shutil.copytree(SERVICE, dest, ignore=shutil.ignore_patterns("model.*", "__pycache__"))
    link_or_copy(onnx, dest / "model_repository" / "minilm" / "1" / "model.onnx")
    config = dest / "model_repository" / "minilm" / "config.pbtxt"
    text = without_padding((onnx.parents[1] / "config.pbtxt").read_text())
    config.write_text(with_padding(text, MINILM_PADDING) if padding else text)
    return dest


@dataclass
class Pair:
    """One running side: the logic server's URL, the model server's URLs and process ids."""

    side: str
    url: str
    model_url: str
    metrics_url: str
    pids: tuple[int, ...]


def metrics_url_of(server: _servers.ServerProcess) -> str:
    return f"http://127.0.0.1:{server.argv[server.argv.index('--metrics-port') + 1]}"


@contextmanager
def pairs(workdir: Path) -> Iterator[dict[str, Pair]]:
    with ExitStack() as stack:
        out = {}
        for side in SIDES:
            folder = write_service_copy(workdir / f"doc_classifier_{side}", padding=side == "after")
            model = stack.enter_context(_servers.modelsvc_server(folder / "model_repository", 120.0))
            logic = stack.enter_context(_servers.logicd_server(folder, model.base_url, 120.0))
            assert model.proc is not None
            assert logic.proc is not None
            out[side] = Pair(side, logic.base_url, model.base_url, metrics_url_of(model),
                             (model.proc.pid, logic.proc.pid))  # fmt: skip
        yield out


def documents(seed: int) -> list[str]:
    """The mix: the 18 short news items of documents.json and six long documents, a long one every fourth."""
    shorts = all_short_documents()
    longs = [text for _, text in long_documents(6, *LONG_TOKENS, seed=seed)]
    mixed: list[str] = []
    while shorts or longs:
        mixed.extend(shorts[:3])
        shorts = shorts[3:]
        mixed.extend(longs[:1])
        longs = longs[1:]
    return mixed


def classify_one(url: str, text: str) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/classify", json={"documents": [text]}, timeout=120)
    response.raise_for_status()
    result: dict[str, Any] = response.json()["results"][0]
    return result


def service_pools(sides: dict[str, Pair], seed: int) -> tuple[dict[str, list[Payload]], str]:
    """Each side's requests, one document each. The reference of a document is its answer from the "before"
    side alone; every answer (both sides, warm-up included) must give its label, window count, and every
    label's probability within PROBABILITY_TOLERANCE. Also says how the two sides agreed alone."""
    texts = documents(seed)
    references = [classify_one(sides["before"].url, text) for text in texts]
    worst = 0.0
    for text, ref in zip(texts, references, strict=True):
        problem = _compare(classify_one(sides["after"].url, text), ref)
        if problem is not None:
            raise RuntimeError(f"doc_classifier after differs from before on one document alone: {problem}")
        worst = max(worst, _worst_difference(classify_one(sides["after"].url, text), ref))
    pools = {}
    for side, pair in sides.items():
        host, port = Target(pair.url).host_port
        payloads = []
        for text, ref in zip(texts, references, strict=True):
            body = json.dumps({"documents": [text]}).encode()
            request = http_request("POST", host, port, "/v1/classify", body, {"Content-Type": "application/json"})
            payload = Payload(request, int(ref["tokens"]), int(ref["tokens"]))
            payload.check = _check(ref)
            payloads.append(payload)
        pools[side] = payloads
    tokens = [int(r["tokens"]) for r in references]
    note = (f"{len(texts)} documents of {min(tokens)}-{max(tokens)} tokens; after vs before alone: same labels and "
            f"window counts, probabilities within {worst:.1e}")  # fmt: skip
    return pools, note


def _worst_difference(got: dict[str, Any], ref: dict[str, Any]) -> float:
    theirs = {s["label"]: s["probability"] for s in ref["scores"]}
    return max(abs(float(s["probability"]) - float(theirs[s["label"]])) for s in got["scores"])


def _compare(got: dict[str, Any], ref: dict[str, Any]) -> str | None:
    if got["label"] != ref["label"] or got["chunks"] != ref["chunks"]:
        return f"label {got['label']} in {got['chunks']} windows instead of {ref['label']} in {ref['chunks']}"
    if {s["label"] for s in got["scores"]} != {s["label"] for s in ref["scores"]}:
        return "other labels scored"
    diff = _worst_difference(got, ref)
    if not diff <= PROBABILITY_TOLERANCE:
        return f"a probability differs by {diff:.1e} from the document's answer alone"
    return None


def _check(ref: dict[str, Any]) -> Any:
    def check(answer: dict[str, Any]) -> str | None:
        return _compare(answer["results"][0], ref)

    return check


def decode_json(body: bytes) -> Any:
    return json.loads(body)
