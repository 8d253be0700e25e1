"""The errors of remote repositories, each with one clear message::

    RemoteRepositoryError          a location that cannot be used: bad URL, missing package, network
    ├── RemoteNotFoundError        the bucket (or container) or the prefix does not exist
    ├── RemoteAccessError          no credentials found, or they are refused
    └── NoModelsError              the prefix holds files but no model folder
"""

from __future__ import annotations

__all__ = ["NoModelsError", "RemoteAccessError", "RemoteNotFoundError", "RemoteRepositoryError"]


class RemoteRepositoryError(Exception):
    """A remote repository location that cannot be used; ``str()`` reads ``location: message``.

    ``location`` is the URL as modelsvc shows it, never with credentials.
    """

    def __init__(self, message: str, location: str | None = None) -> None:
        self.message = message
        self.location = location
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message

    def __reduce__(self) -> tuple[type[RemoteRepositoryError], tuple[str, str | None]]:
        return (type(self), (self.message, self.location))


class RemoteNotFoundError(RemoteRepositoryError):
    """The bucket (or container) does not exist, or nothing is stored under the prefix."""


class RemoteAccessError(RemoteRepositoryError):
    """No credentials were found, or the store refused the ones given."""


class NoModelsError(RemoteRepositoryError):
    """Files exist under the prefix, but no folder among them is a model (no config.pbtxt or version folder)."""
