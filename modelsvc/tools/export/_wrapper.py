"""The module torch.onnx exports: the graph's inputs and outputs (a plan), and the wrapper that has them.

The wrapper's positional inputs are the tokenizer's tensors (``input_ids``, ``attention_mask`` and, where
the model takes it, ``token_type_ids``), cast to int64 inside the graph; its outputs are named
(``last_hidden_state`` and, with pooling, ``sentence_embedding``; ``logits`` for classifiers). The pooling
heads are the mean over the tokens the mask keeps or the first token, optionally L2-normalized.

The prepared mask (when optimizing): ONNX Runtime's attention fusion matches a handful of mask subgraphs.
The one transformers 5 builds from a 2-D ``attention_mask`` is not among them (after the dynamo export it
is a GatherND and two Ands), and its eager attention scales the scores with a Mul, which the fusion takes
for the mask's Mul in the older ``(1 - mask) * min`` form. So, when optimizing, the wrapper builds the
additive 4-D mask itself, in the form of transformers 4's SDPA path (``Where(Cast(1 - Cast(Expand(mask[:,
None, None, :]))), min, ...)``) that the fusion knows, and hands it to the model, which uses a 4-D mask as
given. The reference the check compares with is always the model's own 2-D mask path, so this rewrite is
checked too.
"""

from __future__ import annotations

import inspect as pyinspect
from dataclasses import dataclass
from typing import Any

from ._errors import ExportUsageError
from ._options import ExportOptions

__all__ = ["Plan", "make_plan", "wrap"]


@dataclass(frozen=True)
class Plan:
    """The exported graph's interface."""

    task: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    #: outputs indexed by (batch, sequence, ...): compared only where attention_mask is 1
    per_token: frozenset[str]
    pooling: str
    normalize: bool
    int_dtype: str


def make_plan(options: ExportOptions, model: Any, config: Any, task: str, tokenizer: tuple[str, ...] | None) -> Plan:
    """The graph's inputs and outputs. ``token_type_ids`` is an input where the model takes it and its
    tokenizer makes it (without a tokenizer: where the model has more than one token type; with one type
    the ids could only be 0, which the model assumes when it gets none)."""
    accepted = pyinspect.signature(model.forward).parameters
    for required in ("input_ids", "attention_mask"):
        if required not in accepted:
            raise ExportUsageError(f"model {options.model!r} takes no {required}: export handles text models")
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in accepted:
        made = "token_type_ids" in tokenizer if tokenizer is not None else None
        if made or (made is None and int(getattr(config, "type_vocab_size", 0) or 0) > 1):
            names.append("token_type_ids")
    if task == "feature-extraction":
        outputs = ["last_hidden_state"] + (["sentence_embedding"] if options.pooling != "none" else [])
        per_token = {"last_hidden_state"}
    else:
        outputs = ["logits"]
        per_token = {"logits"} if task == "token-classification" else set()
    return Plan(
        task=task,
        input_names=tuple(names),
        output_names=tuple(outputs),
        per_token=frozenset(per_token),
        pooling=options.pooling if task == "feature-extraction" else "none",
        normalize=options.normalize,
        int_dtype=options.int_dtype,
    )


def wrap(torch: Any, model: Any, plan: Plan, prepared_mask: bool) -> Any:
    """An nn.Module: the plan's inputs, positional, in; its outputs, as a tuple in order, out.

    With ``prepared_mask`` the additive 4-D attention mask is built here, in the form ONNX Runtime's
    attention fusion recognizes (see this module's docstring); without it the model builds its own.
    """
    dtype = next(iter(model.parameters())).dtype  # float32, or bfloat16 for a bf16 TorchScript trace
    lowest = torch.finfo(dtype).min

    class Exportable(torch.nn.Module):  # type: ignore[misc]  # torch is imported lazily, typed Any
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> tuple[Any, ...]:
            ids = input_ids.to(torch.int64)
            mask = attention_mask.to(torch.int64)
            kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "return_dict": True}
            if token_type_ids is not None:
                kwargs["token_type_ids"] = token_type_ids.to(torch.int64)
            if prepared_mask:
                batch, length = mask.shape
                expanded = mask[:, None, None, :].expand(batch, 1, length, length).to(dtype)
                inverted = 1.0 - expanded
                kwargs["attention_mask"] = inverted.masked_fill(inverted.to(torch.bool), lowest)
            out = self.inner(**kwargs)
            if plan.task != "feature-extraction":
                return (out.logits,)
            tokens = out.last_hidden_state
            if plan.pooling == "none":
                return (tokens,)
            if plan.pooling == "cls":
                pooled = tokens[:, 0]
            else:  # the mean of the tokens the mask keeps, as sentence-transformers' Pooling computes it
                weights = mask.unsqueeze(-1).to(tokens.dtype)
                pooled = (tokens * weights).sum(dim=1) / torch.clamp(weights.sum(dim=1), min=1e-9)
            if plan.normalize:  # as F.normalize(p=2), written so ONNX Runtime's shape inference follows it
                norm = torch.sqrt((pooled * pooled).sum(dim=1, keepdim=True))
                pooled = pooled / torch.clamp(norm, min=1e-12)
            return (tokens, pooled)

    return Exportable().eval()
