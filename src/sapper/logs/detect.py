"""Which reader a path needs, from its content first and its name second.

Users point sapper at whatever they have: a ``trainer_state.json``, a checkpoint or
output folder, a TensorBoard run folder (or its parent with one folder per run), a W&B
CSV, a Megatron ``train.log``, a sapper run log. Names lie (``log.txt`` is any of them),
so the first bytes decide: a TFRecord header whose checksum holds is an event file,
``{"kind": ...}`` lines are a sapper run log, other JSON lines a metrics table, a JSON
document with ``log_history`` a Trainer state, Megatron's iteration line a Megatron log,
and a delimited header a CSV. Anything else is refused with one line saying what was
found and what is read.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from sapper.errors import InputError
from sapper.logs.megatron import ITERATION_LINE

__all__ = [
    "FORMATS",
    "SUPPORTED",
    "decode_head",
    "detect_format",
    "detect_text",
    "expand_paths",
]

#: Format names accepted by ``--log-format`` and returned by :func:`detect_format`.
FORMATS: tuple[str, ...] = (
    "sapper", "trainer_state", "tensorboard", "csv", "jsonl", "megatron", "wandb", "mlflow"
)
SUPPORTED = (
    "a sapper run log (JSONL), a Hugging Face trainer_state.json, a TensorBoard event file "
    "or run folder, a CSV/JSON-lines metrics table (e.g. a W&B export) or a Megatron-LM log"
)
_HEAD = 1 << 20  # Megatron prints hundreds of argument lines before the first iteration
_EVENTS = "tfevents"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")


def _is_event_file(head: bytes) -> bool:
    """A TFRecord starts with a little-endian u64 length and its masked CRC32C."""
    if len(head) < 12:
        return False
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    return masked_crc32c(head[:8]) == struct.unpack("<I", head[8:12])[0]


_CONTROL = "".join(chr(c) for c in range(32) if c not in (9, 10, 13))
_NO_CONTROL = str.maketrans("", "", _CONTROL)


def decode_head(head: bytes, path: str | Path) -> str:
    """Text, unless the bytes are mostly not text. A crashed node can leave NUL blocks
    or a torn UTF-8 character in a real log; those do not make it binary: NULs are
    skipped (as the readers skip them), and of the rest at most a tenth may be other
    control characters or undecodable bytes. A byte-order mark picks the encoding."""
    from sapper.logs.limits import sniff_encoding

    text = head.decode(sniff_encoding(head), errors="replace").lstrip("\ufeff")
    if "\x00" in text:
        text = text.replace("\x00", "")
        if not text.strip():
            raise InputError("the file holds only NUL bytes", file=str(path), expected=SUPPORTED)
    odd = len(text) - len(text.translate(_NO_CONTROL)) + text.count("\ufffd")
    if odd > 0.1 * len(text):
        raise _binary(path)
    return text


def _binary(path: Path) -> InputError:
    return InputError("binary data, not a training log", file=str(path), expected=SUPPORTED)


def detect_format(path: str | Path) -> str:
    """The format of one file or folder (see :data:`FORMATS`); :class:`InputError` if none.
    Only regular files are opened (a FIFO or a device is refused at once)."""
    from sapper.logs.limits import open_log

    path = Path(path)
    if path.is_dir():
        return _detect_dir(path)
    try:
        with open_log(path, limit=None) as fh:  # only the head is read
            head = fh.read(_HEAD)
    except OSError as exc:
        raise InputError(f"cannot read it ({exc.strerror})", file=str(path)) from None
    if not head.strip():
        raise InputError("the file is empty", file=str(path), expected=SUPPORTED)
    from sapper.logs.wandb import HEADER as WANDB_HEADER

    if head.startswith(WANDB_HEADER):  # until the registry asks LogFormat.recognise_bytes
        return "wandb"
    if _is_event_file(head):
        return "tensorboard"
    if _EVENTS in path.name:
        raise InputError(
            "named like a TensorBoard event file but its first record is damaged",
            file=str(path),
            expected="an events.out.tfevents.* file written by a SummaryWriter",
        )
    return _detect_text(decode_head(head, path), path)


def detect_text(text: str, name: str | Path = "<stdin>") -> str:
    """The format of a log from its first complete lines, for input that is not a file
    yet to open (a pipe, a file still being written); ``name`` only lends its suffix."""
    text = text.lstrip("\ufeff")
    if not text.strip():
        raise InputError("no complete line yet", file=str(name), expected=SUPPORTED)
    return _detect_text(text, Path(name))


def _detect_text(text: str, path: Path) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0].strip()
    if first.startswith("{"):
        from sapper.logs.limits import json_int, nested_too_deep

        try:
            obj = None if nested_too_deep(first) else json.loads(first, parse_int=json_int)
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            obj = None
        if isinstance(obj, dict):
            if isinstance(obj.get("log_history"), list):
                return "trainer_state"  # written on one line (json.dump without indent)
            return "sapper" if obj.get("kind") in ("meta", "step", "finding") else "jsonl"
        if '"log_history"' in text:
            return "trainer_state"
        if path.suffix.lower() in (".jsonl", ".ndjson") and len(lines) > 1:
            return "jsonl"  # the first line is damaged; the table reader skips it with a note
        raise InputError(
            "JSON, but neither a trainer_state.json (no log_history) nor JSON lines",
            file=str(path),
            expected=SUPPORTED,
        )
    if _looks_delimited(lines):
        return "csv"  # a table first: rows appended from another log are noted as bad
    if any(ITERATION_LINE.search(line) for line in lines):
        return "megatron"
    if path.suffix.lower() in (".csv", ".tsv") and len(lines) >= 1 and "," in first:
        return "csv"
    raise InputError(
        f"not a log sapper can read (first line: {first[:60]!r})",
        file=str(path),
        expected=SUPPORTED,
    )


def _looks_delimited(lines: list[str]) -> bool:
    for sep in (",", "\t"):
        width = lines[0].count(sep)
        if width == 0:
            continue
        rows = lines[1:50]
        if rows and sum(r.count(sep) == width for r in rows) >= max(1, len(rows) // 2):
            return True
    return False


def _detect_dir(path: Path) -> str:
    if (path / "trainer_state.json").is_file():
        return "trainer_state"
    if any(_EVENTS in p.name for p in path.iterdir() if p.is_file()):
        return "tensorboard"
    from sapper.logs import mlflow, wandb

    for fmt in (wandb.FORMAT, mlflow.FORMAT):  # until the registry asks recognise_dir
        if fmt.recognise_dir is not None and fmt.recognise_dir(path) >= 0.9:
            return fmt.name
    raise InputError(
        "no log found in this folder",
        file=str(path),
        expected="a folder with trainer_state.json, events.out.tfevents.* files, "
        "checkpoint-N folders or TensorBoard run folders",
    )


def expand_paths(paths: list[str | Path]) -> list[tuple[Path, str | None]]:
    """Paths to read, one per run: a HF output folder becomes its latest checkpoint's
    ``trainer_state.json``; a folder of TensorBoard runs becomes one entry per run; any
    other folder becomes the logs in it."""
    out: list[tuple[Path, str | None]] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            out.append((path, None))
            continue
        if (path / "trainer_state.json").is_file():
            out.append((path / "trainer_state.json", "trainer_state"))
            continue
        checkpoints = sorted(
            (int(m.group(1)), p)
            for p in path.iterdir()
            if p.is_dir() and (m := _CHECKPOINT.search(p.name))
            and (p / "trainer_state.json").is_file()
        )
        if checkpoints:
            out.append((checkpoints[-1][1] / "trainer_state.json", "trainer_state"))
            continue
        runs = sorted({p.parent for p in path.rglob(f"*{_EVENTS}*") if p.is_file()})
        if runs:
            out.extend((run, "tensorboard") for run in runs)
            continue
        from sapper.logs import mlflow, wandb

        polled = [(run, "wandb") for run in wandb.runs_in(path)] or [
            (run, "mlflow") for run in mlflow.runs_in(path)
        ]  # until the registry lists runs through LogFormat.runs_in
        if polled:
            out.extend(polled)
            continue
        logs = _logs_in(path)
        if logs:
            out.extend(logs)
            continue
        _detect_dir(path)  # raises with the message
    return out


def _logs_in(folder: Path) -> list[tuple[Path, str | None]]:
    """A plain folder of logs: every file in it that is a log (others, such as scripts
    and READMEs, are passed over), and sub-folders holding a trainer_state.json."""
    found: list[tuple[Path, str | None]] = []
    for entry in sorted(folder.iterdir()):
        if entry.is_dir():
            if (entry / "trainer_state.json").is_file():
                found.append((entry / "trainer_state.json", "trainer_state"))
            continue
        try:
            found.append((entry, detect_format(entry)))
        except InputError:
            continue
    return found
