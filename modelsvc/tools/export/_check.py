"""The check: ONNX Runtime against PyTorch on random inputs of several shapes, padding included.

Every output is compared with ``max(abs(onnx - torch))``. For per-token outputs (``last_hidden_state``,
token-classification ``logits``) only positions whose ``attention_mask`` is 1 count: a padded position's
value means nothing, and fused kernels are free to compute it differently. The reference is the wrapper
on the model's own 2-D mask path, whichever mask the exported graph builds. The export refuses to write
``model.onnx`` when a difference passes the tolerance.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import ExportError
from ._inputs import SEED, longest, random_inputs
from ._load import Torch
from ._wrapper import Plan

__all__ = ["check"]

# (batch, sequence) of the random inputs the check runs; every case but the first pads some rows
_CHECK_SHAPES = ((1, 7), (3, 33), (2, 64))


def check(
    mods: Torch, reference: Any, model_path: Path, config: Any, plan: Plan
) -> tuple[dict[str, float], dict[str, str]]:
    """Per output, the largest abs difference between ONNX Runtime and ``reference`` (and where it was)."""
    import onnxruntime as ort

    torch = mods.torch
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(SEED + 1)
    worst = dict.fromkeys(plan.output_names, 0.0)
    where = dict.fromkeys(plan.output_names, "")
    limit = longest(config)
    for index, (batch, length) in enumerate(_CHECK_SHAPES):
        feeds = random_inputs(rng, config, plan, batch, min(length, limit), pad=index > 0)
        got = session.run(list(plan.output_names), feeds)
        with torch.no_grad():
            expected = reference(*(torch.from_numpy(feeds[n].astype(np.int64)) for n in plan.input_names))
        keep = feeds["attention_mask"].astype(bool)
        for name, ours, theirs in zip(plan.output_names, got, expected, strict=True):
            theirs_np = theirs.detach().cpu().numpy()
            if ours.shape != theirs_np.shape:
                raise ExportError(f"output {name!r} has shape {ours.shape} in ONNX, {theirs_np.shape} in PyTorch")
            delta = np.abs(ours.astype(np.float64) - theirs_np.astype(np.float64))
            if name in plan.per_token:
                delta = delta[keep]
            diff = float(delta.max()) if delta.size else 0.0
            if not math.isfinite(diff):
                diff = math.inf
            if not where[name] or diff > worst[name]:
                worst[name] = diff
                where[name] = f"batch {batch} x {feeds['input_ids'].shape[1]} tokens"
    return worst, where
