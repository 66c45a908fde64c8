"""Which reader a path needs, from its content first and its name second.

Users point sapper at whatever they have: a ``trainer_state.json``, a checkpoint or
output folder, a TensorBoard run folder (or its parent with one folder per run), a W&B
CSV, a Megatron ``train.log``, a console log, a sapper run log. Names lie (``log.txt`` is
any of them), so the first bytes decide: every registered format
(:mod:`sapper.logs.registry`) says how confident it is, binary recognisers first, and the
most confident reads it. Anything else is refused with one line saying what was found
and what each format looks for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapper.errors import InputError

if TYPE_CHECKING:
    from sapper.logs.formats import LogFormat

__all__ = [
    "FORMATS",
    "SUPPORTED",
    "decode_head",
    "detect_format",
    "detect_text",
    "expand_paths",
]

#: ``FORMATS`` (the ``--log-format`` values, in registry order) and ``SUPPORTED`` (the
#: formats in a user's words) are built from the registry when first asked for.
FORMATS: tuple[str, ...]
SUPPORTED: str

_HEAD = 1 << 20  # Megatron prints hundreds of argument lines before the first iteration
#: Files passed over in one folder that are named one by one; the rest are counted.
MAX_SKIPPED_NAMED = 20


def __getattr__(name: str) -> Any:
    """``FORMATS`` (the ``--log-format`` values) and ``SUPPORTED`` (the formats in a
    user's words) come from the registry, built when first asked for."""
    from sapper.logs import registry

    if name == "FORMATS":
        return registry.format_names()
    if name == "SUPPORTED":
        return registry.supported()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_CONTROL = "".join(chr(c) for c in range(32) if c not in (9, 10, 13))
_NO_CONTROL = str.maketrans("", "", _CONTROL)


def _supported() -> str:
    from sapper.logs.registry import supported

    return supported()


def decode_head(head: bytes, path: str | Path) -> str:
    """Text, unless the bytes are mostly not text. A crashed node can leave NUL blocks
    or a torn UTF-8 character in a real log; those do not make it binary: NULs are
    skipped (as the readers skip them), and of the rest at most a tenth may be other
    control characters or undecodable bytes. A byte-order mark picks the encoding.
    A console log's ANSI colour codes are escape characters, but few (under a tenth)."""
    from sapper.logs.limits import sniff_encoding

    text = head.decode(sniff_encoding(head), errors="replace").lstrip("\ufeff")
    if "\x00" in text:
        text = text.replace("\x00", "")
        if not text.strip():
            raise InputError("the file holds only NUL bytes", file=str(path),
                             expected=_supported())
    odd = len(text) - len(text.translate(_NO_CONTROL)) + text.count("\ufffd")
    if odd > 0.1 * len(text):
        raise _binary(path)
    return text


def _binary(path: str | Path) -> InputError:
    return InputError("binary data, not a training log", file=str(path), expected=_supported())


def detect_format(path: str | Path) -> str:
    """The format of one file or folder (see :data:`FORMATS`); :class:`InputError` if none.
    Only regular files are opened (a FIFO or a device is refused at once)."""
    from sapper.logs.limits import open_log
    from sapper.logs.registry import recognise_bytes

    path = Path(path)
    if path.is_dir():
        return _detect_dir(path)
    try:
        with open_log(path, limit=None) as fh:  # only the head is read
            head = fh.read(_HEAD)
    except OSError as exc:
        raise InputError(f"cannot read it ({exc.strerror})", file=str(path)) from None
    if not head.strip():
        raise InputError("the file is empty", file=str(path), expected=_supported())
    found = recognise_bytes(head, path)
    if found is not None:
        return found.name
    return _detect_text(decode_head(head, path), path)


def detect_text(text: str, name: str | Path = "<stdin>") -> str:
    """The format of a log from its first complete lines, for input that is not a file
    yet to open (a pipe, a file still being written); ``name`` only lends its suffix."""
    text = text.lstrip("\ufeff")
    if not text.strip():
        raise InputError("no complete line yet", file=str(name), expected=_supported())
    return _detect_text(text, Path(name))


def _detect_text(text: str, path: Path) -> str:
    from sapper.logs.registry import recognise_text

    return recognise_text(text, path).name


def _no_log(path: Path) -> InputError:
    from sapper.logs.registry import dir_formats

    return InputError(
        "no log found in this folder",
        file=str(path),
        expected="a folder holding logs, or one of: "
        + "; ".join(f"{f.title} ({f.looks_for})" for f in dir_formats()),
    )


def _detect_dir(path: Path) -> str:
    from sapper.logs.registry import recognise_dir

    found = recognise_dir(path)
    if found is None:
        raise _no_log(path)
    return found.name


def expand_paths(
    paths: list[str | Path], skipped: list[str] | None = None
) -> list[tuple[Path, str | None]]:
    """Paths to read, one per run. A folder that a format recognises as one run is that
    run (a HF output folder: its latest checkpoint's ``trainer_state.json``); a parent of
    runs (TensorBoard runs, W&B or MLflow runs) becomes one entry per run; any other
    folder becomes the logs in it. ``skipped`` (when given) gets one line per file of
    such a folder that was passed over, naming it and why."""
    out: list[tuple[Path, str | None]] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            out.append((path, None))
            continue
        out.extend(_expand_dir(path, skipped))
    return out


def _runs(fmt: LogFormat, folder: Path) -> list[tuple[Path, str | None]]:
    runs = fmt.runs_in(folder) if fmt.runs_in is not None else []
    return [(run, fmt.name) for run in runs] or [(folder, fmt.name)]


def _run_entries(folder: Path) -> list[tuple[Path, str | None]]:
    """The folder as one run a format recognises, else the runs a format lists in it
    (formats asked in registry order), else nothing."""
    from sapper.logs.registry import log_formats, recognise_dir

    fmt = recognise_dir(folder)
    if fmt is not None:
        return _runs(fmt, folder)
    for fmt in log_formats():
        if fmt.runs_in is not None:
            runs = fmt.runs_in(folder)
            if runs:
                return [(run, fmt.name) for run in runs]
    return []


def _expand_dir(folder: Path, skipped: list[str] | None) -> list[tuple[Path, str | None]]:
    runs = _run_entries(folder)
    if runs:
        return runs
    logs, passed = _logs_in(folder)
    if not logs:
        raise _no_log(folder)
    if skipped is not None:
        skipped.extend(passed[:MAX_SKIPPED_NAMED])
        if len(passed) > MAX_SKIPPED_NAMED:
            skipped.append(f"... and {len(passed) - MAX_SKIPPED_NAMED} more file(s) in {folder}")
    return logs


def _logs_in(folder: Path) -> tuple[list[tuple[Path, str | None]], list[str]]:
    """A plain folder of logs: every file in it that is a log, and the runs in its
    sub-folders (a run folder, or a parent of runs such as ``wandb/``); and, one line
    each, the files passed over (scripts, READMEs, unreadable files) with the reason.
    One bad file does not stop the rest."""
    found: list[tuple[Path, str | None]] = []
    passed: list[str] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise InputError(f"cannot list it ({exc.strerror})", file=str(folder)) from None
    for entry in entries:
        try:
            if entry.is_dir():
                found.extend(_run_entries(entry))
                continue
            found.append((entry, detect_format(entry)))
        except InputError as exc:
            passed.append(f"skipped {entry}: {exc.problem}")
        except OSError as exc:
            passed.append(f"skipped {entry}: cannot read it ({exc.strerror})")
    return found, passed
