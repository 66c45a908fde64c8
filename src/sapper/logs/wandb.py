"""Weights & Biases run folders, read offline from the files ``wandb`` leaves on disk.

A run is ``wandb/run-YYYYMMDD_HHMMSS-<id>/`` (``offline-run-...`` in offline mode). Its
``run-<id>.wandb`` is the record log the SDK writes: LevelDB's log format
(:mod:`sapper.logs.wandb_records` cuts it into records), every record a protobuf
``wandb.proto.wandb_internal_pb2.Record`` (the layout is wandb's
``wandb/sdk/internal/datastore.py``; the Go core of wandb 0.31 writes the same layout,
as the runs in tests/fixtures/logs/wandb show).
History records carry one ``wandb.log`` call each, the values as JSON under a ``key``
or a ``nested_key`` path; summary records the run's summary, where the W&B sink of the
monitor keeps its findings (``sapper/findings``). Runs from before the record log (and
synced copies) also have ``files/wandb-history.jsonl``, read as JSON lines without the
``wandb`` package; ``files/wandb-summary.json``, ``files/config.yaml`` and
``files/wandb-metadata.json`` add the summary, the config and the host.

Metric names map through :mod:`sapper.logs.fields` as a table's columns do (the row
logic is :class:`~sapper.logs.table.TableParser`'s), so ``train/loss``, ``train/grad_norm``
and ``train/learning_rate`` from the HF Trainer's ``WandbCallback``, or ``loss`` and
``lr`` from a hand-written loop, become record fields; the step is ``train/global_step``
when logged, else ``_step`` (one per ``wandb.log`` call). Damage is bounded: a chunk
whose checksum fails skips to the next block (LevelDB's own recovery), a record that
protobuf cannot parse is counted, a torn last record waits for the next
:meth:`WandbParser.poll` and is noted at the end; each becomes one note, never a
traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sapper.errors import InputError, clip
from sapper.logs.base import LineBuffer, gc_paused
from sapper.logs.fields import LAYER_KEYS, FieldMap, normalize_name
from sapper.logs.formats import LogFormat
from sapper.logs.limits import (
    MAX_LINE_CHARS,
    MAX_LOG_BYTES,
    MAX_STATE_BYTES,
    json_int,
    nested_too_deep,
    open_log,
    read_json_document,
    too_big,
)
from sapper.logs.table import TableParser
from sapper.logs.wandb_records import HEADER, MAX_RECORD_BYTES, RecordScanner
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord
from sapper.runtime.trackers import WANDB_FINDINGS_KEY

__all__ = [
    "FINDINGS_KEY",
    "FORMAT",
    "HEADER",
    "RecordScanner",
    "WandbParser",

    "run_files",
    "runs_in",
]

#: The summary key the monitor's W&B sink writes its findings under.
FINDINGS_KEY = WANDB_FINDINGS_KEY
#: Longest ``value_json`` read as a number: a float's JSON is under 30 characters; longer
#: values are lists and media (histograms, tables), which are no step-record field.
_MAX_NUMBER_JSON = 64
#: Run config and summary entries kept in ``LogData.meta``.
_MAX_META_KEYS = 2000
_MAX_META_VALUE = 64 << 10
_READ = 8 << 20
_RUN_DIR = re.compile(r"^(?:offline-)?run-\d{8}_\d{6}-(?P<id>[A-Za-z0-9]+)$")
#: Columns the SDK adds to every row that say nothing about training.
_SKIP_KEYS = ("_runtime", "_wandb")


def _record_class(source: str) -> Any:
    """wandb's ``Record`` protobuf class, or one InputError naming the extra."""
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError:
        raise InputError(
            "reading a .wandb record file needs the wandb package",
            file=source,
            expected="pip install 'sapper[wandb]' (or a run with files/wandb-history.jsonl)",
        ) from None
    return wandb_internal_pb2.Record


def run_files(path: Path) -> tuple[Path, Path | None, Path | None]:
    """``(run folder, record file, history jsonl)`` of a run folder or of one of its
    files (``run-<id>.wandb`` or ``files/wandb-history.jsonl`` given directly)."""
    if path.is_dir():
        run = path
    elif path.suffix == ".wandb":
        run = path.parent
    elif path.name == "wandb-history.jsonl":
        run = path.parent.parent if path.parent.name == "files" else path.parent
    else:
        run = path.parent
    records = None
    if path.is_file() and path.suffix == ".wandb":
        records = path
    elif run.is_dir():
        found = sorted(p for p in run.glob("*.wandb") if p.is_file())
        if found:
            records = found[-1]
    history = None
    if path.is_file() and path.name == "wandb-history.jsonl":
        history = path
    else:
        for candidate in (run / "files" / "wandb-history.jsonl", run / "wandb-history.jsonl"):
            if candidate.is_file():
                history = candidate
                break
    return run, records, history


def _wandb_importable() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("wandb") is not None
    except (ImportError, ValueError):
        return False


class WandbParser(TableParser):
    """Incremental reader of one W&B run folder: :meth:`poll` returns the steps completed
    by what the SDK appended since the last call."""

    format = "wandb"

    def __init__(self, path: str | Path, mapping: dict[str, FieldMap] | None = None) -> None:
        self.path = Path(path)
        self.run, self.records_file, self.history_file = run_files(self.path)
        super().__init__("jsonl", mapping, source=str(self.path))
        self.format = "wandb"
        if self.records_file is not None and (
            self.history_file is None or _wandb_importable()
        ):
            self.source = str(self.records_file)
            self._mode = "records"
        elif self.history_file is not None:
            self.source = str(self.history_file)
            self._mode = "history"
        else:
            raise InputError(
                "no W&B run here",
                file=str(self.path),
                expected="a wandb/run-*/ folder with run-<id>.wandb or files/wandb-history.jsonl",
            )
        self._scanner = RecordScanner()
        self._lines = LineBuffer()
        self._offset = 0
        self._record_cls: Any = None
        self._undecodable = 0
        self._summary: dict[str, Any] = {}
        #: The summary as the records left it, key -> value JSON: every step rewrites it,
        #: so it is parsed once, at the end.
        self._summary_json: dict[str, str] = {}
        self._findings_json: str | None = None
        self._alerts: list[dict[str, str]] = []
        self._side_files_read = False
        self.meta["wandb"] = {"run_dir": str(self.run)}
        match = _RUN_DIR.match(self.run.name)
        if match:
            self.meta["wandb"]["run_id"] = match["id"]

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        """W&B runs are read from their folder: use :meth:`poll`."""
        raise TypeError("W&B run folders are read with poll(), not feed()")

    def poll(self) -> list[StepRecord]:
        """Read what was appended since the last call; return the steps now complete."""
        target = self.records_file if self._mode == "records" else self.history_file
        assert target is not None
        if self._mode == "records" and self._record_cls is None:
            self._record_cls = _record_class(self.source)
        try:
            with gc_paused(), open_log(target) as fh:
                fh.seek(self._offset)
                while chunk := fh.read(_READ):
                    self._offset += len(chunk)
                    if self._offset > MAX_LOG_BYTES:
                        raise too_big(str(target), MAX_LOG_BYTES)
                    if self._mode == "records":
                        self._take_records(self._scanner.push(chunk))
                    else:
                        text = chunk.decode("utf-8", errors="replace")
                        super()._feed_jsonl(self._lines.push(text))
        except OSError as exc:
            raise InputError(f"cannot read it ({exc.strerror})", file=str(target)) from None
        if self._mode == "records" and self._scanner.header is False:
            if self._scanner.version is not None:
                raise InputError(
                    f"a W&B record file of format version {self._scanner.version}; sapper "
                    "reads version 0 (what wandb up to 0.31 writes)",
                    file=str(target),
                    expected="run-<id>.wandb of format version 0",
                )
            raise InputError(
                "not a W&B record file (its first bytes are not the :W&B header)",
                file=str(target),
                expected="run-<id>.wandb written by the wandb SDK",
            )
        return self.merger.ready()

    def finish(self) -> list[StepRecord]:
        out = self.poll()
        if self._mode == "history":
            super()._feed_jsonl(self._lines.rest())
            note = self._lines.note()
            if note:
                self.notes.append(note)
        else:
            self._note_damage()
        for key, text in self._summary_json.items():
            self._keep(self._summary, key, text, scalars=True)
        self._summary_json.clear()
        self._read_side_files()
        self._take_findings()
        if self._alerts:
            self.meta["wandb"]["alerts"] = self._alerts[:200]
        if self._summary:
            self.meta["summary"] = dict(self._summary)
        return out + super().finish()

    def _put(self, row: dict[str, Any]) -> None:
        """One history row, without the SDK's own bookkeeping columns (and without
        ``_step`` when a logged step such as ``train/global_step`` is the step)."""
        own_step = self.columns.step_column not in (None, "_step")
        if own_step or any(k.startswith(_SKIP_KEYS) for k in row):
            row = {
                k: v
                for k, v in row.items()
                if not k.startswith(_SKIP_KEYS) and not (own_step and k == "_step")
            }
        super()._put(row)

    # ---- the record log -----------------------------------------------------------
    def _take_records(self, payloads: list[bytes]) -> None:
        cls = self._record_cls
        for payload in payloads:
            record = cls()
            try:
                record.ParseFromString(payload)
            except Exception:  # protobuf's DecodeError and friends
                self._undecodable += 1
                continue
            kind = record.WhichOneof("record_type")
            if kind == "history":
                self._history(record.history.item)
            elif kind == "summary":
                self._summary_update(record.summary)
            elif kind == "run":
                self._run(record.run)
            elif kind == "config":
                self._config(record.config.update)
            elif kind == "alert":
                self._alerts.append(
                    {
                        "title": clip(record.alert.title),
                        "text": clip(record.alert.text, 2000),
                        "level": record.alert.level,
                    }
                )
            elif kind == "exit":
                self.meta["wandb"]["exit_code"] = record.exit.exit_code

    def _history(self, items: Any) -> None:
        row: dict[str, Any] = {}
        for item in items:
            key = _item_key(item)
            if not key or key.startswith(_SKIP_KEYS):
                continue
            text = item.value_json
            if len(text) > _MAX_NUMBER_JSON:
                if normalize_name(key) not in LAYER_KEYS or len(text) > MAX_LINE_CHARS:
                    continue
            value = _json_value(text)
            if value is not _BAD:
                row[key] = value
        if not row:
            return
        new = [k for k in row if k not in self.columns.targets]
        if new:
            self.columns.resolve(new)
        self._put(row)

    def _summary_update(self, summary: Any) -> None:
        for item in summary.update:
            key = _item_key(item)
            if key == FINDINGS_KEY:
                if len(item.value_json) <= MAX_STATE_BYTES:
                    self._findings_json = item.value_json
                continue
            text = item.value_json
            if len(text) <= _MAX_META_VALUE and not key.startswith(_SKIP_KEYS):
                if key in self._summary_json or len(self._summary_json) < _MAX_META_KEYS:
                    self._summary_json[key] = text
        for item in summary.remove:
            self._summary_json.pop(_item_key(item), None)

    def _run(self, run: Any) -> None:
        info = self.meta["wandb"]
        for name in ("run_id", "project", "entity", "display_name", "group", "job_type"):
            value = getattr(run, name, "")
            if value:
                info[name] = clip(value)
        if run.tags:
            info["tags"] = [clip(t) for t in list(run.tags)[:200]]
        version = run.telemetry.cli_version if run.HasField("telemetry") else ""
        if version:
            info["cli_version"] = version
        self._config(run.config.update)

    def _config(self, updates: Any) -> None:
        config = self.meta.setdefault("config", {})
        for item in updates:
            key = _item_key(item)
            if key and not key.startswith("_wandb"):
                self._keep(config, key, item.value_json)

    @staticmethod
    def _keep(into: dict[str, Any], key: str, text: str, *, scalars: bool = False) -> None:
        """One config or summary entry into ``meta``, bounded; the summary keeps only
        numbers and short text (its media entries are hundreds of values each)."""
        if not key or key.startswith(_SKIP_KEYS) or len(text) > _MAX_META_VALUE:
            return
        if key not in into and len(into) >= _MAX_META_KEYS:
            return
        value = _json_value(text)
        if value is _BAD or (scalars and not isinstance(value, (int, float, str, bool))):
            return
        into[key] = clip(value) if isinstance(value, str) and scalars else value

    def _note_damage(self) -> None:
        scan = self._scanner
        if scan.bad_chunks:
            self.notes.append(
                f"{scan.bad_chunks} damaged chunk(s) in {self.source} (checksum or length "
                f"wrong); {scan.skipped_bytes:,} bytes skipped to the next 32 KiB block"
            )
        if scan.broken_chains:
            self.notes.append(f"{scan.broken_chains} record(s) split over blocks lost a part")
        if scan.oversized:
            self.notes.append(
                f"{scan.oversized} record(s) over {MAX_RECORD_BYTES >> 20} MiB were skipped"
            )
        if self._undecodable:
            self.notes.append(f"{self._undecodable} record(s) were not W&B records and skipped")
        if scan.pending:
            self.notes.append(
                f"the last {scan.pending:,} bytes are an incomplete record (the run was "
                "still writing, or stopped mid-write)"
            )

    # ---- the files/ folder --------------------------------------------------------
    def _read_side_files(self) -> None:
        """Summary, config and host from ``files/``; each is optional, and a damaged one
        is a note (the metrics do not depend on it)."""
        if self._side_files_read:
            return
        self._side_files_read = True
        from sapper.plan.sources import read_yaml_file

        files = self.run / "files"
        summary_path = files / "wandb-summary.json"
        if summary_path.is_file():
            try:
                doc = read_json_document(summary_path)
            except InputError as exc:
                self.notes.append(f"wandb-summary.json skipped: {exc}")
                doc = None
            if isinstance(doc, dict):
                if self._findings_json is None and isinstance(doc.get(FINDINGS_KEY), list):
                    self._findings_json = json.dumps(doc[FINDINGS_KEY])
                for key, value in list(doc.items())[:_MAX_META_KEYS]:
                    if isinstance(key, str) and not key.startswith(_SKIP_KEYS):
                        self._summary.setdefault(key, value)
        config_path = files / "config.yaml"
        if config_path.is_file() and "config" not in self.meta:
            try:
                doc = read_yaml_file(config_path)
            except InputError as exc:
                self.notes.append(f"config.yaml skipped: {exc}")
                doc = None
            if isinstance(doc, dict):
                # wandb writes ``key: {desc: ..., value: ...}`` per config entry
                self.meta["config"] = {
                    str(k): v.get("value") if isinstance(v, dict) and "value" in v else v
                    for k, v in list(doc.items())[:_MAX_META_KEYS]
                    if not str(k).startswith("_wandb") and k != "wandb_version"
                }
        meta_path = files / "wandb-metadata.json"
        if meta_path.is_file():
            try:
                doc = read_json_document(meta_path)
            except InputError as exc:
                self.notes.append(f"wandb-metadata.json skipped: {exc}")
                doc = None
            if isinstance(doc, dict):
                host = {
                    k: doc[k]
                    for k in ("host", "program", "gpu", "gpu_count", "cpu_count", "python")
                    if isinstance(doc.get(k), (str, int))
                }
                self.meta["wandb"].update(host)

    def _take_findings(self) -> None:
        """The findings the monitor's W&B sink left in the summary."""
        if self._findings_json is None:
            return
        value = _json_value(self._findings_json)
        if not isinstance(value, list):
            self.notes.append(f"summary {FINDINGS_KEY!r} is not a list of findings; skipped")
            return
        bad = 0
        for entry in value:
            try:
                self.findings.append(Finding.model_validate(entry))
            except Exception:  # pydantic's ValidationError, or worse
                bad += 1
        if bad:
            self.notes.append(f"{bad} entr(y/ies) of summary {FINDINGS_KEY!r} were no findings")


_BAD = object()


def _item_key(item: Any) -> str:
    """A history or summary item's name: ``key``, or its ``nested_key`` path joined with
    ``/`` (a ``wandb.log({"train": {"loss": x}})`` is ``train/loss``, as a table's nested
    objects are)."""
    key = item.key
    if key:
        return key
    nested = item.nested_key
    return nested[0] if len(nested) == 1 else "/".join(nested)


def _json_value(text: str) -> Any:
    """A ``value_json`` decoded; a number (nearly every history value) by ``float``
    first, which reads JSON's numbers and wandb's ``NaN`` / ``Infinity`` at a third of
    json's cost."""
    if len(text) <= _MAX_NUMBER_JSON:
        if text.isdigit() and text.isascii() and len(text) <= 18:
            return int(text)
        try:
            return float(text)
        except ValueError:
            pass
    try:
        if nested_too_deep(text):
            return _BAD
        return json.loads(text, parse_int=json_int)
    except (ValueError, RecursionError):
        return _BAD


# ---- recognising a run ---------------------------------------------------------------
def _recognise_bytes(head: bytes, path: Path) -> float:
    return 1.0 if head.startswith(HEADER) else 0.0


def _recognise_text(text: str, path: Path) -> float:
    """A run's ``files/wandb-history.jsonl`` given by itself: read as the run (its
    summary and config come along), above the plain JSON-lines table."""
    if path.name != "wandb-history.jsonl" or not text.lstrip().startswith("{"):
        return 0.0
    return 0.9 if '"_step"' in text[:100_000] else 0.6


def _recognise_dir(path: Path) -> float:
    try:
        if any(p.suffix == ".wandb" and p.is_file() for p in path.iterdir()):
            return 1.0
        if (path / "files" / "wandb-history.jsonl").is_file():
            return 0.95
    except OSError:
        return 0.0
    return 0.5 if _RUN_DIR.match(path.name) and (path / "files").is_dir() else 0.0


def _is_run(path: Path) -> bool:
    return _recognise_dir(path) >= 0.9


def runs_in(folder: str | Path) -> list[Path]:
    """The W&B runs under a folder, one entry each, oldest first: the folder itself when
    it is a run; the ``run-*`` / ``offline-run-*`` folders of a ``wandb/`` folder (its
    ``latest-run`` link is not a second run); the ``wandb/`` folder of a project."""
    root = Path(folder)
    if not root.is_dir():
        return []
    if _is_run(root):
        return [root]
    for base in (root, root / "wandb"):
        if not base.is_dir():
            continue
        try:
            entries = sorted(base.iterdir(), key=lambda p: _run_sort_key(p.name))
        except OSError:
            return []
        runs = [p for p in entries if not p.is_symlink() and p.is_dir() and _is_run(p)]
        if runs:
            return runs
    return []


def _run_sort_key(name: str) -> tuple[str, str]:
    """Runs sort by their start time (``run-20240101_120000-id``), online or offline."""
    return (name.removeprefix("offline-"), name)


def _parser(path: Path, mapping: dict[str, FieldMap] | None) -> WandbParser:
    return WandbParser(path, mapping)


#: The ``wandb`` log format (see :class:`sapper.logs.formats.LogFormat`).
FORMAT = LogFormat(
    name="wandb",
    title="a Weights & Biases run folder",
    looks_for="a wandb/run-*/ folder with run-<id>.wandb (or files/wandb-history.jsonl)",
    parser=_parser,
    read_mode="poll",
    recognise_text=_recognise_text,
    recognise_bytes=_recognise_bytes,
    recognise_dir=_recognise_dir,
    runs_in=runs_in,
)
