"""Optimization profiles for ``modelsvc build``: trtexec's shape flags parsed, or derived from a config.pbtxt.

A profile gives each dynamic input a (min, opt, max) shape; TensorRT tunes for opt and accepts anything
between min and max. ``--min-shapes/--opt-shapes/--max-shapes name:AxB,name2:CxD`` are trtexec's flags
(trtexec spells them ``--minShapes`` ...); each may be repeated, and the n-th of each forms profile n.

From a config.pbtxt (``--from-config``) the one profile is:

- the batch dim (when ``max_batch_size`` > 0): 1 .. ``max_batch_size``, opt the largest
  ``dynamic_batching.preferred_batch_size`` or else half of ``max_batch_size`` (rounded up);
- each other ``-1`` dim: 1 .. ``max_sequence_length`` (512, our services' token limit), opt
  ``min(128, max_sequence_length)``: in our repositories only sequence axes are dynamic;
- fixed dims as they are.

Everything here is pure: no TensorRT, no files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..inspect_model import TensorInfo
from ._errors import BuildUsageError

__all__ = [
    "DEFAULT_MAX_SEQUENCE_LENGTH",
    "OPT_SEQUENCE_LENGTH",
    "Profile",
    "Shape",
    "ShapeRange",
    "check_profiles",
    "format_shape",
    "opt_batch_size",
    "parse_profiles",
    "parse_shape_spec",
    "profile_shapes",
    "profiles_from_config",
]

Shape = tuple[int, ...]

#: the longest sequence a derived profile accepts unless --max-sequence-length says otherwise
DEFAULT_MAX_SEQUENCE_LENGTH = 512
#: the sequence length a derived profile tunes for (the typical request of our services)
OPT_SEQUENCE_LENGTH = 128


class ShapeRange(NamedTuple):
    """The shapes one input accepts in one profile: ``min <= opt <= max`` in every dim."""

    min: Shape
    opt: Shape
    max: Shape


#: input name -> its range, for one optimization profile
Profile = dict[str, ShapeRange]


def format_shape(shape: Sequence[int]) -> str:
    """``(1, 128)`` -> ``1x128``, trtexec's spelling."""
    return "x".join(str(d) for d in shape)


def parse_shape_spec(text: str, flag: str) -> dict[str, Shape]:
    """``name:AxB,name2:CxD`` -> ``{"name": (A, B), "name2": (C, D)}``; ``flag`` names the flag in errors.

    A name may hold colons (the shape is what follows the last one), not commas.
    """
    if not text.strip():
        raise BuildUsageError(f"{flag} is empty: write name:AxB[,name2:CxD...]")
    shapes: dict[str, Shape] = {}
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise BuildUsageError(f"{flag} {text!r} has an empty entry (two commas, or one at an end)")
        name, colon, dims_text = entry.rpartition(":")
        if not colon:
            raise BuildUsageError(f"{flag}: {entry!r} has no shape; write {entry}:AxB (dims joined by x)")
        if not name:
            raise BuildUsageError(f"{flag}: {entry!r} has no tensor name before the colon")
        if name in shapes:
            raise BuildUsageError(f"{flag}: tensor {name!r} is given twice")
        if not dims_text:
            raise BuildUsageError(f"{flag}: tensor {name!r} has no dims after the colon; write {name}:AxB")
        dims: list[int] = []
        for part in dims_text.split("x"):
            if not part.strip().isdigit():
                raise BuildUsageError(
                    f"{flag}: tensor {name!r} has shape {dims_text!r}, whose dim {part!r} is not a whole number"
                )
            value = int(part)
            if value < 1:
                raise BuildUsageError(f"{flag}: tensor {name!r} has shape {dims_text!r}, whose dims must be at least 1")
            dims.append(value)
        shapes[name] = tuple(dims)
    return shapes


def parse_profiles(mins: Sequence[str], opts: Sequence[str], maxs: Sequence[str]) -> list[Profile]:
    """The profiles the repeated shape flags give: the n-th of each flag forms profile n (counted from 0)."""
    counts = {"--min-shapes": len(mins), "--opt-shapes": len(opts), "--max-shapes": len(maxs)}
    if len(set(counts.values())) > 1:
        given = ", ".join(f"{flag} {n} time{'s' if n != 1 else ''}" for flag, n in counts.items())
        raise BuildUsageError(f"each profile needs all three shape flags, once each: given {given}")
    profiles: list[Profile] = []
    for index, texts in enumerate(zip(mins, opts, maxs, strict=True)):
        parsed = [parse_shape_spec(t, f) for t, f in zip(texts, counts, strict=True)]
        profiles.append(_profile(index, *parsed))
    return profiles


def _profile(index: int, mins: dict[str, Shape], opts: dict[str, Shape], maxs: dict[str, Shape]) -> Profile:
    flags = dict(zip(("--min-shapes", "--opt-shapes", "--max-shapes"), (mins, opts, maxs), strict=True))
    names = [*mins, *(n for n in opts if n not in mins), *(n for n in maxs if n not in mins and n not in opts)]
    profile: Profile = {}
    for name in names:
        missing = [flag for flag, shapes in flags.items() if name not in shapes]
        if missing:
            present = [flag for flag in flags if flag not in missing]
            raise BuildUsageError(
                f"profile {index}: tensor {name!r} is in {' and '.join(present)} but not in {' or '.join(missing)}"
            )
        low, opt, high = mins[name], opts[name], maxs[name]
        if not len(low) == len(opt) == len(high):
            raise BuildUsageError(
                f"profile {index}: tensor {name!r} has shapes of different ranks: min {format_shape(low)}, "
                f"opt {format_shape(opt)}, max {format_shape(high)}"
            )
        for axis, (a, b, c) in enumerate(zip(low, opt, high, strict=True)):
            if not a <= b <= c:
                raise BuildUsageError(
                    f"profile {index}: tensor {name!r} dim {axis} needs min <= opt <= max, got {a}, {b}, {c} "
                    f"(min {format_shape(low)}, opt {format_shape(opt)}, max {format_shape(high)})"
                )
        profile[name] = ShapeRange(low, opt, high)
    return profile


def check_profiles(profiles: Sequence[Profile], inputs: Sequence[TensorInfo]) -> list[Profile]:
    """Check the profiles against the model's inputs (``-1`` for a dynamic dim) and complete them.

    Every dynamic input needs a range in every profile; a named tensor must be an input of the model with
    its rank, and a fixed dim must keep its size. Inputs without dynamic dims that a profile leaves out are
    added with their fixed shape. With no profiles and no dynamic inputs, the one profile is the fixed shapes.
    """
    by_name = {t.name: t for t in inputs}
    dynamic = [t for t in inputs if any(d < 0 for d in t.dims)]
    if not profiles:
        if dynamic:
            listed = ", ".join(f"{t.name!r} {list(t.dims)}" for t in dynamic)
            raise BuildUsageError(
                f"the model has dynamic inputs ({listed}): give --min-shapes/--opt-shapes/--max-shapes "
                "or --from-config REPO/NAME"
            )
        profiles = [{}]
    completed: list[Profile] = []
    for index, profile in enumerate(profiles):
        for name, ranges in profile.items():
            tensor = by_name.get(name)
            if tensor is None:
                raise BuildUsageError(
                    f"profile {index}: tensor {name!r} is not an input of the model "
                    f"(its inputs: {', '.join(by_name) or 'none'})"
                )
            if len(ranges.min) != len(tensor.dims):
                raise BuildUsageError(
                    f"profile {index}: tensor {name!r} is given rank {len(ranges.min)} "
                    f"({format_shape(ranges.min)}), the model's input has rank {len(tensor.dims)} {list(tensor.dims)}"
                )
            for axis, fixed in enumerate(tensor.dims):
                if fixed >= 0 and not ranges.min[axis] == ranges.opt[axis] == ranges.max[axis] == fixed:
                    raise BuildUsageError(
                        f"profile {index}: tensor {name!r} dim {axis} is fixed at {fixed} in the model, the profile "
                        f"gives {ranges.min[axis]}..{ranges.max[axis]}"
                    )
        for tensor in inputs:
            if tensor.name in profile:
                continue
            if tensor in dynamic:
                raise BuildUsageError(
                    f"profile {index}: input {tensor.name!r} has dynamic dims {list(tensor.dims)} "
                    "and needs shapes in every profile"
                )
        fixed_shapes = {
            t.name: ShapeRange(t.dims, t.dims, t.dims) for t in inputs if t.name not in profile and t not in dynamic
        }
        completed.append({**profile, **fixed_shapes})
    return completed


def opt_batch_size(max_batch_size: int, preferred: Sequence[int] = ()) -> int:
    """The batch size a derived profile tunes for: the largest preferred one, else half the max (rounded up)."""
    fitting = [p for p in preferred if 1 <= p <= max_batch_size]
    if fitting:
        return max(fitting)
    return max(1, (max_batch_size + 1) // 2)


def profiles_from_config(
    config: Any, max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH, where: str = "config.pbtxt"
) -> list[Profile]:
    """The one profile a ``ModelConfig`` implies (see the module's docstring); ``where`` names it in errors."""
    if max_sequence_length < 1:
        raise BuildUsageError(f"--max-sequence-length must be at least 1, got {max_sequence_length}")
    name = config.name or "the model"
    if config.platform == "ensemble":
        raise BuildUsageError(f"{where}: {name!r} is an ensemble; build the models of its steps one by one")
    if not config.input:
        raise BuildUsageError(
            f"{where}: {name!r} lists no inputs (it leaves them to auto-complete), so no profile can be derived; "
            "list them there or give --min-shapes/--opt-shapes/--max-shapes"
        )
    batch = int(config.max_batch_size)
    if batch < 0:
        raise BuildUsageError(f"{where}: max_batch_size {batch} is negative")
    opt_batch = opt_batch_size(batch, list(config.dynamic_batching.preferred_batch_size)) if batch else 0
    opt_length = min(OPT_SEQUENCE_LENGTH, max_sequence_length)
    profile: Profile = {}
    for entry in config.input:
        dims = [int(d) for d in entry.dims]
        if entry.HasField("reshape"):
            raise BuildUsageError(
                f"{where}: input {entry.name!r} has a reshape, so its dims are not the model's; "
                "give the model's shapes with --min-shapes/--opt-shapes/--max-shapes"
            )
        if getattr(entry, "is_shape_tensor", False):
            raise BuildUsageError(
                f"{where}: input {entry.name!r} is a shape tensor, whose values a profile cannot derive; "
                "build with --min-shapes/--opt-shapes/--max-shapes"
            )
        if any(d < -1 or d == 0 for d in dims):
            raise BuildUsageError(f"{where}: input {entry.name!r} has dims {dims}: each is -1 or at least 1")
        if batch == 0 and -1 in dims:
            raise BuildUsageError(
                f"{where}: max_batch_size is 0 and input {entry.name!r} has dims {dims}: which -1 is the batch and "
                "which a sequence cannot be told; give --min-shapes/--opt-shapes/--max-shapes"
            )
        low = [1 if d == -1 else d for d in dims]
        opt = [opt_length if d == -1 else d for d in dims]
        high = [max_sequence_length if d == -1 else d for d in dims]
        if batch:
            low, opt, high = [1, *low], [opt_batch, *opt], [batch, *high]
        profile[entry.name] = ShapeRange(tuple(low), tuple(opt), tuple(high))
    return [profile]


def profile_shapes(profile: Profile) -> list[dict[str, Shape]]:
    """The input shapes a check runs for one profile: its min, opt and max (each once)."""
    seen: list[dict[str, Shape]] = []
    for pick in range(3):
        shapes = {name: ranges[pick] for name, ranges in profile.items()}
        if shapes not in seen:
            seen.append(shapes)
    return seen
