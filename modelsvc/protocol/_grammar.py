"""Two small grammars that both halves read: gRPC's ``grpc-timeout`` header and the ``pad_inputs`` parameter.

Each is parsed here once, as syntax only; what a value means is the caller's: the gRPC door ignores a timeout it
cannot read (as grpc core does), logicd answers 400 for one; the scheduler checks a ``pad_inputs`` entry against
the model's config and refuses the load, logicd treats a model it cannot read as one that does not pad.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PadEntry", "grpc_timeout_s", "pad_entries"]

#: grpc-timeout's units (the gRPC over HTTP/2 spec): hours, minutes, seconds, milli-, micro-, nanoseconds
_GRPC_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}


def grpc_timeout_s(value: str | bytes) -> float | None:
    """Seconds of a ``grpc-timeout`` value (1 to 8 digits and a unit: ``1500m``, ``2S``), None where it is not
    one. Zero is returned as 0.0: whether that is a deadline already past or an error is the caller's."""
    raw = value.strip().encode("latin-1", "replace") if isinstance(value, str) else value.strip()
    unit = _GRPC_UNITS.get(raw[-1]) if raw else None
    digits = raw[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit


@dataclass(frozen=True)
class PadEntry:
    """One ``NAME:AXIS[=PAD]`` entry of ``pad_inputs`` (or ``NAME:AXIS`` of ``pad_outputs``), as written."""

    name: str
    #: the axis as written (counted without the batch dimension); an integer is the reader's check
    axis: str
    #: the pad value as written, None where the entry has none (the reader's default, 0)
    pad: str | None = None


def pad_entries(text: str, key: str = "pad_inputs", skip_empty: bool = False) -> list[PadEntry]:
    """The comma-separated entries of a padding parameter. ValueError naming the entry where one is not
    ``NAME:AXIS``, or is empty (unless ``skip_empty``: a reader that only needs what is there); the axis and pad
    texts are returned unchecked."""
    entries = [e.strip() for e in text.split(",")]
    if skip_empty:
        entries = [e for e in entries if e]
    elif not text.strip() or any(not e for e in entries):
        raise ValueError(f"parameter '{key}' has an empty entry in '{text}'")
    found = []
    for entry in entries:
        target, eq, pad = entry.partition("=")
        name, sep, axis = target.strip().rpartition(":")
        if not sep or not name:
            raise ValueError(f"parameter '{key}': entry '{target.strip()}' is not NAME:AXIS")
        found.append(PadEntry(name, axis, pad.strip() if eq else None))
    return found
