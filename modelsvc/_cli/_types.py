"""argparse types of the ``modelsvc`` commands: each refuses a bad value with a message naming it."""

from __future__ import annotations

import argparse

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def boolean(text: str) -> bool:
    """argparse type for tritonserver's BOOL flags: true/false, 1/0, yes/no, on/off."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def whole_number(text: str, expected: str = "expected a whole number") -> int:
    """``text`` as an int, or the argparse error ``<expected>, got '<text>'``."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None


def port_number(text: str) -> int:
    """argparse type for a TCP port (0..65535)."""
    port = whole_number(text, "a port is a number")
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0..65535")
    return port


def message_size(text: str) -> int:
    """argparse type for a gRPC message size: 1 byte up to grpcio's limit of 2 GiB - 1."""
    size = whole_number(text, "a size in bytes is a number")
    if not 1 <= size <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"{size} is outside 1..{2**31 - 1} bytes")
    return size


def positive(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    value = whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"cannot be negative, got {value}")
    return value


def tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value

