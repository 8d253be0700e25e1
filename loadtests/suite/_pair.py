"""The benchmark suite's pair rows: doc_classifier as it runs in production (modelsvc + logicd, two processes) vs
loadtests/naive_service.py (one process, ONNX Runtime per window, no batching) on long documents, behind a
correctness guard (both give the same labels)."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import ExitStack
from typing import Any

import httpx

from loadtests.harness import _servers
from loadtests.harness._documents import long_documents
from loadtests.suite._rows import Row, Settings, Stats, json_load, median, spread

BUILD_COMMAND = [sys.executable, "-m", "services.build"]
"""The documented build of the example services' models (README.md), run from the repository root."""
ONNX_SOURCE = _servers.ROOT / "services" / "embedder" / "model_repository" / "minilm" / "1" / "model.onnx"
"""MiniLM as ONNX Runtime fp32 runs it, which both sides of the pair rows serve."""


def classify(base: str, documents: list[str]) -> list[dict[str, Any]]:
    response = httpx.post(f"{base}/v1/classify", json={"documents": documents}, timeout=120)
    response.raise_for_status()
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def correctness_guard(pair: str, naive: str, documents: list[str]) -> tuple[bool, str, list[dict[str, Any]]]:
    """Both services give each document the same label, probabilities within 1e-3, and the same window count;
    also the pair's answers."""
    ours, theirs = classify(pair, documents), classify(naive, documents)
    same = 0
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        pa = {s["label"]: s["probability"] for s in a["scores"]}
        pb = {s["label"]: s["probability"] for s in b["scores"]}
        diff = max(abs(pa[k] - pb[k]) for k in pa)
        worst = max(worst, diff)
        same += a["label"] == b["label"] and a["chunks"] == b["chunks"] and diff < 1e-3
    ok = same == len(documents)
    return ok, f"labels agree {same}/{len(documents)} (max probability difference {worst:.1e})", ours


def bench_pair(settings: Settings) -> list[Row]:
    subprocess.run(BUILD_COMMAND, cwd=_servers.ROOT, check=True)  # builds what is missing, else does nothing
    docs = long_documents(24, *settings.pair_tokens, seed=8)
    bodies = [json.dumps({"documents": [text]}).encode() for _, text in docs]
    # both sides on one model, ONNX Runtime fp32: the embedder's build of MiniLM (the same config as the
    # classifier's; auto builds it so on every CPU, where the classifier may be OpenVINO bf16)
    repository = ONNX_SOURCE.parents[2]
    with ExitStack() as stack:
        print("  starting doc_classifier (modelsvc + logicd) and the naive service", flush=True)
        pair = stack.enter_context(_servers.service_pair("doc_classifier", model_repository=repository))
        naive = stack.enter_context(_servers.naive_service(ONNX_SOURCE))
        ok, guard, answers = correctness_guard(pair, naive, [text for _, text in docs[:6]])
        if not ok:
            raise RuntimeError(f"correctness guard failed: {guard}")
        tokens = [r["tokens"] for r in answers]
        per: dict[int, tuple[list[Stats], list[Stats]]] = {c: ([], []) for c in settings.pair_concurrency}
        for i in range(settings.rounds):
            for c in settings.pair_concurrency:
                print(f"  pair vs naive round {i + 1}/{settings.rounds}, c={c}", flush=True)
                per[c][0].append(json_load(f"{pair}/v1/classify", bodies, c, settings.seconds))
                per[c][1].append(json_load(f"{naive}/v1/classify", bodies, c, settings.seconds))
    rows = []
    for c, (ours, theirs) in per.items():
        errors = sum(s.errors for s in ours + theirs)
        if errors:
            raise RuntimeError(f"{errors} failed requests at c={c}")
        ratios = [a.per_s / b.per_s for a, b in zip(ours, theirs, strict=True)]

        def side(stats: list[Stats]) -> str:
            return (f"{median([s.per_s for s in stats]):.2f} docs/s, p50 {median([s.p50_ms for s in stats]):.0f} ms, "
                    f"p99 {median([s.p99_ms for s in stats]):.0f} ms")  # fmt: skip

        rows.append(
            Row(
                f"pair / naive, long documents, c={c}",
                side(ours),
                side(theirs),
                median(ratios),
                f"{settings.pair_tokens[0]}-{settings.pair_tokens[1]} tokens/doc (e.g. {min(tokens)}-{max(tokens)}); "
                f"{guard}; rounds {spread(ratios)}",
                ratios,
                {"correct": ok},
            )
        )
    return rows
