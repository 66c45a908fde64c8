"""Log text made safe for rich markup: the terminal side of :func:`sapper.errors.printable`.

Kept apart from :mod:`sapper.report.terminal` so the CLI's error line can use it without
importing the checklist renderer.
"""

from __future__ import annotations

import re

from rich.markup import RE_TAGS

from sapper.errors import printable

__all__ = ["safe_markup"]


def safe_markup(text: str) -> str:
    """Text from a log or a user (keys, tags, notes, paths, messages that quote them)
    ready to sit inside rich markup and print literally: control, escape and bidi
    characters escaped (:func:`sapper.errors.printable`), and every ``[`` escaped the way
    rich reads it back, so ``[bold red]`` or ``[/]`` in it is shown, never applied.

    rich's own ``escape`` only escapes what looks like a tag, and rich drops the
    backslash of ``\\[`` anywhere else, so ``\\[x`` from a log would lose its
    backslash: each run of backslashes before a ``[`` is written as rich will count it
    (halved before a tag, less one elsewhere). A trailing backslash is written
    ``\\x5c``: as it is, it would escape the tag that follows."""
    text = printable(text)
    if "[" in text:
        text = _BRACKET.sub(lambda m: _bracket(m, text), text)
    if text.endswith("\\"):
        text = text[:-1] + "\\x5c"
    return text


_BRACKET = re.compile(r"(\\*)\[")


def _bracket(match: re.Match[str], text: str) -> str:
    slashes = len(match.group(1))
    if RE_TAGS.match(text, match.start()):  # rich halves these, an odd one escapes the tag
        return "\\" * (2 * slashes + 1) + "["
    return "\\" * (slashes + 1) + "["  # rich turns ``\\[`` into ``[`` in plain text
