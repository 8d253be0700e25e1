"""The errors of ``modelsvc compare``, one tree, and the exit status each one means.

CompareError                  the comparison could not be made or did not pass (exit 1)
├── UsageError                the command was asked something it cannot do (exit 2)
│   └── SourceError           a source that is not a model: missing file, unknown suffix, bad URL,
│                             unreachable server, unknown model, TensorRT not installed
├── IncompatibleModels        the two sides disagree on their inputs (names, datatypes, ranks, fixed dims)
│                             or have no output in common
└── RunnerFailed              one side failed to run on the inputs
"""

from __future__ import annotations

__all__ = ["CompareError", "IncompatibleModels", "RunnerFailed", "SourceError", "UsageError"]


class CompareError(Exception):
    """The comparison could not be made or did not pass; ``exit_status`` is what the command returns."""

    exit_status = 1


class UsageError(CompareError):
    """A bad argument: a shape spec, an ``.npz`` that does not fit the inputs, an unknown output name."""

    exit_status = 2


class SourceError(UsageError):
    """A source that cannot be opened as a model."""


class IncompatibleModels(CompareError):
    """The two models cannot take the same inputs, or share no output."""


class RunnerFailed(CompareError):
    """A model raised while running the inputs (the message names the side and the source)."""
