"""Loading a fast tokenizer offline, from a ``tokenizer.json`` or a transformers tokenizer folder.

Only the ``tokenizers`` library (Rust, no torch) is used: ``transformers.AutoTokenizer`` would import torch
whenever torch is installed, and ``from_pretrained`` can reach the hub. Nothing here touches the network.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers

__all__ = ["Tokenizer", "TokenizerLoadError", "load_tokenizer"]

#: transformers writes ``int(1e30)`` as ``model_max_length`` when a model has no limit
_NO_LIMIT = 1_000_000_000
_PROBES = ("a", "hello", "0", "x y")
_PAD_NAMES = ("[PAD]", "<pad>", "<|pad|>")


class TokenizerLoadError(Exception):
    """A tokenizer could not be loaded from ``path``: missing, not a tokenizer, or not supported."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class Tokenizer:
    """A loaded fast tokenizer: the Rust tokenizer plus what chunking needs (special and pad ids, max length).

    The Rust tokenizer is owned by this object and never reconfigured after loading (truncation and padding
    are switched off once, at load time), so every method may be called from many threads at once.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        path: Path,
        prefix_ids: Sequence[int],
        suffix_ids: Sequence[int],
        pad_id: int,
        model_max_length: int | None,
    ) -> None:
        self._backend = backend
        self._path = path
        self._prefix_ids = tuple(prefix_ids)
        self._suffix_ids = tuple(suffix_ids)
        self._pad_id = pad_id
        self._model_max_length = model_max_length

    @property
    def path(self) -> Path:
        """The ``tokenizer.json`` this tokenizer was loaded from."""
        return self._path

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        """Special token ids the post-processor puts before a sequence (``[CLS]`` for BERT)."""
        return self._prefix_ids

    @property
    def suffix_ids(self) -> tuple[int, ...]:
        """Special token ids the post-processor puts after a sequence (``[SEP]`` for BERT)."""
        return self._suffix_ids

    @property
    def num_special_tokens(self) -> int:
        """How many special tokens each encoded sequence (each chunk) carries."""
        return len(self._prefix_ids) + len(self._suffix_ids)

    @property
    def pad_id(self) -> int:
        """The id used to pad a batch (masked out by the attention mask)."""
        return self._pad_id

    @property
    def model_max_length(self) -> int | None:
        """The model's maximum sequence length from ``tokenizer_config.json``, or None when it states none."""
        return self._model_max_length

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens and without truncation (one batch call, GIL released)."""
        encodings = self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token``, or None when it is not in the vocabulary."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token of ``token_id``, or None when it is out of range."""
        return self._backend.id_to_token(token_id)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (for debugging and tests)."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(path={str(self._path)!r}, vocab_size={self.vocab_size}, prefix_ids={self._prefix_ids}, "
            f"suffix_ids={self._suffix_ids}, pad_id={self._pad_id}, model_max_length={self._model_max_length})"
        )


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a fast tokenizer from ``path``: a ``tokenizer.json`` file or a folder holding one.

    A transformers tokenizer folder (``tokenizer.json`` + ``tokenizer_config.json`` + ``special_tokens_map.json``)
    gives the model's maximum length and pad token as well; the special tokens every chunk carries are the
    ones the tokenizer's post-processor adds. Raises `TokenizerLoadError` naming the path when the path is
    missing or holds no usable tokenizer. Never downloads anything.
    """
    given = Path(path)
    if given.is_dir():
        file = given / "tokenizer.json"
        if not file.is_file():
            raise TokenizerLoadError(
                given, "folder has no tokenizer.json (only fast tokenizers are supported; save one with transformers)"
            )
        folder = given
    elif given.is_file():
        file, folder = given, given.parent
    else:
        raise TokenizerLoadError(given, "no such file or folder")
    try:
        backend = tokenizers.Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust binding raises a bare Exception for any parse error
        raise TokenizerLoadError(file, f"not a tokenizer.json: {exc}") from exc
    saved_padding = backend.padding
    # Chunking windows the whole document itself: truncation or padding saved in tokenizer.json would cut it.
    backend.no_truncation()
    backend.no_padding()
    config = _read_json(folder / "tokenizer_config.json")
    special_map = _read_json(folder / "special_tokens_map.json")
    prefix, suffix = _special_ids(backend, file)
    return Tokenizer(
        backend,
        path=file,
        prefix_ids=prefix,
        suffix_ids=suffix,
        pad_id=_pad_id(backend, config, special_map, saved_padding),
        model_max_length=_max_length(config),
    )


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(file, f"unreadable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(file, "expected a JSON object")
    return data


def _special_ids(backend: tokenizers.Tokenizer, file: Path) -> tuple[list[int], list[int]]:
    """Split what the post-processor adds to a single sequence into the ids before it and the ids after it."""
    count = backend.num_special_tokens_to_add(is_pair=False)
    if count == 0:
        return [], []
    for probe in _PROBES:
        plain = backend.encode(probe, add_special_tokens=False).ids
        if not plain:
            continue
        full = backend.encode(probe, add_special_tokens=True).ids
        for start in range(len(full) - len(plain) + 1):
            if full[start : start + len(plain)] == plain and len(full) - len(plain) == count:
                return full[:start], full[start + len(plain) :]
        break
    raise TokenizerLoadError(file, "the post-processor does not add special tokens only around a sequence")


def _token_name(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _pad_id(
    backend: tokenizers.Tokenizer,
    config: dict[str, Any],
    special_map: dict[str, Any],
    saved_padding: dict[str, Any] | None,
) -> int:
    for source in (config, special_map):
        name = _token_name(source.get("pad_token"))
        if name is not None and (token_id := backend.token_to_id(name)) is not None:
            return token_id
    if saved_padding is not None and isinstance(saved_padding.get("pad_id"), int):
        return int(saved_padding["pad_id"])
    for name in _PAD_NAMES:
        if (token_id := backend.token_to_id(name)) is not None:
            return token_id
    return 0


def _max_length(config: dict[str, Any]) -> int | None:
    value = config.get("model_max_length")
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < _NO_LIMIT:
        return int(value)
    return None
