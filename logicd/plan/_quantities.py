"""Kubernetes quantities as the planner holds them: CPU in millicores, memory in bytes, accelerators as whole
units, all integers (so that "exactly full" is exact); each reading refuses what is not finite or is negative."""

from __future__ import annotations

import math
import re

__all__ = ["LIMIT", "count_of", "cpu_millis", "format_cpu", "format_memory", "memory_bytes"]

LIMIT = 10**18
"""The largest quantity (millicores, bytes, units) read: far beyond any node, well within exact integers."""

_MEMORY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)")
_UNITS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
}


def _bounded(value: float, what: str, original: object) -> int:
    if not math.isfinite(value):
        raise ValueError(f"{what} is a finite number, got {original!r}")
    if value < 0:
        raise ValueError(f"{what} is not negative, got {original!r}")
    if value > LIMIT:
        raise ValueError(f"{what} {original!r} is beyond any node (more than 10^18)")
    return math.ceil(value - 1e-9)


def cpu_millis(value: str | float) -> int:
    """A Kubernetes CPU quantity (``2``, ``0.5``, ``"500m"``) in millicores, rounded up as Kubernetes does;
    ValueError when it is not one."""
    what = "a CPU quantity"
    if isinstance(value, bool):
        raise ValueError(f"{what} is a number or millicores like '500m', got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("m") and text[:-1].isdigit():
            return _bounded(int(text[:-1]), what, value)
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{what} is a number or millicores like '500m', got {value!r}") from None
    else:
        number = float(value)
    return _bounded(number * 1000, what, value)


def memory_bytes(value: str | float) -> int:
    """A Kubernetes memory quantity with a unit (``"512Mi"``, ``"32Gi"``) in bytes. A bare number is refused:
    Kubernetes reads it as bytes, which is never what a plan means."""
    if isinstance(value, str):
        match = _MEMORY.fullmatch(value.strip())
        if match:
            return _bounded(float(match.group(1)) * _UNITS[match.group(2)], "a memory quantity", value)
    raise ValueError(f"a memory quantity has a unit, like '512Mi' or '32Gi', got {value!r}")


def count_of(value: int, what: str) -> int:
    """A whole count of an extended resource (``nvidia.com/gpu: 1``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > LIMIT:
        raise ValueError(f"{what} is a whole number of devices, 0 or more, got {value!r}")
    return value


def format_cpu(millis: int) -> str:
    return f"{millis // 1000}" if millis % 1000 == 0 else f"{millis}m"


def format_memory(nbytes: int) -> str:
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return f"{-(-nbytes // 2**20)}Mi"
