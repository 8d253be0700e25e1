"""The padding benchmark's models (``bench_padding``): a repository per model with one config per way of
sending, the request pools of each way, and the check of every answer.

Ways: (a) natural lengths, plain dynamic batcher (Triton's behaviour); (b) every request padded to 256 by the
client, same config; (c) natural lengths, padding-aware batching (the ``pad_*`` parameters). Each way has a model
of its own in the repository (``<family>_a``, ``_b``, ``_c``), so each has its own statistics and metrics.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loadtests.harness._servers import ROOT
from loadtests.padding._load import (
    MAX_TOKENS,
    Array,
    Check,
    Payload,
    bert_inputs,
    draw_lengths,
    infer_once,
    token_rows,
    v2_payload,
)

WAYS = ("a", "b", "c")
WAY_NAMES = {
    "a": "(a) natural lengths, dynamic batcher",
    "b": "(b) padded to 256 by the client",
    "c": "(c) natural lengths, padding-aware",
}
PAD_KEYS = ("pad_inputs", "pad_outputs", "pad_buckets", "max_batch_tokens", "pad_call_cost_tokens")
QUEUE_DELAY = "dynamic_batching {\n  max_queue_delay_microseconds: 2000\n}\n"

MINILM_SOURCE = ROOT / "services" / "embedder" / "model_repository" / "minilm"
"""The services' MiniLM as ONNX Runtime fp32 runs it: the embedder's build (``auto`` builds it so on every CPU)."""
BUILD_COMMAND = [sys.executable, "-m", "services.build"]
"""The documented build of the example services' models; builds what is missing, else does nothing. Its auto
builds the embedder (MINILM_SOURCE) for ONNX Runtime fp32 on every CPU; ``--backend onnxruntime`` here would
rebuild the classifier's model away from what auto gives it, and the next auto build would export it again."""

MINILM_PADDING = {
    "pad_inputs": "input_ids:0=0,attention_mask:0=0,token_type_ids:0=0",
    "pad_outputs": "last_hidden_state:0",
}
ACCEL_PADDING = {
    "pad_inputs": "input_ids:0=0,attention_mask:0=0",
    "pad_outputs": "ids_out:0",
    # 5 ms per call / 10 us per padded token
    "pad_call_cost_tokens": "500",
}
MINILM_TOLERANCE = 1e-4
"""Largest difference allowed between an answer's sentence_embedding and the same request's answer alone."""

ACCEL_CALL_S, ACCEL_TOKEN_S = 0.005, 10e-6

ACCEL_MODEL_PY = f'''\
"""A python model that costs what an accelerator does: {ACCEL_CALL_S * 1000:g} ms per call plus
{ACCEL_TOKEN_S * 1e6:g} us per padded token of the batch it receives (rows x the longest request's length),
sleeping. Its answers depend on each request's own tokens: total = sum of input_ids where attention_mask is 1,
ids_out = input_ids x mask."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        ids = [pb_utils.get_input_tensor_by_name(r, "input_ids").as_numpy() for r in requests]
        masks = [pb_utils.get_input_tensor_by_name(r, "attention_mask").as_numpy() for r in requests]
        rows = sum(a.shape[0] for a in ids)
        length = max(a.shape[1] for a in ids)
        time.sleep({ACCEL_CALL_S!r} + {ACCEL_TOKEN_S!r} * rows * length)
        responses = []
        for a, m in zip(ids, masks):
            own = (a * m).astype(np.int64)
            total = own.sum(axis=1, keepdims=True).astype(np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("total", total),
                                                         pb_utils.Tensor("ids_out", own)]))
        return responses
'''

ACCEL_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 16
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [
  {{ name: "total" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "ids_out" data_type: TYPE_INT64 dims: [ -1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def parameters_text(params: dict[str, str]) -> str:
    return "".join(
        f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n' for key, value in params.items()
    )


_PAD_PARAMETER = re.compile(
    r'parameters\s*\{\s*key:\s*"(?:' + "|".join(PAD_KEYS) + r')"\s*value\s*\{[^{}]*\}\s*\}\s*', re.S
)


def without_padding(config: str) -> str:
    """A config text with every padding-aware key removed (so a service config that already has them gives
    the plain dynamic batcher)."""
    return _PAD_PARAMETER.sub("", config)


def renamed(config: str, name: str) -> str:
    return re.sub(r'^name:\s*"[^"]*"', f'name: "{name}"', config, count=1, flags=re.M)


def with_padding(config: str, params: dict[str, str]) -> str:
    return without_padding(config).rstrip("\n") + "\n" + parameters_text(params)


def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def build_minilm() -> Path:
    """``python -m services.build`` (a subprocess, from the repository root); the exported model.onnx."""
    subprocess.run(BUILD_COMMAND, cwd=ROOT, check=True)
    onnx = MINILM_SOURCE / "1" / "model.onnx"
    if not onnx.exists():
        raise RuntimeError(f"{' '.join(BUILD_COMMAND)} did not write {onnx}")
    return onnx


@dataclass
class Family:
    """One model under test: its repository (three models, one per way) and each way's request pool."""

    name: str
    repo: Path
    pools: dict[str, list[Payload]] = field(default_factory=dict)
    padding: dict[str, str] = field(default_factory=dict)
    worst: dict[str, float] = field(default_factory=dict)
    """Per way, the largest difference from the reference seen in an answer (MiniLM)."""
    references: dict[str, int] = field(default_factory=dict)
    """Per way, the requests sent alone for references before the load (MiniLM's (a))."""

    def model(self, way: str) -> str:
        return f"{self.name}_{way}"


def write_minilm(repo: Path, kind: str = "KIND_CPU") -> Family:
    """MiniLM's three ways; ``kind`` KIND_GPU puts its instance on a GPU (the GPU verification script's rows)."""
    onnx = build_minilm()
    base = without_padding((MINILM_SOURCE / "config.pbtxt").read_text()).replace("kind: KIND_CPU", f"kind: {kind}")
    family = Family("minilm", repo, padding=MINILM_PADDING)
    for way in WAYS:
        text = renamed(base, family.model(way))
        if way == "c":
            text = with_padding(text, MINILM_PADDING)
        (repo / family.model(way)).mkdir(parents=True)
        (repo / family.model(way) / "config.pbtxt").write_text(text)
        link_or_copy(onnx, repo / family.model(way) / "1" / "model.onnx")
    return family


def write_accelerator(repo: Path) -> Family:
    family = Family("accel", repo, padding=ACCEL_PADDING)
    for way in WAYS:
        folder = repo / family.model(way)
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.py").write_text(ACCEL_MODEL_PY)
        text = ACCEL_CONFIG.format(name=family.model(way)) + QUEUE_DELAY
        if way == "c":
            text = with_padding(text, ACCEL_PADDING)
        (folder / "config.pbtxt").write_text(text)
    return family


def _sent_length(way: str, ids: Array) -> int:
    return MAX_TOKENS if way == "b" else len(ids)


def accelerator_pools(family: Family, url: str, pool: int, seed: int) -> None:
    """Each way's requests; an answer is right when total is the sum of the request's own ids and ids_out is
    exactly what it sent (its own ids, zeros past them), at the length it sent."""
    rows = token_rows(draw_lengths(pool, seed), seed)
    for way in WAYS:
        payloads = []
        for ids in rows:
            tensors = bert_inputs(ids, _sent_length(way, ids), token_types=False)
            payload = v2_payload(url, family.model(way), tensors, ("total", "ids_out"), len(ids))
            payload.check = _accel_check(int(ids.sum()), tensors["input_ids"])
            payloads.append(payload)
        family.pools[way] = payloads


def _accel_check(total: int, ids_out: Array) -> Check:
    def check(outputs: dict[str, Array]) -> str | None:
        got = outputs["total"]
        if got.shape != (1, 1) or int(got[0, 0]) != total:
            return f"total {got.tolist()} instead of [[{total}]]"
        out = outputs["ids_out"]
        if out.shape != ids_out.shape or not np.array_equal(out, ids_out):
            return f"ids_out of shape {list(out.shape)} differs from the {list(ids_out.shape)} sent"
        return None

    return check


def minilm_pools(family: Family, url: str, pool: int, seed: int) -> None:
    """Each way's requests; the reference of a request is its natural-length answer alone from model (a)
    (one request at a time, before the load); every answer's sentence_embedding must be within
    MINILM_TOLERANCE of it, whether padded by the client (b) or batched with others."""
    rows = token_rows(draw_lengths(pool, seed), seed)
    references: list[Array] = []
    for way in WAYS:
        payloads = []
        for k, ids in enumerate(rows):
            tensors = bert_inputs(ids, _sent_length(way, ids), token_types=True)
            payload = v2_payload(url, family.model(way), tensors, ("sentence_embedding",), len(ids))
            if way == "a":
                reference = infer_once(url, payload)["sentence_embedding"].copy()
                if reference.shape != (1, 384) or not np.isfinite(reference).all():
                    raise RuntimeError(f"MiniLM answered a sentence_embedding of shape {reference.shape}")
                references.append(reference)
                family.references[way] = family.references.get(way, 0) + 1
            payload.check = _minilm_check(references[k], family.worst, way)
            payloads.append(payload)
        family.pools[way] = payloads


def _minilm_check(reference: Array, worst: dict[str, float], way: str) -> Check:
    worst.setdefault(way, 0.0)

    def check(outputs: dict[str, Array]) -> str | None:
        got = outputs["sentence_embedding"]
        if got.shape != reference.shape:
            return f"sentence_embedding of shape {list(got.shape)}"
        diff = float(np.abs(got - reference).max())
        worst[way] = max(worst[way], diff)
        if not diff <= MINILM_TOLERANCE:
            return f"sentence_embedding differs from the request's answer alone by {diff:.2e}"
        return None

    return check


def medians(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]
    return float(np.median(finite)) if finite else float("nan")
