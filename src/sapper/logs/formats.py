"""The contract every log reader keeps: how it is recognised and how it is read.

A log reader is one module exposing ``FORMAT``, a :class:`LogFormat`. The registry
(:mod:`sapper.logs.registry`) lists the modules; detection asks each format how confident
it is that a file (or folder) is its kind, and :class:`~sapper.logs.source.LogSource`
reads it the way :attr:`LogFormat.read_mode` says. No reader imports the registry or the
source, so a new format is one module and one registry line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from sapper.logs.base import LogParser
    from sapper.logs.fields import FieldMap

__all__ = ["LogFormat", "ReadMode"]

#: How a format's bytes reach its parser:
#: ``lines``: an append-only text file, fed line by line as it grows (``parser.feed``);
#: ``snapshot``: one document rewritten in place, parsed whole when it changes
#: (``parser.parse(text)``; the Trainer's ``trainer_state.json``);
#: ``poll``: the parser opens its own files (a TensorBoard or W&B run folder) and returns
#: what is new on each ``parser.poll()``.
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
    #: ``(path, mapping) -> parser``.
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
    #: The training framework the format alone implies (``megatron``, ``hf-trainer``;
    #: one of :data:`sapper.runtime.detector.FRAMEWORKS`), or None when it does not say.
    framework: str | None = None
