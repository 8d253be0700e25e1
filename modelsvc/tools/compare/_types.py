"""The runner protocol and the input declaration that every runner and the input code share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

__all__ = ["Array", "Runner", "TensorDecl", "describe"]

Array = np.ndarray[Any, Any]


class TensorDecl(NamedTuple):
    """An input as a runner declares it: its name, v2 datatype (``FP32``, ``INT64``) and dims, -1 where free."""

    name: str
    datatype: str
    dims: tuple[int, ...]


@runtime_checkable
class Runner(Protocol):
    """Something that runs a model on named numpy arrays: what ``compare_runners`` compares.

    The runners here also carry ``source`` (the path or URL opened), which messages name where present.
    """

    @property
    def inputs(self) -> Sequence[TensorDecl]: ...

    @property
    def outputs(self) -> Sequence[str]: ...

    def run(self, feeds: Mapping[str, Array]) -> dict[str, Array]:
        """The outputs by name for ``feeds`` (arrays by input name, of the declared datatypes)."""
        ...

    def close(self) -> None: ...


def describe(runner: Runner) -> str:
    """The runner's source for messages, or its class name where it has none."""
    return str(getattr(runner, "source", type(runner).__name__))
