"""Load for the embedder with locust: OpenAI-style embeddings of one text and of batches of texts.

    locust -f loadtests/locust/embedder.py --host http://127.0.0.1:8081 --headless -u 8 -r 4 -t 30s

Each simulated user sends, by weight: one short text (5), a batch of 8 texts (3), a batch of 32 (1), and one
text with ``encoding_format: base64`` as OpenAI's SDKs send it (2). Every answer is checked: status 200,
``object: "list"``, one 384-dimension unit vector per input in input order, and token usage. A wrong answer counts
as a failure in locust's statistics.
"""

from __future__ import annotations

import base64
import math
import random
import struct
import sys
from pathlib import Path
from typing import Any

from locust import FastHttpUser, between, task

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the `locust` script puts only this file's folder on sys.path
    sys.path.insert(0, str(ROOT))

from loadtests.harness._documents import all_short_documents  # noqa: E402

TEXTS = all_short_documents()
DIMENSIONS = 384
MODEL = "all-MiniLM-L6-v2"


def vector(item: dict[str, Any], encoding: str) -> list[float]:
    """The floats of one ``data`` entry, decoding base64 (little-endian float32) when asked for."""
    value = item["embedding"]
    if encoding == "base64":
        raw = base64.b64decode(value)
        return [x for (x,) in struct.iter_unpack("<f", raw)]
    return list(value)


def problem(answer: Any, inputs: list[str], encoding: str) -> str | None:
    """What is wrong with a /v1/embeddings answer for ``inputs``, or None when it has OpenAI's shape."""
    if not isinstance(answer, dict) or answer.get("object") != "list":
        return "not an OpenAI list object"
    data = answer.get("data")
    if not isinstance(data, list) or len(data) != len(inputs):
        return f"{len(data) if isinstance(data, list) else 'no'} embeddings for {len(inputs)} inputs"
    for i, item in enumerate(data):
        if item.get("index") != i or item.get("object") != "embedding":
            return f"entry {i}: index {item.get('index')!r}, object {item.get('object')!r}"
        values = vector(item, encoding)
        if len(values) != DIMENSIONS:
            return f"entry {i}: {len(values)} dimensions"
        if not math.isclose(math.fsum(v * v for v in values), 1.0, abs_tol=1e-4):
            return f"entry {i}: not a unit vector"
    usage = answer.get("usage", {})
    if not usage.get("prompt_tokens", 0) >= len(inputs):
        return f"usage {usage!r}"
    return None


class EmbedderUser(FastHttpUser):
    """A client of POST /v1/embeddings."""

    wait_time = between(0.0, 0.2)

    def embed(self, inputs: list[str], name: str, encoding: str = "float") -> None:
        body: dict[str, Any] = {"input": inputs[0] if len(inputs) == 1 else inputs, "model": MODEL}
        if encoding != "float":
            body["encoding_format"] = encoding
        with self.client.post("/v1/embeddings", json=body, name=name, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"status {response.status_code}: {response.text[:200]}")
                return
            wrong = problem(response.json(), inputs, encoding)
            if wrong:
                response.failure(wrong)

    @task(5)
    def one(self) -> None:
        self.embed([random.choice(TEXTS)], "/v1/embeddings [1]")

    @task(3)
    def batch_8(self) -> None:
        self.embed(random.choices(TEXTS, k=8), "/v1/embeddings [8]")

    @task(1)
    def batch_32(self) -> None:
        self.embed(random.choices(TEXTS, k=32), "/v1/embeddings [32]")

    @task(2)
    def one_base64(self) -> None:
        self.embed([random.choice(TEXTS)], "/v1/embeddings [1, base64]", encoding="base64")
