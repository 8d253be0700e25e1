"""Find where a field of a parsed ``config.pbtxt`` is written, to put a line and column on an error.

The text is parsed by protobuf; this only scans it for positions. It knows comments and quoted
strings, braces and brackets, nothing else, and answers None when unsure: an error without a
location is better than one pointing at the wrong line.
"""

from __future__ import annotations

import re
from pathlib import Path

from ._errors import ConfigError

_OPEN = {"{": "}", "[": "]", "<": ">"}
_CLOSE = {v: k for k, v in _OPEN.items()}


def _mask(text: str) -> tuple[str, str]:
    """(text without comments, text without comments and string contents), same length as ``text``."""
    code: list[str] = []
    bare: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            code.append(ch)
            if ch == "\\" and i + 1 < len(text):
                code.append(text[i + 1])
                bare.append("  ")
                i += 2
                continue
            if ch == quote:
                quote = ""
                bare.append(ch)
            else:
                bare.append("\n" if ch == "\n" else " ")
        elif ch == "#":
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            code.append(" " * (end - i))
            bare.append(" " * (end - i))
            i = end
            continue
        else:
            if ch in "\"'":
                quote = ch
            code.append(ch)
            bare.append(ch)
        i += 1
    return "".join(code), "".join(bare)


class Locator:
    """Positions of fields in one config text; makes ConfigErrors that carry them."""

    def __init__(self, path: Path, text: str | None) -> None:
        self.path = path
        self.text = text or ""
        self._code, self._bare = _mask(self.text)

    # --- errors ---

    def error(self, message: str, offset: int | None = None) -> ConfigError:
        if offset is None:
            return ConfigError(self.path, message)
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return ConfigError(self.path, message, line, column)

    # --- searching ---

    def _depth(self, offset: int) -> int:
        depth = 0
        for ch in self._bare[:offset]:
            if ch in _OPEN:
                depth += 1
            elif ch in _CLOSE:
                depth -= 1
        return depth

    def _value_end(self, start: int) -> int:
        """End of the bracketed value opening at ``start`` (past the closing bracket)."""
        depth = 0
        for i in range(start, len(self._bare)):
            ch = self._bare[i]
            if ch in _OPEN:
                depth += 1
            elif ch in _CLOSE:
                depth -= 1
                if depth == 0:
                    return i + 1
        return len(self._bare)

    def field(self, name: str, start: int = 0, end: int | None = None, *, top: bool = False) -> int | None:
        """Offset of the first ``name:`` / ``name {`` / ``name [`` in [start, end) (at depth 0 if ``top``)."""
        pattern = re.compile(rf"\b{re.escape(name)}\b(?=\s*[:{{\[<])")
        base = self._depth(start) if top else 0
        for match in pattern.finditer(self._bare, start, len(self._bare) if end is None else end):
            if not top or self._depth(match.start()) == base:
                return match.start()
        return None

    def items(self, name: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
        """Spans of the values of field ``name``: each item of ``name [ {..}, {..} ]``, or ``name {..}``."""
        end = len(self._bare) if end is None else end
        spans: list[tuple[int, int]] = []
        base = self._depth(start)
        pattern = re.compile(rf"\b{re.escape(name)}\b\s*:?\s*([\[{{<])")
        for match in pattern.finditer(self._bare, start, end):
            if self._depth(match.start()) != base:
                continue
            opening = match.start(1)
            close = self._value_end(opening)
            if self._bare[opening] != "[":
                spans.append((opening, close))
                continue
            i = opening + 1
            while i < close - 1:
                if self._bare[i] in "{<":
                    item_end = self._value_end(i)
                    spans.append((i, item_end))
                    i = item_end
                else:
                    i += 1
        return spans

    def item(self, name: str, index: int) -> tuple[int, int] | None:
        spans = self.items(name)
        return spans[index] if 0 <= index < len(spans) else None

    def item_field(self, name: str, index: int, field: str | None = None) -> int | None:
        """Offset of ``field`` inside the index-th item of ``name`` (or of the item itself)."""
        span = self.item(name, index)
        if span is None:
            return None
        if field is not None:
            found = self.field(field, span[0] + 1, span[1], top=True)
            if found is not None:
                return found
        return span[0]

    def named_item(self, name: str, item_name: str, nth: int = 0) -> int | None:
        """Index among the items of ``name`` of the nth one whose ``name`` is ``item_name``."""
        pattern = re.compile(r"\bname\s*:\s*([\"'])(.*?)\1")
        seen = 0
        for index, (start, end) in enumerate(self.items(name)):
            found = self.field("name", start + 1, end, top=True)
            if found is None:
                continue
            match = pattern.match(self._code, found)
            if match and match.group(2) == item_name:
                if seen == nth:
                    return index
                seen += 1
        return None

    def tensor(self, kinds: tuple[str, ...], tensor: str, field: str | None = None, nth: int = 0) -> int | None:
        """Offset of ``field`` (or the ``name``) of the input/output called ``tensor``."""
        for kind in kinds:
            index = self.named_item(kind, tensor, nth)
            if index is not None:
                found = self.item_field(kind, index, field) if field else None
                span = self.item(kind, index)
                if found is None or (span is not None and found == span[0]):
                    found = self.item_field(kind, index, "name")
                return found
        return None
