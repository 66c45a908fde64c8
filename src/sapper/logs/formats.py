"""The contract every log reader keeps: how it is recognised and how it is read.

A log reader is one module exposing ``FORMAT``, a :class:`LogFormat` (a module reading
two closely related formats, such as CSV and JSON-lines tables, exposes ``FORMATS``, a
tuple). The registry (:mod:`sapper.logs.registry`) lists the modules; detection asks each
format how confident it is that a file (or folder) is its kind, and
:class:`~sapper.logs.source.LogSource` reads it the way :attr:`LogFormat.read_mode` says.
No reader imports the registry or the source, so a new format is one module and one
registry line.

Confidence is a number in [0, 1]: 0 says "not mine", about 0.3 "could be" (a tolerant
reader that reads any ``key: value`` line), 0.6 to 0.8 "its markers are there" (a
Megatron iteration line, a numeric CSV table), 1.0 "certain" (a TFRecord whose checksum
holds). A recogniser may raise :class:`~sapper.errors.InputError` when the input is
unmistakably its format but cannot be read (an event file whose first record is
damaged): that message then beats "not a log sapper can read".
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from sapper.logs.base import LogParser
    from sapper.logs.fields import FieldMap

__all__ = ["LogFormat", "ReadMode", "first_line", "first_object"]

#: How a format's bytes reach its parser:
#: ``lines``: an append-only text file, fed line by line as it grows (``parser.feed``);
#: ``snapshot``: one document rewritten in place, parsed whole when it changes
#: (``parser.parse(text)``; the Trainer's ``trainer_state.json``);
#: ``poll``: the parser opens its own files (a TensorBoard or W&B run folder, or one of
#: its files) and returns what is new on each ``parser.poll()``.
ReadMode = Literal["lines", "snapshot", "poll"]


@dataclass(frozen=True)
class LogFormat:
    """One log format sapper reads."""

    #: The ``--log-format`` value and ``LogData.format``: ``megatron``, ``wandb`` ...
    name: str
    #: The log in a user's words: "a Megatron-LM training log".
    title: str
    #: What the recognisers look for, shown when nothing recognises a file.
    looks_for: str
    #: ``(path, mapping) -> parser``. A ``poll`` format's parser is given a run folder
    #: or one file of it, whichever the user named.
    parser: Callable[[Path, dict[str, FieldMap] | None], LogParser]
    read_mode: ReadMode = "lines"
    #: A text file's decoded head (up to 1 MiB, NULs removed) and path -> confidence in
    #: [0, 1]; None: this format is never a text file.
    recognise_text: Callable[[str, Path], float] | None = None
    #: A file's raw first bytes and path -> confidence; for binary formats (event files,
    #: ``.wandb`` records). Asked before any text recogniser.
    recognise_bytes: Callable[[bytes, Path], float] | None = None
    #: A folder -> confidence that it is one run of this format (a TensorBoard run, a
    #: ``wandb/run-*`` folder, an MLflow run).
    recognise_dir: Callable[[Path], float] | None = None
    #: A folder -> the runs of this format in it, each a path to read (a file or a run
    #: folder), in the order to read them; ``[]``: none. Asked of a folder that a user
    #: named: of a folder the format recognised as one run (``runs_in`` may then point at
    #: the file inside to read: a Trainer output folder's latest ``trainer_state.json``),
    #: and, when no format recognised it, of a parent holding runs (a TensorBoard log
    #: folder with one folder per run, ``wandb/`` with its ``run-*`` folders,
    #: ``mlruns/<experiment>/``). None: the format has no such layout; a run folder is
    #: then read as it is.
    runs_in: Callable[[Path], list[Path]] | None = None
    #: The training framework the format alone implies (``megatron``, ``hf-trainer``;
    #: one of :data:`sapper.runtime.detector.FRAMEWORKS`), or None when it does not say.
    framework: str | None = None


def first_line(text: str) -> str:
    """The first line of ``text`` that is not blank, stripped ('' when there is none)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


@functools.lru_cache(maxsize=8)
def first_object(line: str) -> dict[str, Any] | None:
    """The JSON object on a log's first line, or None: several text recognisers ask
    (sapper run log, JSON lines, one-line ``trainer_state.json``), the line is decoded
    once. Depth and integer size are bounded as the readers bound them."""
    if not line.startswith("{"):
        return None
    from sapper.logs.limits import json_int, nested_too_deep

    try:
        obj = None if nested_too_deep(line) else json.loads(line, parse_int=json_int)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    return obj if isinstance(obj, dict) else None
