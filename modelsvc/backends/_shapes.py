"""Inputs that each fit the config but not each other (add_sub's INPUT0 [2,3] with INPUT1 [2,4]): one error for
every backend, a 400 / INVALID_ARGUMENT that names the inputs and their shapes.

The data plane checks each input against its config entry alone; only the model knows how its inputs relate.
Each backend says so from its own runtime's signal (see ``modelsvc/backends/__init__.py``) and raises
``InputsMismatch``, whose message reads ``inputs INPUT0 [2,3] and INPUT1 [2,4] do not fit model 'm': <why>``.

A batch that merged several requests fails as a whole (the dynamic batcher merges only requests whose inputs have
the same shapes past the batch dimension, so each of them carries the same mismatch); the scheduler gives each
request the error again with its own shapes (``for_inputs``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from modelsvc.protocol import InvalidArgument

#: an input's shape by input name, as the request (or the batch) gives it
Shapes = dict[str, tuple[int, ...]]


def shapes_of(inputs: Mapping[str, Any]) -> Shapes:
    """The shapes of ``inputs`` (arrays, or anything with ``shape``), in the order given."""
    return {name: tuple(int(d) for d in array.shape) for name, array in inputs.items()}


def describe(shapes: Shapes) -> str:
    """``INPUT0 [2,3] and INPUT1 [2,4]`` (``A [1], B [2] and C [3]`` for three)."""
    parts = [f"{name} [{','.join(map(str, shape))}]" for name, shape in shapes.items()]
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


class InputsMismatch(InvalidArgument):
    """The inputs' shapes do not fit the model together; ``detail`` says why, in the runtime's words where it
    gave some."""

    def __init__(self, shapes: Shapes, detail: str, model: str | None = None) -> None:
        self.shapes = shapes
        self.detail = detail
        self.model = model
        where = f"model '{model}'" if model else "the model"
        noun, verb = ("inputs", "do") if len(shapes) > 1 else ("input", "does")
        super().__init__(f"{noun} {describe(shapes)} {verb} not fit {where}: {detail}")

    def for_inputs(self, inputs: Mapping[str, Any]) -> InputsMismatch:
        """The same error, naming the shapes of ``inputs`` (one request of the batch that failed)."""
        return InputsMismatch(shapes_of(inputs), self.detail, self.model)


def named_dims_disagree(shapes: Shapes, declared: Mapping[str, Sequence[Any]]) -> str | None:
    """Where inputs that the model declares with the same named dimension (ONNX's ``dim_param``: one name, one
    size, across every input of the graph) get different sizes for it, say which; None where they agree.
    ``declared`` holds each input's dims as the runtime reports them: a str for a named dimension."""
    seen: dict[str, tuple[str, int, int]] = {}
    for name, shape in shapes.items():
        dims = declared.get(name)
        if dims is None or len(dims) != len(shape):
            continue
        for axis, (dim, size) in enumerate(zip(dims, shape, strict=True)):
            if not isinstance(dim, str) or not dim:
                continue
            first = seen.setdefault(dim, (name, axis, size))
            if first[2] != size:
                other, other_axis, other_size = first
                return (
                    f"the model names dimension {other_axis} of {other} and dimension {axis} of {name} both '{dim}', "
                    f"one size, but they are {other_size} and {size}"
                )
    return None


class Verdicts:
    """What the model's own shape rules say of each set of input shapes seen to fail, remembered (a few hundred
    at most) so that a client repeating a bad request does not cost a shape inference each time.

    ``judge(shapes)`` gives the reason the model rejects ``shapes`` or None where it accepts them (the failure
    then lies elsewhere: an internal error). A judge that raises counts as no verdict (None)."""

    LIMIT = 256

    def __init__(self, judge: Callable[[Shapes], str | None]) -> None:
        self._judge = judge
        self._seen: dict[tuple[tuple[str, tuple[int, ...]], ...], str | None] = {}
        self._lock = threading.Lock()

    def rejects(self, shapes: Shapes) -> str | None:
        key = tuple(sorted(shapes.items()))
        with self._lock:
            if key in self._seen:
                return self._seen[key]
        try:
            verdict = self._judge(shapes)
        except Exception:  # a judge that cannot tell says nothing
            verdict = None
        with self._lock:
            if len(self._seen) >= self.LIMIT:
                self._seen.pop(next(iter(self._seen)))
            self._seen[key] = verdict
        return verdict
