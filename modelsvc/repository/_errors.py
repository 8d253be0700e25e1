"""The one error the repository raises: a model whose directory or configuration is unusable."""

from __future__ import annotations

from pathlib import Path


class ConfigError(Exception):
    """A model directory or ``config.pbtxt`` that cannot be used, pointing at the offending place.

    ``str()`` reads ``path:line:column: message``, leaving out the line and column when unknown,
    so editors and terminals can jump to the spot.
    """

    def __init__(self, path: Path | str, message: str, line: int | None = None, column: int | None = None) -> None:
        self.path = Path(path)
        self.message = message
        self.line = line
        self.column = column if line is not None else None
        super().__init__(str(self))

    def __str__(self) -> str:
        where = str(self.path)
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.message}"

    def __reduce__(self) -> tuple[type[ConfigError], tuple[Path, str, int | None, int | None]]:
        return (type(self), (self.path, self.message, self.line, self.column))
