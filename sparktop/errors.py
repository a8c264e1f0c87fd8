"""Errors a user can act on.

Every error sparktop raises on purpose derives from `SparktopError`; the CLI
prints its message as one line and exits non-zero, with no traceback. The
message must say where the problem is (file:line and key, or host and
command) and, where possible, what to do about it.
"""

from __future__ import annotations


class SparktopError(Exception):
    """An error with a one-line message meant for the user."""

    exit_code = 2


class ConfigError(SparktopError):
    """A problem in a file the user wrote (inventory, recipe, settings)."""

    def __init__(self, path: str, line: int | None, key: str | None, message: str):
        self.path = str(path)
        self.line = line
        self.key = key
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"{key}: {message}" if key else message
        super().__init__(f"{where}: {what}")
