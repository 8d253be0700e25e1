"""The errors of ``modelsvc export``, and the one-line form of a lower layer's exception in their messages.

Errors::

    ExportError               anything that stops an export
    ├── ExportUsageError      bad options, a model that cannot be found or loaded, torch not installed
    └── ExportCheckError      ONNX Runtime and PyTorch disagree beyond the tolerance
"""

from __future__ import annotations

__all__ = ["ExportCheckError", "ExportError", "ExportUsageError", "first_line"]


class ExportError(Exception):
    """An export failed; the message says why in one line."""


class ExportUsageError(ExportError):
    """The options are wrong, the model cannot be found or loaded, or torch is not installed."""


class ExportCheckError(ExportError):
    """ONNX Runtime's outputs differ from PyTorch's beyond the tolerance; model.onnx was not written."""

    def __init__(self, message: str, max_abs_diff: dict[str, float]) -> None:
        super().__init__(message)
        #: per output, the measured max abs difference
        self.max_abs_diff = max_abs_diff


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
