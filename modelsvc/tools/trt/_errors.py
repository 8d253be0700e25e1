"""The errors of ``modelsvc build``. Each message says what is wrong in one line, naming the tensor, flag or file.

Errors::

    BuildError               anything that stops a build (exit 1)
    ├── BuildUsageError      bad flags or shapes, a config profiles cannot be derived from, TensorRT missing (exit 2)
    └── BuildCheckError      the plan and ONNX Runtime disagree beyond the tolerance; nothing was written (exit 1)
"""

from __future__ import annotations

from typing import Any

__all__ = ["TENSORRT_EXTRA", "BuildCheckError", "BuildError", "BuildUsageError"]

#: how to install what building a plan needs; every "TensorRT missing" message names it
TENSORRT_EXTRA = "pip install 'modelsvc[tensorrt]'"


class BuildError(Exception):
    """A build failed; the message says why in one line."""


class BuildUsageError(BuildError):
    """The flags, shapes or config are wrong, or TensorRT / cuda-python is not installed."""


class BuildCheckError(BuildError):
    """The plan's outputs differ from ONNX Runtime's beyond the tolerance; nothing was written."""

    def __init__(self, message: str, comparisons: list[Any]) -> None:
        super().__init__(message)
        #: one comparison report per checked input shape (``modelsvc.tools.compare.CompareReport``)
        self.comparisons = comparisons
