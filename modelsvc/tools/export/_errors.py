"""The errors of ``modelsvc export``, and the one-line form of a lower layer's exception in their messages.

Errors::

    ExportError               anything that stops an export
    ├── ExportUsageError      bad options, a model that cannot be found or loaded, torch not installed
    └── ExportCheckError      the written model and PyTorch disagree beyond the tolerance or cosine bound
"""

from __future__ import annotations

__all__ = ["ExportCheckError", "ExportError", "ExportUsageError", "first_line"]


class ExportError(Exception):
    """An export failed; the message says why in one line."""


class ExportUsageError(ExportError):
    """The options are wrong, the model cannot be found or loaded, or torch is not installed."""


class ExportCheckError(ExportError):
    """The written model's outputs differ from PyTorch's beyond the tolerance (fp32) or the cosine bound
    (bf16, int8); the model was not written."""

    def __init__(
        self, message: str, max_abs_diff: dict[str, float], min_cosine: dict[str, float] | None = None
    ) -> None:
        super().__init__(message)
        #: per output, the measured max abs difference
        self.max_abs_diff = max_abs_diff
        #: per output, the smallest cosine similarity of a row to PyTorch fp32's
        self.min_cosine = min_cosine or {}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
