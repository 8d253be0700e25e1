"""The inputs both sides run on: agreeing on them, shape specs, random feeds and ``.npz`` files.

Random inputs (``random_feeds``), seeded, with every dim fixed first (``resolve_shapes``):

- a dim the models fix keeps its size; ``--shape NAME:AxB`` fixes all of an input's dims;
- a free (-1) dim of an input that no ``--shape`` names takes the size at the same position of the first
  ``--shape`` of the same rank (so ``--shape input_ids:4x128`` sizes ``attention_mask`` too), else
  ``DEFAULT_BATCH`` (2) for the first dim and ``DEFAULT_DIM`` (16) for any other (``modelsvc compare`` passes a
  plan's ``PlanRunner.opt_shapes`` as the shapes when no ``--shape`` is given);
- floating-point inputs: standard normal values; BOOL: random, except names containing ``mask``: all True;
- integer inputs: ids in ``0 .. INT_HIGH - 1`` (0..99), except names containing ``mask`` (all ones: an
  attention mask that masks nothing) and ``token_type`` (all zeros: one segment);
- BYTES inputs have no random values: give them in an ``.npz``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...protocol import numpy_dtype
from ._errors import IncompatibleModels, UsageError
from ._types import Array, TensorDecl

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_DIM",
    "INT_HIGH",
    "common_inputs",
    "load_npz",
    "parse_shapes",
    "random_feeds",
    "resolve_shapes",
]

DEFAULT_BATCH = 2
DEFAULT_DIM = 16
INT_HIGH = 100
#: datatypes that may differ between the two sides; the feeds are cast for the side that declares the other
CASTABLE = frozenset({"INT32", "INT64"})


def parse_shapes(specs: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """``["input_ids:2x128", "a:1x4,b:1x4"]`` -> sizes by input name (trtexec's ``name:AxB``, comma-separated
    or repeated). A malformed spec or a name given twice is a ``UsageError`` naming it."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        for item in spec.split(","):
            name, sep, dims = item.strip().rpartition(":")
            if not sep or not name:
                raise UsageError(f"--shape {item!r}: expected NAME:AxB (for example input_ids:2x128)")
            try:
                sizes = tuple(int(d) for d in dims.split("x"))
            except ValueError:
                raise UsageError(f"--shape {item!r}: the dims {dims!r} are not whole numbers joined by x") from None
            if any(d < 1 for d in sizes):
                raise UsageError(f"--shape {item!r}: every dim must be at least 1")
            if name in shapes:
                raise UsageError(f"--shape: input {name!r} is given twice")
            shapes[name] = sizes
    return shapes


def common_inputs(a: Sequence[TensorDecl], b: Sequence[TensorDecl]) -> tuple[list[TensorDecl], list[str]]:
    """The inputs both sides take, in A's order, with the dims each side fixes merged; and notes (INT32 vs INT64
    inputs, which are fed in A's datatype and cast for B). ``IncompatibleModels`` names what disagrees."""
    a_by_name = {t.name: t for t in a}
    b_by_name = {t.name: t for t in b}
    only_a = [n for n in a_by_name if n not in b_by_name]
    only_b = [n for n in b_by_name if n not in a_by_name]
    if only_a or only_b:
        parts = [
            f"only A takes {', '.join(only_a)}" if only_a else "",
            f"only B takes {', '.join(only_b)}" if only_b else "",
        ]
        raise IncompatibleModels("the models' inputs differ: " + "; ".join(p for p in parts if p))
    merged: list[TensorDecl] = []
    notes: list[str] = []
    for ta in a:
        tb = b_by_name[ta.name]
        if ta.datatype != tb.datatype:
            if {ta.datatype, tb.datatype} <= CASTABLE:
                notes.append(
                    f"input {ta.name}: {ta.datatype} in A, {tb.datatype} in B; B gets it cast to {tb.datatype}"
                )
            else:
                raise IncompatibleModels(f"input {ta.name}: datatype {ta.datatype} in A, {tb.datatype} in B")
        if len(ta.dims) != len(tb.dims):
            raise IncompatibleModels(f"input {ta.name}: dims {list(ta.dims)} in A, {list(tb.dims)} in B")
        dims = []
        for da, db in zip(ta.dims, tb.dims, strict=True):
            if da >= 0 and db >= 0 and da != db:
                raise IncompatibleModels(f"input {ta.name}: dims {list(ta.dims)} in A, {list(tb.dims)} in B")
            dims.append(da if da >= 0 else db)
        merged.append(TensorDecl(ta.name, ta.datatype, tuple(dims)))
    return merged, notes


def _check_fits(what: str, decl: TensorDecl, shape: Sequence[int]) -> None:
    if len(shape) != len(decl.dims) or any(d >= 0 and d != s for d, s in zip(decl.dims, shape, strict=False)):
        raise UsageError(f"{what}: shape {list(shape)} does not fit input {decl.name}'s dims {list(decl.dims)}")


def resolve_shapes(inputs: Sequence[TensorDecl], shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Every input's concrete shape: from ``shapes`` (``--shape``) where given, else by the rules in this module's
    docstring. An unknown name, or a shape that does not fit the declared dims, is a ``UsageError``."""
    by_name = {t.name: t for t in inputs}
    unknown = [n for n in shapes if n not in by_name]
    if unknown:
        raise UsageError(f"--shape names {', '.join(unknown)}, not an input; the inputs are {', '.join(by_name)}")
    by_rank: dict[int, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        _check_fits(f"--shape {name}", by_name[name], shape)
        by_rank.setdefault(len(shape), tuple(shape))
    resolved: dict[str, tuple[int, ...]] = {}
    for t in inputs:
        if t.name in shapes:
            resolved[t.name] = tuple(shapes[t.name])
            continue
        like = by_rank.get(len(t.dims))
        resolved[t.name] = tuple(
            d if d >= 0 else like[i] if like is not None else DEFAULT_BATCH if i == 0 else DEFAULT_DIM
            for i, d in enumerate(t.dims)
        )
    return resolved


def random_feeds(
    inputs: Sequence[TensorDecl], shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0
) -> dict[str, Array]:
    """Seeded random arrays for ``inputs`` (see the module docstring for the values and the dims)."""
    rng = np.random.default_rng(seed)
    resolved = resolve_shapes(inputs, shapes or {})
    feeds: dict[str, Array] = {}
    for t in inputs:
        shape = resolved[t.name]
        if t.datatype == "BYTES":
            raise UsageError(f"input {t.name} is BYTES, which has no random values: give it in --npz")
        dtype = numpy_dtype(t.datatype)
        lowered = t.name.lower()
        if dtype.kind == "b":
            value = np.ones(shape, bool) if "mask" in lowered else rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind in "iu":
            if "mask" in lowered:
                value = np.ones(shape, dtype)
            elif "token_type" in lowered:
                value = np.zeros(shape, dtype)
            else:
                value = rng.integers(0, INT_HIGH, shape).astype(dtype)
        else:
            value = rng.standard_normal(shape).astype(dtype)
        feeds[t.name] = value
    return feeds


def load_npz(path: str | Path, inputs: Sequence[TensorDecl]) -> tuple[dict[str, Array], list[str]]:
    """The arrays of an ``.npz`` by input name, cast to the declared datatype where only the width differs (an
    int32 array for an INT64 input), with a note for each cast. ``UsageError`` for a file that cannot be read,
    names missing or extra, a shape outside the dims, or a datatype of another kind."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise UsageError(f"--npz {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--npz {path}: not a readable .npz file: {exc}") from None
    names = [t.name for t in inputs]
    missing = [n for n in names if n not in arrays]
    extra = [n for n in arrays if n not in names]
    if missing or extra:
        parts = [f"missing {', '.join(missing)}" if missing else "", f"extra {', '.join(extra)}" if extra else ""]
        raise UsageError(f"--npz {path}: {'; '.join(p for p in parts if p)} (the inputs are {', '.join(names)})")
    feeds: dict[str, Array] = {}
    notes: list[str] = []
    for t in inputs:
        array = arrays[t.name]
        _check_fits(f"--npz {path}: {t.name}", t, array.shape)
        if t.datatype == "BYTES":
            if array.dtype.kind not in "OSU":
                raise UsageError(f"--npz {path}: {t.name} is {array.dtype}, input {t.name} is BYTES")
            feeds[t.name] = array.astype(object)
            continue
        dtype = numpy_dtype(t.datatype)
        if array.dtype != dtype:
            if not _same_kind(array.dtype, dtype):
                raise UsageError(f"--npz {path}: {t.name} is {array.dtype}, input {t.name} is {t.datatype}")
            notes.append(f"--npz: {t.name} cast from {array.dtype} to {dtype}")
            array = array.astype(dtype)
        feeds[t.name] = array
    return feeds, notes


def _same_kind(have: np.dtype[Any], want: np.dtype[Any]) -> bool:
    ints = "iu"
    return have.kind == want.kind or (have.kind in ints and want.kind in ints)
