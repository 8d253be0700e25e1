"""Whether a failed inference was the inputs' shapes, by the model's own shape inference.

OpenVINO raises RuntimeError for whatever stops an inference, a plugin's shape check (``Eltwise shape infer input
shapes dim index: 1 mismatch``) as much as a fault, and an IR keeps no names for its dynamic dimensions. The model
itself can tell: ``Model.reshape`` to the inputs' concrete shapes runs every node's shape inference and raises
where they cannot fit (``Argument shapes are inconsistent``). So after a failed inference the model (read again
from its file on the first failure, then kept) is reshaped, on a copy, to the shapes fed: rejected, the request
is a 400 naming the inputs; accepted, the failure is OpenVINO's own (500).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import openvino as ov

from .._shapes import Shapes, Verdicts


class _ReshapeJudge:
    def __init__(self, load: Callable[[], ov.Model]) -> None:
        self._load = load
        self._model: ov.Model | None = None
        self._usable: str | None = None  # why the model cannot be reshaped at all (None: it can)
        self._lock = threading.Lock()

    def __call__(self, shapes: Shapes) -> str | None:
        with self._lock:
            if self._model is None:
                model = self._load()
                # a model that cannot be reshaped even to its own shapes gives no verdict
                self._usable = _rejects(model.clone(), {p.get_any_name(): p.get_partial_shape() for p in model.inputs})
                self._model = model
            if self._usable is not None:
                return None
            copy = self._model.clone()
        return _rejects(copy, {name: ov.PartialShape(list(shape)) for name, shape in shapes.items()})


def _rejects(model: ov.Model, shapes: dict[str, ov.PartialShape]) -> str | None:
    try:
        model.reshape(shapes)
    except RuntimeError as exc:
        # "Check '...' failed at <file>: While validating node '...' with friendly_name 'OUTPUT1': Argument shapes
        # are inconsistent.": the node and its last line
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        node = re.search(r"with friendly_name '([^']*)'", str(exc))
        last = lines[-1] if lines else "rejected"
        return f"node '{node.group(1)}': {last}" if node else last
    return None


def words(exc: BaseException) -> str:
    """OpenVINO's message on one line, without its ``Exception from <file>:<line>:`` lines."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(line for line in lines if not line.startswith("Exception from ")) or " ".join(lines)


def reshape_verdicts(load: Callable[[], ov.Model]) -> Verdicts:
    """The verdicts of the model that ``load`` reads, shared by the model's instances."""
    return Verdicts(_ReshapeJudge(load))
