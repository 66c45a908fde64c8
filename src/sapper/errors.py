"""Errors that reach the user as one clear line, never as a traceback.

Every input problem names the file, the dotted field path, the bad value and what was
expected, so the CLI can print it and exit with code 2.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["MAX_QUOTE_CHARS", "InputError", "SapperError", "clip", "printable", "quote"]

#: Longest value quoted in an error line: enough to recognise it, short enough that a
#: 50 MB string from a hostile file still gives one readable line.
MAX_QUOTE_CHARS = 200
#: Lines of ``InputError.choices`` shown at most.
MAX_CHOICES = 30


def clip(text: str, limit: int = MAX_QUOTE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable escaped as Python writes it
    (``\\n``, ``\\x1b``, ``\\u202e``), so text taken from a log (a key, a tag, a note,
    a file name) keeps a message on one line and can neither drive the terminal nor
    reorder what is shown: C0 and C1 controls, NUL, DEL, ESC sequences, the bidi
    overrides and isolates (U+202A–U+202E, U+2066–U+2069) and the other format
    characters, line and paragraph separators, lone surrogates. ``keep`` names the
    characters left as they are (``"\\n"`` for text shown over several lines).

    The one helper for log text on screen: the terminal report adds rich's markup
    escape (:func:`sapper.report.terminal.safe_markup`), the HTML report applies it to
    every string of its data."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else _escaped(c) for c in text)


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


_CONTAINERS = (list, tuple, dict, set, frozenset)
_BOUNDED_REPR = reprlib.Repr()
_BOUNDED_REPR.maxlevel = 3
_BOUNDED_REPR.maxlist = _BOUNDED_REPR.maxtuple = _BOUNDED_REPR.maxdict = 8
_BOUNDED_REPR.maxset = _BOUNDED_REPR.maxfrozenset = 8
_BOUNDED_REPR.maxstring = _BOUNDED_REPR.maxother = MAX_QUOTE_CHARS


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
        # reprlib renders containers a few levels and items deep: a small list whose items
        # are the same list again (a pickle's shared references) costs no more than any other.
        text = _BOUNDED_REPR.repr(value) if isinstance(value, _CONTAINERS) else repr(value)
    except (ValueError, RecursionError):  # a huge int inside a container, a cycle
        text = f"<a {type(value).__name__}>"
    return clip(text, limit)


class SapperError(Exception):
    """Base of every error sapper raises on purpose; the CLI maps it to one red line."""

    exit_code = 1
    #: Lines shown under the message by the CLI (what would have been accepted); kept out of
    #: ``str(exc)`` so the message itself stays one line wherever it is quoted or logged.
    details: tuple[str, ...] = ()


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
        choices: list[str] | None = None,
    ) -> None:
        self.problem = problem
        #: What would have been accepted, one per line after the message (the formats a
        #: file could have been), when one ``expected`` phrase cannot hold them all.
        self.choices = list(choices or [])[:MAX_CHOICES]
        self.details = tuple(f"  - {printable(clip(c, 2 * MAX_QUOTE_CHARS))}" for c in self.choices)
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
