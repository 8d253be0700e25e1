"""Load for doc_classifier with locust: a mix of short news items, batches of them, and long documents.

    locust -f loadtests/locust/doc_classifier.py --host http://127.0.0.1:8080 --headless -u 8 -r 4 -t 30s

Each simulated user sends, by weight: one short document (5), a batch of four short ones with ``top_k`` 2 (3), and
one long document of 2,000 to 4,000 tokens, cut by the service into several 512-token windows (2). Every answer is
checked: status 200, one result per document, a known label, probabilities that add up to 1 (all labels listed) and
at least the number of windows the length implies. A wrong answer counts as a failure in locust's statistics.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any

from locust import FastHttpUser, between, task

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the `locust` script puts only this file's folder on sys.path
    sys.path.insert(0, str(ROOT))

from loadtests.harness._documents import all_short_documents, long_documents, short_documents  # noqa: E402

LABELS = frozenset(short_documents())
SHORT = all_short_documents()
LONG = long_documents(24, 2000, 4000, seed=8)
WINDOW_TOKENS = 510  # service.yaml's max_tokens (512) less [CLS] and [SEP]


def problem(answer: Any, documents: list[str], top_k: int | None, min_tokens: int) -> str | None:
    """What is wrong with a /v1/classify answer for ``documents``, or None when it has the expected shape."""
    if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
        return "no results list"
    results = answer["results"]
    if len(results) != len(documents):
        return f"{len(results)} results for {len(documents)} documents"
    for result in results:
        if result.get("label") not in LABELS:
            return f"unknown label {result.get('label')!r}"
        scores = result.get("scores", [])
        if len(scores) != (top_k or len(LABELS)):
            return f"{len(scores)} scores, expected {top_k or len(LABELS)}"
        if top_k is None and not math.isclose(sum(s["probability"] for s in scores), 1.0, abs_tol=1e-6):
            return "probabilities do not add up to 1"
        if result.get("chunks", 0) < max(1, math.ceil(min_tokens / WINDOW_TOKENS)):
            return f"{result.get('chunks')} windows for a document of at least {min_tokens} tokens"
    return None


class DocClassifierUser(FastHttpUser):
    """A client of POST /v1/classify."""

    wait_time = between(0.0, 0.2)

    def classify(self, documents: list[str], name: str, top_k: int | None = None, min_tokens: int = 0) -> None:
        body: dict[str, Any] = {"documents": documents}
        if top_k is not None:
            body["top_k"] = top_k
        with self.client.post("/v1/classify", json=body, name=name, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"status {response.status_code}: {response.text[:200]}")
                return
            wrong = problem(response.json(), documents, top_k, min_tokens)
            if wrong:
                response.failure(wrong)

    @task(5)
    def short(self) -> None:
        self.classify([random.choice(SHORT)], "/v1/classify [1 short]")

    @task(3)
    def short_batch(self) -> None:
        self.classify(random.sample(SHORT, 4), "/v1/classify [4 short, top_k 2]", top_k=2)

    @task(2)
    def long(self) -> None:
        _, text = random.choice(LONG)
        self.classify([text], "/v1/classify [1 long, 2-4k tokens]", min_tokens=1500)
