"""Test documents for load: the short news sentences of services/doc_classifier/tests/documents.json, and long
documents built from them (for the locustfiles and for the pair-vs-naive benchmark).

A long document is about one topic: four sentences in five come from its label's sentences, the rest from the
other labels, in a seeded random order, until it reaches the asked number of words (about 1.3 MiniLM tokens per
word for these sentences).
"""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

DOCUMENTS_JSON = Path(__file__).resolve().parents[2] / "services" / "doc_classifier" / "tests" / "documents.json"
TOKENS_PER_WORD = 1.3
"""Measured on documents.json with the service's tokenizer (about 1.25-1.35), for sizing documents in tokens."""


@cache
def short_documents() -> dict[str, tuple[str, ...]]:
    """Label -> its short documents."""
    data: dict[str, list[str]] = json.loads(DOCUMENTS_JSON.read_text(encoding="utf-8"))
    return {label: tuple(texts) for label, texts in data.items()}


def all_short_documents() -> list[str]:
    """Every short document, label by label."""
    return [text for texts in short_documents().values() for text in texts]


def long_document(label: str, tokens: int, seed: int = 0) -> str:
    """A document of about ``tokens`` tokens mostly about ``label``."""
    docs = short_documents()
    own = docs[label]
    others = [t for other, texts in docs.items() if other != label for t in texts]
    rng = random.Random(f"{label}-{tokens}-{seed}")
    words_wanted = tokens / TOKENS_PER_WORD
    parts: list[str] = []
    words = 0
    while words < words_wanted:
        text = rng.choice(others) if rng.random() < 0.2 else rng.choice(own)
        parts.append(text)
        words += len(text.split())
    return " ".join(parts)


def long_documents(count: int, min_tokens: int, max_tokens: int, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` (label, document) pairs of ``min_tokens`` to ``max_tokens`` tokens, labels in turn."""
    labels = list(short_documents())
    rng = random.Random(seed)
    out = []
    for i in range(count):
        label = labels[i % len(labels)]
        out.append((label, long_document(label, rng.randint(min_tokens, max_tokens), seed=seed * 100_003 + i)))
    return out
