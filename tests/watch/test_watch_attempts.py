"""A watched log that restarts from a checkpoint: the next attempt gets fresh detectors."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.detectors.loss import LOSS_SPIKE
from sapper.runtime.records import StepRecord
from sapper.watch import Watcher, open_follower


class _Counting(Detector):
    """Fires once per instance at its 15th record: a fresh instance fires again."""

    rules = (LOSS_SPIKE,)
    made: ClassVar[list[_Counting]] = []

    def __init__(self) -> None:
        type(self).made.append(self)
        self.steps: list[int] = []

    def update(self, record: StepRecord) -> list[Finding]:
        self.steps.append(record.step)
        if len(self.steps) != 15:
            return []
        return [LOSS_SPIKE.finding(f"15th record, step {record.step}", step=record.step)]


def _append(path: Any, rows: list[dict]) -> None:
    with open(path, "a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))


def test_a_restart_starts_a_new_attempt_with_fresh_detectors(tmp_path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text("")
    _Counting.made = []
    watcher = Watcher(open_follower(log), detectors=lambda plan: [_Counting()], poll=0.05,
                      idle_timeout=0, settle=0.0)
    _append(log, [{"step": s, "loss": 2.0} for s in range(1, 21)])
    watcher.tick()
    _append(log, [{"step": s, "loss": 2.0} for s in range(11, 31)])  # resumed from step 10
    watcher.tick()
    result = watcher.close()
    first, second = _Counting.made
    assert first.steps == list(range(1, 21)) and result.attempts == 2
    # the resumed attempt's detectors first see the history it resumes from (steps 1-10)
    assert second.steps == [*range(1, 11), *range(11, 31)]
    assert [(f.step, f.data.get("attempt")) for f in result.findings] == [(15, None), (15, 2)]
    assert any("the run restarted: step 11 follows step 20" in n for n in result.notes)
    assert result.records == 40 and result.to_json()["attempts"] == 2
