"""The bounds every log reader keeps, so a hostile or damaged log costs bounded time and
memory and ends in a note or one error line, never a crash or a hang.

Logs come from crashed nodes, half-copied files and other people's tools: NUL blocks, a
stray ``\\r``, a 5000-digit number, JSON nested 100,000 deep, a FIFO or ``/dev/zero``
given by mistake. The config loaders (:mod:`sapper.plan.sources`) bound the same things
for plans; the limits that mean the same thing (nesting) are theirs, reused here.

* Only regular files are read (a FIFO blocks for ever on open, ``/dev/zero`` never
  ends); standard input is read by ``sapper watch -`` through its own follower.
* A log file is at most :data:`MAX_LOG_BYTES`; a ``trainer_state.json``, parsed as one
  document, at most :data:`MAX_STATE_BYTES`.
* A line longer than :data:`MAX_LINE_CHARS` is skipped and counted.
* A JSON value nested deeper than :data:`MAX_NESTING` is an unreadable line.
* An integer literal of more than :data:`MAX_INT_DIGITS` digits is read as a float
  (Python's ``int()`` takes quadratic time on long digit strings and refuses more than
  4300 digits); as a step or a count it is then out of range and skipped.
* Steps and counts are integers in ``0 … MAX_COUNT`` (numpy's int64 holds them).
"""

from __future__ import annotations

import codecs
import math
import os
from pathlib import Path
from typing import IO, Any

from sapper.errors import InputError, clip
from sapper.plan.sources import MAX_NESTING, special_kind

__all__ = [
    "MAX_COUNT",
    "MAX_INT_DIGITS",
    "MAX_LINE_CHARS",
    "MAX_LOG_BYTES",
    "MAX_NESTING",
    "MAX_STATE_BYTES",
    "any_too_deep",
    "check_regular",
    "json_int",
    "nested_too_deep",
    "open_log",
    "read_json_document",
    "refuse_special",
    "sniff_encoding",
    "to_count",
]

#: Largest log file ``sapper analyze``/``report`` read (a million-step Megatron log is
#: about 400 MB). The records of a larger one would not fit in memory anyway.
MAX_LOG_BYTES = 8 << 30
#: Largest ``trainer_state.json``: it is parsed as one JSON document (a run of a million
#: logged steps writes about 200 MB).
MAX_STATE_BYTES = 1 << 30
#: Longest line read; a longer one is skipped (a real log line is under a few KB, a
#: sapper record with per-layer gradient norms of a 100-layer model about 10 KB).
MAX_LINE_CHARS = 1 << 20
#: Longest integer literal in a JSON log read as an integer (int64 has 19 digits).
MAX_INT_DIGITS = 18
#: Largest step number or count (tokens, samples) kept: int64's maximum.
MAX_COUNT = 2**63 - 1

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def check_regular(path: str | Path, what: str = "a training log") -> os.stat_result:
    """``os.stat`` of ``path``, or an InputError if it is missing or not a regular file.

    Checked before anything opens the path: opening a FIFO blocks until a writer comes,
    and a device such as ``/dev/zero`` never ends."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError("no such file or folder", file=str(path)) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise InputError(f"cannot read it ({_reason(exc)})", file=str(path)) from None
    kind = special_kind(info.st_mode)
    if kind is not None and kind != "a folder":
        raise InputError(f"is {kind}, not a regular file", file=str(path), expected=what)
    return info


def refuse_special(path: str | Path) -> None:
    """An InputError if ``path`` exists and is neither a regular file nor a folder; a
    path that does not exist yet passes (``sapper watch`` waits for it)."""
    try:
        check_regular(path)
    except InputError:
        if os.path.lexists(path) or os.path.exists(path):
            raise


def open_log(path: str | Path, limit: int | None = MAX_LOG_BYTES) -> IO[bytes]:
    """The file opened for binary reading, once it is known to be a regular file of at
    most ``limit`` bytes (None: any size, for a reader of the first bytes only). Opened
    non-blocking and checked again on the descriptor, in case the name was swapped for a
    FIFO between the two calls."""
    name = str(path)
    info = check_regular(path)
    if special_kind(info.st_mode) is not None:
        raise InputError("is a folder, not a log file", file=name,
                         expected="a log file, or --log-format tensorboard / trainer_state")
    if limit is not None and info.st_size > limit:
        raise too_big(name, limit, info.st_size)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputError(f"cannot read it ({_reason(exc)})", file=name) from None
    fh = os.fdopen(fd, "rb")
    kind = special_kind(os.fstat(fd).st_mode)
    if kind is not None:
        fh.close()
        raise InputError(f"is {kind}, not a regular file", file=name, expected="a training log")
    return fh


def too_big(name: str, limit: int, size: int | None = None) -> InputError:
    """The error for a file over ``limit`` bytes (``size`` None: it said less than it
    held, as files under /proc do)."""
    held = f"is {size / (1 << 30):.1f} GiB" if size is not None else "holds more"
    return InputError(
        f"the file {held}, over the {_size(limit)} limit for a log",
        file=name,
        expected="a training log (see Limits in docs/analyze.md)",
    )


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc)


def sniff_encoding(head: bytes) -> str:
    """The text encoding its byte-order mark says (Windows tools export UTF-16 CSVs
    with one), else UTF-8."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    return "utf-8"


def json_int(text: str) -> int | float:
    """``parse_int`` for :func:`json.loads` on logs: short literals as ints, longer ones
    as floats (``inf`` past 308 digits), so no ``int()`` runs on a long digit string."""
    if len(text) > MAX_INT_DIGITS:
        return float(text)
    return int(text)


def nested_too_deep(text: str) -> bool:
    """Whether the JSON text nests deeper than MAX_NESTING. Counting brackets is cheap
    (the common line has a handful), so the exact walk runs only on suspicious lines."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return False
    depth = top = 0
    quoted = escaped = False
    for ch in text:
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch in "[{":
            depth += 1
            if depth > top:
                top = depth
                if top > MAX_NESTING:
                    return True
        elif ch in "]}":
            depth -= 1
    return False


def any_too_deep(texts: list[str]) -> bool:
    """Whether any of the JSON lines nests deeper than MAX_NESTING: two C-level counts
    a line, the walk only for the rare line with many brackets."""
    return any(
        nested_too_deep(t) for t in texts if t.count("[") + t.count("{") > MAX_NESTING
    )


def to_count(value: Any) -> int | None:
    """A step number or count as an int in ``0 … MAX_COUNT``; ``None`` for anything else
    (NaN, inf, negative, too large, not a number)."""
    if value.__class__ is int:
        return value if 0 <= value <= MAX_COUNT else None
    if isinstance(value, float):
        if not math.isfinite(value) or not 0 <= value <= MAX_COUNT:
            return None
        return int(value)
    return None


def read_json_document(path: str | Path, limit: int = MAX_STATE_BYTES) -> Any:
    """A JSON document a training tool wrote (a W&B summary, a findings artifact),
    bounded like the logs: a regular file of at most ``limit`` bytes, nesting checked
    before parsing, long integer literals read as floats. Unlike a plan or config file,
    ``NaN`` and ``Infinity`` are values here (Python's json writes a NaN loss so)."""
    import json

    name = str(path)
    with open_log(path, limit) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise too_big(name, limit)
    text = data.decode(sniff_encoding(data), errors="replace").lstrip("\ufeff")
    if nested_too_deep(text):
        raise InputError(
            f"nested deeper than {MAX_NESTING} levels", file=name, expected="a JSON document"
        )
    try:
        return json.loads(text, parse_int=json_int)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"not valid JSON ({clip(str(exc), 120)})", file=name) from None
