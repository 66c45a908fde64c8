"""Errors that reach the user as one clear line, never as a traceback.

Every input problem names the file, the dotted field path, the bad value and what was
expected, so the CLI can print it and exit with code 2.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_QUOTE_CHARS", "InputError", "SapperError", "clip", "printable", "quote"]

#: Longest value quoted in an error line: enough to recognise it, short enough that a
#: 50 MB string from a hostile file still gives one readable line.
MAX_QUOTE_CHARS = 200


def clip(text: str, limit: int = MAX_QUOTE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``), so a key or a
    path from a hostile file keeps the message on one line and cannot drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def quote(value: Any, limit: int = MAX_QUOTE_CHARS) -> str:
    """``repr(value)`` clipped to ``limit`` characters.

    Containers are cut before they are rendered, so quoting a huge list costs no more than
    quoting a short one, and an integer too long for ``repr`` (Python refuses ints past
    ``sys.get_int_max_str_digits()`` digits) is described by its size instead.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    if isinstance(value, (list, tuple, dict, set)) and len(value) > 20:
        kind = type(value).__name__
        return f"a {kind} of {len(value)} items"
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # a huge int inside a container, a cycle
        text = f"<a {type(value).__name__}>"
    return clip(text, limit)


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
            where += f": {clip(self.field)}"
        text = f"{where}: {clip(self.problem, 2 * MAX_QUOTE_CHARS)}"
        if self.has_value:
            text += f" (got {quote(self.value)})"
        if self.expected:
            text += f"; expected {clip(self.expected, 5 * MAX_QUOTE_CHARS)}"
        return printable(text)
