"""The error a bad configuration raises: :class:`ConfigError`, whose message names the file, the key and the
cause; and :class:`FieldError`, what a section's own checks raise, with the key relative to the section.
"""

from __future__ import annotations

__all__ = ["ConfigError", "FieldError"]


class ConfigError(ValueError):
    """The configuration is invalid; the message names the file, the key and the cause.

    ``str(error)`` reads ``service.yaml: chunking.stride: must be smaller than chunking.max_tokens (512),
    got 600``, with ``:line:column`` after the file for YAML syntax errors and ``(from environment
    variable LOGICD_...)`` when an override was involved.
    """

    def __init__(
        self,
        reason: str,
        *,
        source: str | None = None,
        key: str | None = None,
        env_vars: tuple[str, ...] = (),
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.reason = reason
        """What is wrong, without the location."""
        self.source = source
        """The file as given to :func:`load_config`; ``None`` for a config built in code."""
        self.key = key
        """Dotted key path (``models[0].name``); ``None`` when the error is not about one key."""
        self.env_vars = env_vars
        """Environment variables whose overrides are involved."""
        self.line = line
        """1-based line of a YAML error."""
        self.column = column
        """1-based column of a YAML error."""
        super().__init__(self._render())

    def _render(self) -> str:
        parts = []
        if self.source is not None:
            where = self.source
            if self.line is not None:
                where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
            parts.append(where)
        if self.key:
            parts.append(self.key)
        parts.append(self.reason)
        text = ": ".join(parts)
        unnamed = [var for var in self.env_vars if var not in self.reason]
        if unnamed:
            noun = "variable" if len(unnamed) == 1 else "variables"
            text += f" (from environment {noun} {', '.join(unnamed)})"
        return text


class FieldError(ConfigError):
    """Raised by a section's checks: ``key`` is relative to the section; ``related`` are sibling keys the
    reason mentions, so the loader can qualify them (``max_tokens`` → ``chunking.max_tokens``)."""

    def __init__(self, key: str, reason: str, related: tuple[str, ...] = ()) -> None:
        self.related = related
        super().__init__(reason, key=key)
