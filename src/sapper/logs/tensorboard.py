"""TensorBoard event files, read with the tensorboard package's ``EventAccumulator``.

One run is a folder of ``events.out.tfevents.*`` files (or one such file). Scalars
written by ``torch.utils.tensorboard.SummaryWriter`` (``simple_value``) and by TF2-style
writers (``scalars``-plugin tensors) are both read. Tags map to record fields through
:mod:`sapper.logs.fields` (``train/loss``, ``lm loss``, ``grad-norm``, ``learning-rate``,
``loss-scale``, ``mem-allocated-bytes`` ...); Megatron's ``... vs samples`` duplicates
are skipped; any other scalar goes to ``StepRecord.extra``. The accumulator keeps every
scalar (no reservoir sampling) and drops the orphaned tail of a run restarted from a
checkpoint, as TensorBoard itself shows it. :meth:`TensorBoardParser.poll` reads what was
appended since the last call, so ``sapper watch`` can follow a live run.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from sapper.errors import InputError
from sapper.logs.base import DICT_EXTRAS, LogParser, coerce, put_mapped
from sapper.logs.fields import FieldMap
from sapper.logs.formats import LogFormat
from sapper.runtime.records import StepRecord

__all__ = ["EVENTS_MARK", "FORMAT", "TensorBoardParser", "is_event_file", "masked_crc32c"]


class TensorBoardParser(LogParser):
    """Incremental reader of one TensorBoard run (a folder or a single event file)."""

    format = "tensorboard"
    ordered = False

    def __init__(self, path: str | Path, mapping: dict[str, FieldMap] | None = None) -> None:
        super().__init__(str(path), mapping)
        self._seen: dict[str, int] = {}
        self._targets: dict[str, FieldMap | None] = {}
        self._taken: dict[str, str] = {}
        self._plugins: dict[str, str] = {}  # tag -> plugin, from its first event's metadata

    @functools.cached_property
    def _acc(self) -> Any:
        """Built on first use: its import takes a good part of a second, which a reader
        fed through :meth:`feed_events` never needs."""
        from tensorboard.backend.event_processing import event_accumulator as ea

        return ea.EventAccumulator(
            self.source,
            size_guidance={
                ea.SCALARS: 0,
                ea.TENSORS: 0,
                ea.IMAGES: 1,
                ea.AUDIO: 1,
                ea.HISTOGRAMS: 1,
                ea.COMPRESSED_HISTOGRAMS: 1,
            },
            purge_orphaned_data=True,
        )

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        """Event files are binary: use :meth:`poll`."""
        raise TypeError("TensorBoard event files are read with poll(), not feed()")

    def poll(self) -> list[StepRecord]:
        """Read events appended since the last call; return the steps now complete."""
        self._acc.Reload()
        tags = self._acc.Tags()
        # Of two tags meaning one field, the longer series wins (HF writes the run's
        # average as ``train/train_loss`` once, next to the ``train/loss`` curve).
        scalars = sorted(tags.get("scalars", []), key=lambda t: -len(self._acc.Scalars(t)))
        for tag in scalars:
            self._take(tag, [(e.step, e.value, e.wall_time) for e in self._new(tag, False)])
        for tag in tags.get("tensors", []):
            if self._plugin(tag) == "scalars":
                events = self._new(tag, True)
                self._take(tag, [(e.step, _scalar(e.tensor_proto), e.wall_time) for e in events])
        return self.merger.ready()

    def feed_events(self, events: Iterable[Any]) -> list[StepRecord]:
        """Decoded ``Event`` protos in file order, for a reader that follows the event files
        itself (``sapper watch`` keeps an offset per file instead of re-listing every
        scalar on each :meth:`poll`); returns the steps now complete."""
        # what _take does for one event, inlined: a watched run's every scalar comes here
        plugins, targets, put = self._plugins, self._targets, self.merger.put
        for event in events:
            for value in event.summary.value:
                tag = value.tag
                if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
                    plugins[tag] = value.metadata.plugin_data.plugin_name
                kind = value.WhichOneof("value")
                if kind == "simple_value":
                    number: float | None = value.simple_value
                elif kind == "tensor" and plugins.get(tag) == "scalars":
                    number = _scalar(value.tensor)
                else:
                    continue
                if tag.endswith(" vs samples"):
                    continue
                target = targets[tag] if tag in targets else self._target(tag)
                if number is None:
                    continue
                if target is None:
                    put(event.step, {"time": event.wall_time}, {tag: number})
                elif target.field in _PLAIN_FIELDS:  # put_mapped's common case, inlined
                    field = target.field
                    put(event.step, {"time": event.wall_time,
                                     field: coerce(field, number * target.factor)})
                else:
                    values: dict[str, Any] = {"time": event.wall_time}
                    extra: dict[str, Any] = {}
                    put_mapped(target, number, values, extra)
                    put(event.step, values, extra)
        return self.merger.ready()

    def finish(self) -> list[StepRecord]:
        return self.poll() + super().finish()

    def _plugin(self, tag: str) -> str:
        try:
            return self._acc.SummaryMetadata(tag).plugin_data.plugin_name
        except (KeyError, AttributeError):
            return ""

    def _new(self, tag: str, tensors: bool) -> list[Any]:
        events = self._acc.Tensors(tag) if tensors else self._acc.Scalars(tag)
        seen = self._seen.get(tag, 0)
        if len(events) < seen:  # purged after a restart: the tail was rewritten
            seen = 0
            self.notes.append(f"tag {tag!r}: the run restarted and rewrote earlier steps")
        self._seen[tag] = len(events)
        return events[seen:]

    def _target(self, tag: str) -> FieldMap | None:
        if tag not in self._targets:
            fm = self.series_target(tag, "tags", self._taken)
            self._targets[tag] = fm
        return self._targets[tag]

    def _take(self, tag: str, events: list[tuple[int, float | None, float]]) -> None:
        if not events or tag.endswith(" vs samples"):
            return
        target = self._target(tag)
        put = self.merger.put
        for step, value, wall in events:
            if value is None:
                continue
            if target is None:
                put(step, {"time": wall}, {tag: value})
            else:
                values: dict[str, Any] = {"time": wall}
                extra: dict[str, Any] = {}
                put_mapped(target, value, values, extra)
                put(step, values, extra)


#: Record fields a tag's value goes to as it is (not a dict entry, not ignored).
_PLAIN_FIELDS = frozenset(
    f.name for f in dataclass_fields(StepRecord) if f.name not in ("step", "extra")
) - DICT_EXTRAS


def _scalar(proto: Any) -> float | None:
    from tensorboard.util import tensor_util

    try:
        array = tensor_util.make_ndarray(proto)
    except (ValueError, TypeError):
        return None
    if array.size != 1:
        return None
    return float(array.reshape(()))


#: What every event file's name holds (``events.out.tfevents.<time>.<host>``).
EVENTS_MARK = "tfevents"


@functools.cache
def _crc32c_table() -> tuple[int, ...]:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) by byte."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data``. Computed here, not with tensorboard's
    helper: every log's format is probed with it, and importing tensorboard for that
    costs most of a second on a command that reads a JSON or text log."""
    table = _crc32c_table()
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def is_event_file(head: bytes) -> bool:
    """A TFRecord starts with a little-endian u64 length and its masked CRC32C."""
    if len(head) < 12:
        return False
    return masked_crc32c(head[:8]) == struct.unpack("<I", head[8:12])[0]


def _recognise_bytes(head: bytes, path: Path) -> float:
    if is_event_file(head):
        return 1.0
    if EVENTS_MARK in path.name:
        raise InputError(
            "named like a TensorBoard event file but its first record is damaged",
            file=str(path),
            expected="an events.out.tfevents.* file written by a SummaryWriter",
        )
    return 0.0


def _events_in(folder: Path) -> bool:
    try:
        return any(EVENTS_MARK in p.name and p.is_file() for p in folder.iterdir())
    except OSError:
        return False


def _recognise_dir(folder: Path) -> float:
    return 1.0 if _events_in(folder) else 0.0


def _runs_in(folder: Path) -> list[Path]:
    """Every folder under ``folder`` (itself included) holding event files: a log dir
    with one folder per run (``runs/<date_host>``) is one entry per run."""
    try:
        return sorted({p.parent for p in folder.rglob(f"*{EVENTS_MARK}*") if p.is_file()})
    except OSError:
        return []


FORMAT = LogFormat(
    name="tensorboard",
    title="a TensorBoard event file or run folder",
    looks_for="events.out.tfevents.* files whose first record's checksum holds",
    parser=lambda path, mapping: TensorBoardParser(path, mapping),
    read_mode="poll",
    recognise_bytes=_recognise_bytes,
    recognise_dir=_recognise_dir,
    runs_in=_runs_in,
)
