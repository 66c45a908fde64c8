"""``TensorBoardParser.feed_events`` (what ``sapper watch`` hands a TensorBoard run's
decoded events to) reads each scalar as the parser's per-tag ``_take`` does: the same
records, extras and notes, tags meaning one field twice, unmapped tags, ``vs samples``
tags and non-finite values included."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sapper.logs import TensorBoardParser
from sapper.watch import EventsFollower
from sapper.watch.events import _CHECKED

TAGS = ("train/loss", "loss", "train/grad_norm", "train/learning_rate", "custom/thing",
        "train/loss vs samples", "eval/loss")


def _run(logdir: Path) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(logdir), flush_secs=3600)
    for step in range(1, 120):
        for i, tag in enumerate(TAGS):
            if (step + i) % 7 == 0:
                continue  # sparse tags
            value = 2.0 + step / 100 + i
            if step == 60 and tag == "train/loss":
                value = math.nan
            writer.add_scalar(tag, value, step, new_style=step % 2 == 0)
    writer.close()
    (path,) = [p for p in logdir.iterdir() if "tfevents" in p.name]
    return path


class _PerTag(TensorBoardParser):
    """Each scalar through ``_take``, one event at a time (the reference)."""

    def feed_events(self, events: Any) -> list[Any]:
        from sapper.logs.tensorboard import _scalar

        for event in events:
            for value in event.summary.value:
                if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
                    self._plugins[value.tag] = value.metadata.plugin_data.plugin_name
                kind = value.WhichOneof("value")
                if kind == "simple_value":
                    number = value.simple_value
                elif kind == "tensor" and self._plugins.get(value.tag) == "scalars":
                    number = _scalar(value.tensor)
                else:
                    continue
                self._take(value.tag, [(event.step, number, event.wall_time)])
        return self.merger.ready()


def _follow(path: Path, parser: type[TensorBoardParser]) -> tuple[list[str], list[str]]:
    fol = EventsFollower(path)
    fol._parser = parser(path)
    records = fol.poll() + fol.close()
    return [json.dumps(r.to_json(), sort_keys=True) for r in records], fol.notes


def test_feed_events_reads_as_take_does(tmp_path: Path) -> None:
    path = _run(tmp_path / "run")
    _CHECKED.clear()
    got, notes = _follow(path, TensorBoardParser)
    assert _CHECKED  # frame headers were checked through the cache
    expected, expected_notes = _follow(path, _PerTag)
    assert got == expected
    assert notes == expected_notes
    assert len(got) == 119 and any('"loss": "nan"' in r for r in got)
    assert any("custom/thing" in r for r in got)
