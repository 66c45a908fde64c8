"""The contract every launch-config reader keeps, and what they share.

A reader is one module that exposes ``FORMAT``, a :class:`ConfigFormat`: a name, the words
a user reads when a file is recognised by nothing (``looks_for``), a ``recognise``
function that scores a file's content from 0 (not this format) to 1 (certainly this
format), and ``read``, which turns the file into a :class:`PlanSource` whose every value
carries the user's own key as its origin. The registry (:mod:`sapper.plan.readers.registry`)
lists the modules; no reader imports it.

A file is read from disk once, within sapper's limits (:func:`read_text_file`), and each
syntax is parsed at most once however many readers ask (:class:`Sniff`).
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from sapper.errors import InputError, clip
from sapper.plan.sources import (
    PlanSource,
    parse_json_text,
    parse_toml_text,
    parse_yaml_text,
    read_text_file,
)
from sapper.rules.model import Finding

__all__ = [
    "ConfigFormat",
    "Sniff",
    "closest",
    "local_model_config",
    "refuse_pickle",
    "unknown_key_findings",
    "unresolved_finding",
]

#: Unknown keys reported one by one; past this, one summary finding.
MAX_UNKNOWN_REPORTED = 20


@dataclass
class Sniff:
    """One config file's text, and its parse in each syntax, computed when first asked.

    A parse that fails is ``None`` and its error is kept (:meth:`error`), so a file that
    no reader recognises because of a syntax error gets that error, not a shrug."""

    path: Path
    text: str
    errors: dict[str, InputError] = field(default_factory=dict)

    @classmethod
    def of(cls, path: str | Path) -> Sniff:
        return cls(Path(path), read_text_file(path))

    @property
    def name(self) -> str:
        return str(self.path)

    @property
    def suffix(self) -> str:
        return self.path.suffix.lower()

    def _parse(self, syntax: str, parse: Callable[[str, str], Any]) -> Any:
        try:
            return parse(self.text, self.name)
        except InputError as exc:
            self.errors[syntax] = exc
            return None

    @cached_property
    def json(self) -> Any:
        """The JSON document, or None (only text that starts like JSON is parsed)."""
        if not self.text.lstrip().startswith(("{", "[")):
            return None
        return self._parse("json", parse_json_text)

    @cached_property
    def yaml(self) -> Any:
        """The YAML document (JSON is YAML too), or None."""
        if self.json is not None:
            return self.json
        return self._parse("yaml", parse_yaml_text)

    @cached_property
    def toml(self) -> dict[str, Any] | None:
        """The TOML document, or None (tried only for ``.toml`` files and text with a
        ``[section]`` line, since TOML's ``key = value`` looks like much else)."""
        head = [line.strip() for line in self.text.splitlines()[:200]]
        if self.suffix != ".toml" and not any(
            line.startswith("[") and line.endswith("]") and "=" not in line for line in head
        ):
            return None
        return self._parse("toml", parse_toml_text)

    @property
    def mapping(self) -> dict[str, Any] | None:
        """The document as a mapping in whichever syntax holds one (JSON, YAML, TOML)."""
        for doc in (self.json, self.yaml, self.toml):
            if isinstance(doc, dict):
                return doc
        return None

    def error(self) -> InputError | None:
        """The parse error of the syntax this file's name or content promises, if any."""
        wanted = {".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}.get(
            self.suffix
        )
        if wanted is None and self.text.lstrip().startswith("{"):
            wanted = "json"
        if wanted is None:
            return None
        getattr(self, wanted)
        return self.errors.get(wanted)


@dataclass(frozen=True)
class ConfigFormat:
    """One launch-config format sapper reads."""

    #: Short name, also the value of ``--config-format``: ``megatron``, ``nemo`` ...
    name: str
    #: The file in a user's words: "a Megatron-LM launch script or argument dump".
    title: str
    #: What :attr:`recognise` looks for, shown when a file is recognised by no reader.
    looks_for: str
    #: Content -> confidence in [0, 1] that this is the format (0: not it).
    recognise: Callable[[Sniff], float]
    #: Content -> Plan values with the user's keys as origins, findings, refs.
    read: Callable[[Sniff], PlanSource]


def closest(key: str, known: Iterable[str], cutoff: float = 0.75) -> str | None:
    """The known key a misspelled one most likely meant (difflib, case and ``-``/``_``
    folded), or None."""
    def fold(k: str) -> str:
        return k.lower().replace("-", "_")

    by_fold = {fold(k): k for k in known}
    if fold(key) in by_fold:
        return by_fold[fold(key)]
    close = difflib.get_close_matches(fold(key), list(by_fold), n=1, cutoff=cutoff)
    return by_fold[close[0]] if close else None


def unknown_key_findings(
    keys: Iterable[str],
    known: Collection[str],
    *,
    file: str,
    framework: str,
    effect: str,
) -> list[Finding]:
    """C005 for each key in ``keys`` that ``framework`` does not know, with the key it most
    likely meant. ``effect`` says what the framework does with an unknown key (ignores it,
    refuses to start ...), which is what makes the typo matter."""
    from sapper.plan.rules import UNKNOWN_CONFIG_KEY

    findings: list[Finding] = []
    article = "an" if framework[:1].lower() in "aeio" else "a"
    unknown = [k for k in keys if k not in known]
    for key in unknown[:MAX_UNKNOWN_REPORTED]:
        hint = closest(key.lstrip("-").split(".")[-1], {k.split(".")[-1] for k in known})
        if hint is not None and "." in key:
            hint = key.rsplit(".", 1)[0] + "." + hint
        if hint is not None and key.startswith("--"):
            hint = "--" + hint.lstrip("-")
        mean = f"; did you mean {hint}?" if hint and hint != key else ""
        findings.append(
            UNKNOWN_CONFIG_KEY.finding(
                f"{clip(key)} is not {article} {framework} setting{mean} {effect}",
                source=f"{file}: {clip(key)}",
                key=clip(key),
                suggestion=hint,
            )
        )
    if len(unknown) > MAX_UNKNOWN_REPORTED:
        more = len(unknown) - MAX_UNKNOWN_REPORTED
        findings.append(
            UNKNOWN_CONFIG_KEY.finding(
                f"{more} more keys {framework} does not know (only the first "
                f"{MAX_UNKNOWN_REPORTED} are listed)",
                source=file,
            )
        )
    return findings


def unresolved_finding(
    src: PlanSource, key: str, field: str, why: str, fix: str
) -> Finding:
    """C006: ``key`` would set plan ``field`` but its value cannot be known from the file
    (an unset ``$VAR``, a hub model name, an interpolation into another file). The field
    is listed as unresolved, so the checks that need it say ``unknown`` instead of running
    on a guess."""
    from sapper.plan.rules import UNRESOLVED_VALUE

    if field not in src.unresolved:
        src.unresolved.append(field)
    finding = UNRESOLVED_VALUE.finding(
        f"{clip(key)}: {why}",
        fix=fix,
        source=f"{src.name}: {clip(key)}",
        key=clip(key),
        field=field,
    )
    src.findings.append(finding)
    return finding


def local_model_config(value: Any, base: Path) -> Path | None:
    """The ``config.json`` a model reference names, when it is on this machine: the file
    itself, or a folder holding one (resolved against ``base``). A hub name such as
    ``meta-llama/Llama-2-7b-hf`` is None: sapper never downloads."""
    if not isinstance(value, str) or not value.strip():
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base / path
    try:
        if path.is_file():
            return path
        if (path / "config.json").is_file():
            return path / "config.json"
    except OSError:
        return None
    return None


#: The first bytes of a pickle (protocols 2-5) and of torch's zip-archive format.
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")


def refuse_pickle(path: str | Path) -> InputError | None:
    """The error for a pickle given as a config (the Trainer's ``training_args.bin``: a
    zip archive or a raw pickle), or None when the file is something else. Only four bytes
    of a regular file are read."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a FIFO or a device is never opened (a FIFO blocks)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            head = fh.read(4)
    except (OSError, ValueError):
        return None
    if not any(head.startswith(magic) for magic in _PICKLE_MAGIC):
        return None
    return InputError(
        "a pickled Python object (such as the Trainer's training_args.bin); sapper never "
        "unpickles a file, because unpickling runs code from it",
        file=str(path),
        expected="the JSON of args.to_json_string() (the Trainer writes it to "
        "training_args.json when asked), or the command line that launched the script",
    )
