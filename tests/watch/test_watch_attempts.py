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


def _meg(step: int, loss: float) -> str:
    return (f" iteration {step:8d}/    1000 | lm loss: {loss:.6E} | loss scale: 1024.0 | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |\n")


def test_megatron_validation_after_a_quiet_spell_is_not_a_restart(tmp_path) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    watcher = Watcher(open_follower(log), poll=0.05, idle_timeout=0, settle=0.0)
    with open(log, "a") as fh:
        fh.write("".join(_meg(s, 2.0) for s in range(10, 101, 10)))
    watcher.tick()
    watcher.tick()  # quiet: step 100 is released
    with open(log, "a") as fh:  # the evaluation ends, then training goes on
        fh.write(" validation loss at iteration 100 | lm loss value: 2.1E+00 |\n")
        fh.write("".join(_meg(s, 1.9) for s in range(110, 151, 10)))
    watcher.tick()
    with open(log, "a") as fh:  # the job died and resumed from the checkpoint at 120
        fh.write("".join(_meg(s, 1.9) for s in range(130, 171, 10)))
    watcher.tick()
    result = watcher.close()
    assert result.attempts == 2
    assert [n for n in result.notes if "restarted" in n] == [
        "the run restarted: step 130 follows step 150; attempt 2 is watched with fresh "
        "detectors"
    ]
