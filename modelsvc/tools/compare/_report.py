"""``compare_runners``: both sides on the same feeds, the differences per output, and the table.

For each output both sides give (or those named in ``outputs``), on arrays ``a`` (side A) and ``b`` (side B):

- ``max_abs`` = max |a - b|;
- ``max_rel`` = max |a - b| / max(|b|, ``REL_FLOOR``): relative to B, with a floor of 1e-6 so that elements where
  B is zero (or nearly) do not make it explode;
- the output passes when |a - b| <= atol + rtol * |b| at every element: ``numpy.allclose(a, b, rtol, atol)``,
  where NaN on both sides at the same element counts as equal (``equal_nan=True``) and NaN against a number
  does not (that element's difference is reported as inf);
- shapes that differ fail the output (no difference is computed); BYTES outputs pass only when equal.

The report passes when every compared output passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...protocol import numpy_dtype
from ._errors import IncompatibleModels, UsageError
from ._inputs import common_inputs
from ._types import Array, Runner, describe

__all__ = ["REL_FLOOR", "CompareReport", "OutputDiff", "compare_runners", "render_table"]

REL_FLOOR = 1e-6


@dataclass(frozen=True, slots=True)
class OutputDiff:
    """One output compared."""

    name: str
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    #: max |a - b| (inf where one side is NaN and the other not; NaN where the shapes differ)
    max_abs: float
    #: max |a - b| / max(|b|, REL_FLOOR) (NaN where the shapes differ)
    max_rel: float
    passed: bool

    @property
    def shapes_match(self) -> bool:
        return self.shape_a == self.shape_b

    @property
    def verdict(self) -> str:
        """``ok``, ``OVER`` (outside the tolerance) or ``SHAPE`` (the shapes differ)."""
        if not self.shapes_match:
            return "SHAPE"
        return "ok" if self.passed else "OVER"


@dataclass(frozen=True, slots=True)
class CompareReport:
    """What ``compare_runners`` found: a diff per compared output and the notes along the way."""

    outputs: tuple[OutputDiff, ...]
    atol: float
    rtol: float
    #: outputs only one side gives (not compared)
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    #: casts and other things done to make the sides comparable
    notes: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return all(d.passed for d in self.outputs)

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.outputs if not d.passed)


def _cast_for(runner: Runner, feeds: Mapping[str, Array]) -> dict[str, Array]:
    wanted = {t.name: t.datatype for t in runner.inputs}
    cast: dict[str, Array] = {}
    for name, array in feeds.items():
        datatype = wanted.get(name)
        if datatype is not None and datatype != "BYTES" and array.dtype != numpy_dtype(datatype):
            array = array.astype(numpy_dtype(datatype))
        cast[name] = array
    return cast


def diff_output(name: str, a: Array, b: Array, atol: float, rtol: float) -> OutputDiff:
    """One output's differences (module docstring), ``a`` against ``b``."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return OutputDiff(name, a.shape, b.shape, float("nan"), float("nan"), False)
    if a.dtype.kind in "OSU" or b.dtype.kind in "OSU":
        equal = a.dtype.kind == b.dtype.kind and bool(np.array_equal(a, b))
        mismatch = 0.0 if equal else float("inf")
        return OutputDiff(name, a.shape, b.shape, mismatch, mismatch, equal)
    if a.size == 0:
        return OutputDiff(name, a.shape, b.shape, 0.0, 0.0, True)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a64 - b64)
        same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        diff[same] = 0.0
        diff[np.isnan(diff)] = np.inf  # NaN against a number, inf against -inf
        rel = diff / np.maximum(np.abs(np.nan_to_num(b64, nan=0.0)), REL_FLOOR)
        rel[np.isnan(rel)] = np.inf  # an infinite difference where B is infinite too
    passed = bool(np.allclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True))
    return OutputDiff(name, a.shape, b.shape, float(diff.max()), float(rel.max()), passed)


def compare_runners(
    a: Runner,
    b: Runner,
    feeds: Mapping[str, Array],
    atol: float,
    rtol: float,
    *,
    outputs: Sequence[str] | None = None,
) -> CompareReport:
    """Run both sides on ``feeds`` and compare the outputs both give (or those named in ``outputs``).

    The sides must take the same inputs (``common_inputs``: names, datatypes, ranks, fixed dims); INT32 and
    INT64 inputs are cast to each side's datatype, with a note. ``IncompatibleModels`` when they do not, or
    when no output is common; ``UsageError`` when ``outputs`` names one that is not common; ``RunnerFailed``
    when a side fails. ``.passed`` follows ``numpy.allclose`` (module docstring).
    """
    _, notes = common_inputs(a.inputs, b.inputs)
    only_a = tuple(n for n in a.outputs if n not in b.outputs)
    only_b = tuple(n for n in b.outputs if n not in a.outputs)
    common = [n for n in a.outputs if n in b.outputs]
    if outputs:
        unknown = [n for n in outputs if n not in common]
        if unknown:
            raise UsageError(
                f"--outputs names {', '.join(unknown)}, not an output of both models; "
                f"the common outputs are {', '.join(common) or 'none'}"
            )
        common = [n for n in common if n in outputs]
    if not common:
        raise IncompatibleModels(
            f"the models have no output in common (A gives {', '.join(a.outputs)}; B gives {', '.join(b.outputs)})"
        )
    out_a = a.run(_cast_for(a, feeds))
    out_b = b.run(_cast_for(b, feeds))
    diffs = []
    for name in common:
        for side, runner, got in (("A", a, out_a), ("B", b, out_b)):
            if name not in got:
                raise IncompatibleModels(f"{side} ({describe(runner)}) declares output {name} but did not return it")
        diffs.append(diff_output(name, out_a[name], out_b[name], atol, rtol))
    return CompareReport(tuple(diffs), atol, rtol, only_a, only_b, tuple(notes))


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def _number(value: float) -> str:
    return "-" if np.isnan(value) else f"{value:.3g}"


def render_table(report: CompareReport) -> str:
    """The report as a table (output, shape, max abs, max rel, ok/OVER/SHAPE), one line per output."""
    rows = [("output", "shape", "max abs", "max rel", "result")]
    for d in report.outputs:
        shape = _dims(d.shape_a) if d.shapes_match else f"{_dims(d.shape_a)} vs {_dims(d.shape_b)}"
        rows.append((d.name, shape, _number(d.max_abs), _number(d.max_rel), d.verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"
