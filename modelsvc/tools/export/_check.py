"""The check: the written model's runtime against PyTorch on random inputs of several shapes, padding included.

Every output is compared with ``max(abs(model - torch))`` and, for a lower precision, by the cosine
similarity of each row to PyTorch fp32's (each token's vector for per-token outputs, each
``sentence_embedding`` or ``logits`` row otherwise); the smallest one counts. For per-token outputs
(``last_hidden_state``, token-classification ``logits``) only positions whose ``attention_mask`` is 1 count:
a padded position's value means nothing, and fused kernels are free to compute it differently. The reference
is the wrapper on the model's own 2-D mask path, in float32, whichever mask the exported graph builds. The
export refuses to write the model when an fp32 output differs by more than the tolerance, or, for bf16 and
int8, the cosine of the pooled output (``sentence_embedding``; every output where there is none) falls below
the bound; every output's cosine is reported.

The runtime is ONNX Runtime for ``model.onnx``, ``torch.jit.load`` for ``model.pt`` and OpenVINO's CPU
plugin for ``model.xml`` (``_runners``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._errors import ExportError
from ._inputs import SEED, Feeds, longest, random_inputs
from ._load import Torch
from ._wrapper import Plan

__all__ = ["Comparison", "Run", "check"]

# (batch, sequence) of the random inputs the check runs; every case but the first pads some rows
_CHECK_SHAPES = ((1, 7), (3, 33), (2, 64))

#: feeds in, the plan's outputs (in order) out
Run = Callable[[Feeds], Sequence[npt.NDArray[Any]]]


@dataclass(frozen=True)
class Comparison:
    """Per output: the largest abs difference, the smallest row cosine, and the input shape where each was."""

    max_abs_diff: dict[str, float]
    min_cosine: dict[str, float]
    where: dict[str, str]


def _rows(values: npt.NDArray[np.float64], per_token: bool, keep: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    if per_token:
        return values[keep].reshape(int(keep.sum()), -1)
    return values.reshape(values.shape[0], -1)


def _min_cosine(ours: npt.NDArray[np.float64], theirs: npt.NDArray[np.float64]) -> float:
    if not ours.size:
        return 1.0
    dot = (ours * theirs).sum(axis=1)
    norms = np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
    cosine = np.where(norms > 0, dot / np.maximum(norms, 1e-30), np.where(np.abs(ours).sum(axis=1) == 0, 1.0, 0.0))
    value = float(cosine.min())
    return value if math.isfinite(value) else -1.0


def _random_cases(config: Any, plan: Plan) -> list[Feeds]:
    rng = np.random.default_rng(SEED + 1)
    limit = longest(config)
    return [
        random_inputs(rng, config, plan, batch, min(length, limit), pad=index > 0)
        for index, (batch, length) in enumerate(_CHECK_SHAPES)
    ]


def check(mods: Torch, reference: Any, run: Run, config: Any, plan: Plan, cases: Sequence[Feeds] = ()) -> Comparison:
    """Per output, how far ``run`` is from ``reference`` (a float32 PyTorch module) over ``cases`` (by default
    the check's random inputs)."""
    torch = mods.torch
    worst = dict.fromkeys(plan.output_names, 0.0)
    cosines = dict.fromkeys(plan.output_names, 1.0)
    where = dict.fromkeys(plan.output_names, "")
    for feeds in cases or _random_cases(config, plan):
        got = run(feeds)
        with torch.no_grad():
            expected = reference(*(torch.from_numpy(feeds[n].astype(np.int64)) for n in plan.input_names))
        keep = feeds["attention_mask"].astype(bool)
        batch, length = feeds["input_ids"].shape
        shape = f"batch {batch} x {length} tokens"
        for name, ours, theirs in zip(plan.output_names, got, expected, strict=True):
            theirs_np = theirs.detach().float().cpu().numpy().astype(np.float64)
            ours_np = np.asarray(ours).astype(np.float64)
            if ours_np.shape != theirs_np.shape:
                raise ExportError(
                    f"output {name!r} has shape {ours_np.shape} in the model, {theirs_np.shape} in PyTorch"
                )
            per_token = name in plan.per_token
            delta = np.abs(ours_np - theirs_np)
            if per_token:
                delta = delta[keep]
            diff = float(delta.max()) if delta.size else 0.0
            if not math.isfinite(diff):
                diff = math.inf
            cosine = _min_cosine(_rows(ours_np, per_token, keep), _rows(theirs_np, per_token, keep))
            if not where[name] or diff > worst[name]:
                worst[name] = diff
                where[name] = shape
            cosines[name] = min(cosines[name], cosine)
    return Comparison(worst, cosines, where)
