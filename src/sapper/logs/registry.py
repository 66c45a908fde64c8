"""Which reader a log needs, decided by its content; the one list of log readers.

Every module in :data:`LOG_READERS` exposes ``FORMAT`` (or ``FORMATS``), a
:class:`~sapper.logs.formats.LogFormat`. Detection asks every recogniser of the right
kind (bytes, then text, or a folder's) how confident it is and takes the most confident
format at or above :data:`MIN_CONFIDENCE`; a tie goes to the format listed first. A
file that no format recognises is refused with what each format looks for. Adding a
format is one module and one line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from pathlib import Path

from sapper.errors import InputError
from sapper.logs.formats import LogFormat, first_line

__all__ = [
    "LOG_READERS",
    "MIN_CONFIDENCE",
    "dir_formats",
    "find_log_format",
    "format_names",
    "log_formats",
    "looked_for",
    "recognise_bytes",
    "recognise_dir",
    "recognise_text",
    "supported",
]

#: Reader modules, each with a ``FORMAT`` or ``FORMATS``. Order breaks ties in
#: confidence and is the order ``--log-format`` lists them in.
LOG_READERS: tuple[str, ...] = (
    "sapper.logs.runlog",
    "sapper.logs.trainer_state",
    "sapper.logs.tensorboard",
    "sapper.logs.table",
    "sapper.logs.megatron",
    "sapper.logs.console",
    "sapper.logs.keyvalue",
    "sapper.logs.wandb",
    "sapper.logs.mlflow",
)

#: Below this, a recogniser's "maybe" is not enough to read a file as its format.
MIN_CONFIDENCE = 0.25

@cache
def log_formats() -> tuple[LogFormat, ...]:
    """Every registered format (imported on first use: ``--help`` never pays for them)."""
    out: list[LogFormat] = []
    for name in LOG_READERS:
        module = importlib.import_module(name)
        many = getattr(module, "FORMATS", None)
        out.extend(many if many is not None else (module.FORMAT,))
    return tuple(out)


def format_names() -> tuple[str, ...]:
    """The ``--log-format`` values, in registry order."""
    return tuple(f.name for f in log_formats())


def find_log_format(name: str) -> LogFormat:
    """The format called ``name``; :class:`InputError` naming the valid ones if none."""
    for fmt in log_formats():
        if fmt.name == name:
            return fmt
    raise InputError(
        "unknown log format",
        field="--log-format",
        value=name,
        expected=" / ".join(format_names()),
    )


def supported() -> str:
    """The formats in a user's words, for "expected ..." in error messages."""
    titles = [f.title for f in log_formats()]
    return ", ".join(titles[:-1]) + " or " + titles[-1] if len(titles) > 1 else titles[0]


def looked_for() -> list[str]:
    """What each format looks for, one line each, for a file that none recognised."""
    return [f"{f.name}: {f.title}, from {f.looks_for}" for f in log_formats()]


def _best(scored: list[tuple[float, int, LogFormat]]) -> LogFormat | None:
    if not scored:
        return None
    score, _, fmt = max(scored, key=lambda t: (t[0], t[1]))
    return fmt if score >= MIN_CONFIDENCE else None


def _ask(
    pick: Callable[[LogFormat], Callable[..., float] | None], *args: object
) -> LogFormat | None:
    scored = []
    for i, fmt in enumerate(log_formats()):
        recognise = pick(fmt)
        if recognise is not None:
            score = float(recognise(*args))
            if score > 0:
                scored.append((score, -i, fmt))
    return _best(scored)


def recognise_bytes(head: bytes, path: Path) -> LogFormat | None:
    """The binary format whose recogniser is most confident of ``head`` (None: none is;
    a recogniser may raise for a damaged file of its own format)."""
    return _ask(lambda f: f.recognise_bytes, head, path)


def recognise_text(text: str, path: Path) -> LogFormat:
    """The text format of a decoded head; :class:`InputError` when none recognises it."""
    found = _ask(lambda f: f.recognise_text, text, path)
    if found is not None:
        return found
    first = first_line(text)
    if first.startswith("{"):
        raise InputError(
            "JSON, but neither a trainer_state.json (no log_history) nor JSON lines",
            file=str(path),
            expected="one of these formats (or --log-format NAME)",
            choices=looked_for(),
        )
    raise InputError(
        f"not a log sapper can read (first line: {first[:60]!r})",
        file=str(path),
        expected="one of these formats (or --log-format NAME)",
        choices=looked_for(),
    )


def recognise_dir(folder: Path) -> LogFormat | None:
    """The format that most confidently takes ``folder`` for one of its runs."""
    return _ask(lambda f: f.recognise_dir, folder)


def dir_formats() -> list[LogFormat]:
    """The formats that read folders, for "no log found" messages."""
    return [f for f in log_formats() if f.recognise_dir is not None or f.runs_in is not None]
