"""sapper's own run log: same contents as the monitor's reader, tolerant of damage."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sapper.logs import RunLogParser, read_log
from sapper.runtime.detectors.loss import LOSS_SPIKE
from sapper.runtime.records import StepRecord
from sapper.runtime.runlog import RunLogWriter, read_runlog


def _write(path: Path) -> None:
    with RunLogWriter(path, meta={"run": "tiny-gpt"}) as writer:
        for step in range(1, 51):
            writer.write_step(
                StepRecord(
                    step=step,
                    loss=math.nan if step == 40 else 3.0 - step / 100,
                    grad_norm=math.inf if step == 41 else 0.7,
                    lr=1e-3,
                    lrs=[1e-3, 1e-4],
                    extra={"sample_hash": f"{step:08x}"},
                )
            )
        writer.write_finding(LOSS_SPIKE.finding("loss 9 at step 30", step=30, value=9.0))


def test_same_contents_as_the_monitors_reader(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _write(path)
    ours = read_log(path)
    theirs = read_runlog(path)
    assert ours.format == "sapper"
    assert [r.to_json() for r in ours.records] == [r.to_json() for r in theirs.steps]
    assert ours.findings == theirs.findings
    assert ours.meta["run"] == "tiny-gpt"
    assert math.isnan(ours.records[39].loss) and ours.records[40].grad_norm == math.inf


def test_torn_last_line_is_a_note(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _write(path)
    with path.open("a") as fh:
        fh.write('{"kind": "step", "step": 51, "loss": 2.4')
    log = read_log(path)
    assert log.records[-1].step == 50
    assert log.notes == ["skipped a torn last line (the run was still writing or crashed)"]


def test_damaged_lines_give_partial_results(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _write(path)
    lines = path.read_text().splitlines()
    lines[10] = "\x00\x00garbage"
    lines[20] = '{"kind": "step", "loss": 1.0}'  # no step
    lines[30] = '{"kind": "mystery"}'
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert len(log.records) == 47
    assert any("3 unreadable line(s): 11, 21, 31" in n for n in log.notes)


def test_incremental_feed_and_restart(tmp_path: Path) -> None:
    parser = RunLogParser()
    first = parser.feed(['{"kind":"meta","version":1}', '{"kind":"step","step":1,"loss":2.0}'])
    assert [r.step for r in first] == [1]
    again = parser.feed(['{"kind":"step","step":1,"loss":9.0}', '{"kind":"step","step":2}'])
    assert [(r.step, r.loss) for r in again] == [(1, 9.0), (2, None)]
    parser.finish()
    assert [(a.number, a.start, a.stop, a.first_step, a.last_step) for a in parser.attempts] == [
        (1, 0, 1, 1, 1), (2, 1, 3, 1, 2)
    ]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_nonfinite_strings_become_floats(value: str) -> None:
    parser = RunLogParser()
    (rec,) = parser.feed([f'{{"kind":"step","step":3,"loss":"{value}","lrs":["{value}",1]}}'])
    assert str(rec.loss) == value and str(rec.lrs[0]) == value
