"""Errors that reach the user as one clear line, never as a traceback.

Every input problem names the file, the dotted field path, the bad value and what was
expected, so the CLI can print it and exit with code 2.
"""

from __future__ import annotations

from typing import Any

__all__ = ["InputError", "SapperError"]


class SapperError(Exception):
    """Base of every error sapper raises on purpose; the CLI maps it to one red line."""

    exit_code = 1


class InputError(SapperError):
    """Bad user input: a missing file, malformed YAML/JSON, a wrong type or value."""

    exit_code = 2

    def __init__(
        self,
        problem: str,
        *,
        file: str | None = None,
        field: str | None = None,
        value: Any = None,
        expected: str | None = None,
        has_value: bool | None = None,
    ) -> None:
        self.problem = problem
        self.file = file
        self.field = field
        self.value = value
        self.expected = expected
        self.has_value = value is not None if has_value is None else has_value
        super().__init__(self.format())

    def format(self) -> str:
        where = self.file or "<input>"
        if self.field:
            where += f": {self.field}"
        text = f"{where}: {self.problem}"
        if self.has_value:
            text += f" (got {self.value!r})"
        if self.expected:
            text += f"; expected {self.expected}"
        return text
