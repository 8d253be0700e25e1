"""The calibration windows of ``--precision int8 --calibration FILE|auto``: real text, tokenized by the model's own
tokenizer and cut into windows of the lengths the model will serve.

Calibrated int8 quantizes activations as well as weights, so each quantized tensor needs a range, measured by
running the float model on sample inputs. Random token ids give ranges no text has (a first try on MiniLM with 64
windows of random ids reached a cosine of 0.988 with PyTorch fp32); the sample must be text like the text served.

- ``FILE``: a ``.json`` file (every string in it: a list of texts, or an object of lists as a service's labelled
  documents) or a text file (each non-empty line a text);
- ``auto``: modelsvc's own sample text (``_corpus``, news-like English on many topics), for a model with no text
  of its own at hand; a service passes its own documents instead (``python -m services.build`` does).

The texts are tokenized once and concatenated in a seeded random order; each window takes the next tokens, between
the tokenizer's own special tokens. Half the windows are as long as the model takes (a service that cuts long
documents serves those), the others of random lengths down to 8 tokens. Each window is one row, unpadded, with
``token_type_ids`` 0. The same windows are drawn for the same texts and counts, so an export is repeatable; the
check's windows (``held_out``) are drawn after the calibration's, with the texts in another order.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._errors import ExportUsageError, first_line
from ._inputs import Feeds, longest
from ._wrapper import Plan

__all__ = ["AUTO", "CALIBRATION_WINDOWS", "CHECK_WINDOWS", "calibration_texts", "padded_batches", "text_windows"]

AUTO = "auto"
#: windows the ranges are measured on (NNCF's own default subset size)
CALIBRATION_WINDOWS = 300
#: further windows the export's check runs after quantizing (not calibrated on)
CHECK_WINDOWS = 24
_SHORTEST = 8
_SEED = 20261128


def calibration_texts(spec: str) -> list[str]:
    """The texts of ``--calibration`` (a file, or ``auto``); a usage error when there are none."""
    if spec == AUTO:
        from ._corpus import TEXTS

        return list(TEXTS)
    path = Path(spec).expanduser()
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportUsageError(f"--calibration {spec}: cannot read it: {first_line(exc)}") from None
    if path.suffix.lower() == ".json":
        try:
            texts = list(_strings(json.loads(raw)))
        except ValueError as exc:
            raise ExportUsageError(f"--calibration {spec}: not JSON: {first_line(exc)}") from None
    else:
        texts = raw.splitlines()
    texts = [t.strip() for t in texts if t.strip()]
    if not texts:
        raise ExportUsageError(f"--calibration {spec}: no text in it (a .json file's strings, or lines of text)")
    return texts


def _strings(value: Any) -> Any:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)


def _tokenizer(mods_transformers: Any, source: str) -> Any:
    try:
        return mods_transformers.AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception as exc:  # no tokenizer files, or one transformers cannot build
        raise ExportUsageError(
            f"--calibration tokenizes text with the model's own tokenizer, and {source!r} has none that loads: "
            f"{first_line(exc)}"
        ) from None


def text_windows(
    transformers: Any, source: str, config: Any, plan: Plan, texts: list[str], counts: tuple[int, int]
) -> tuple[list[Feeds], list[Feeds]]:
    """``counts[0]`` calibration windows and ``counts[1]`` held-out windows of ``texts``, one row each."""
    tokenizer = _tokenizer(transformers, source)
    pieces = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    pieces = [p for p in pieces if p]
    if not pieces:
        raise ExportUsageError("--calibration: the model's tokenizer makes no token of the calibration text")
    ends = _special_tokens(tokenizer)
    extra = len(ends[0]) + len(ends[1])
    full = min(longest(config), int(getattr(tokenizer, "model_max_length", 0) or 10**9)) - extra
    if full < _SHORTEST:
        raise ExportUsageError(f"--calibration: the model's windows ({full + extra} tokens) are too short")
    calibration = _draw(ends, pieces, plan, counts[0], full, random.Random(_SEED))
    held_out = _draw(ends, pieces, plan, counts[1], full, random.Random(_SEED + 1))
    return calibration, held_out


def _special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text's own (``[CLS]`` and ``[SEP]`` for BERT), read off how it
    encodes one word with and without them."""
    plain = list(tokenizer("hello", add_special_tokens=False)["input_ids"])
    marked = list(tokenizer("hello")["input_ids"])
    for start in range(len(marked) - len(plain) + 1):
        if marked[start : start + len(plain)] == plain:
            return marked[:start], marked[start + len(plain) :]
    return [], []


def _draw(
    ends: tuple[list[int], list[int]], pieces: list[list[int]], plan: Plan, count: int, full: int, rng: random.Random
) -> list[Feeds]:
    order = list(range(len(pieces)))
    rng.shuffle(order)
    stream: list[int] = []
    position = 0
    windows = []
    for index in range(count):
        length = full if index % 2 == 0 else rng.randint(_SHORTEST, full)
        while len(stream) - position < length:  # the texts again, in a new order, when they run out
            if position:
                stream, position = stream[position:], 0
            rng.shuffle(order)
            for i in order:
                stream.extend(pieces[i])
        ids = ends[0] + stream[position : position + length] + ends[1]
        position += length
        windows.append(_feeds(plan, ids))
    return windows


def _feeds(plan: Plan, ids: list[int]) -> Feeds:
    dtype = np.int32 if plan.int_dtype == "int32" else np.int64
    row: npt.NDArray[np.integer[Any]] = np.asarray([ids], dtype=dtype)
    feeds: Feeds = {"input_ids": row, "attention_mask": np.ones_like(row)}
    if "token_type_ids" in plan.input_names:
        feeds["token_type_ids"] = np.zeros_like(row)
    return feeds


def padded_batches(windows: list[Feeds], size: int) -> list[Feeds]:
    """``windows`` (one row each) in batches of ``size``, each row padded on the right to its batch's longest, as
    a server batches them."""
    batches = []
    for start in range(0, len(windows), size):
        group = windows[start : start + size]
        width = max(w["input_ids"].shape[1] for w in group)
        batch: Feeds = {}
        for name in group[0]:
            rows = [np.pad(w[name], ((0, 0), (0, width - w[name].shape[1]))) for w in group]
            batch[name] = np.concatenate(rows)
        batches.append(batch)
    return batches
