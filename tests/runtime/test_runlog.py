"""The JSONL run log: round trip, torn last line, errors, a writer that never raises."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sapper.errors import InputError
from sapper.rules.model import Finding, Severity
from sapper.runtime.records import StepRecord
from sapper.runtime.runlog import RunLogWriter, read_runlog


def _finding() -> Finding:
    return Finding(
        code="R001", severity=Severity.ERROR, check="loss", title="t", message="m", fix="f", step=3
    )


def test_round_trip_with_non_finite_values(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLogWriter(path, meta={"run": "tiny", "plan": {"name": "p"}}) as w:
        w.write_step(StepRecord(step=0, loss=2.5, grad_norm=math.inf, extra={"h": ["ab"]}))
        w.write_step(StepRecord(step=1, loss=math.nan, lr=1e-3))
        w.write_finding(_finding())
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["meta", "step", "step", "finding"]
    assert next(iter(lines[1])) == "kind"
    assert lines[2]["loss"] == "nan" and lines[1]["grad_norm"] == "inf"
    log = read_runlog(path)
    assert log.meta["run"] == "tiny" and log.meta["version"] == 1
    assert log.steps[0].grad_norm == math.inf and math.isnan(log.steps[1].loss)
    assert log.steps[0].extra == {"h": ["ab"]} and "kind" not in log.steps[1].extra
    assert log.findings[0].code == "R001" and log.findings[0].step == 3
    assert log.notes == []


def test_appending_adds_a_meta_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    for i in range(2):
        with RunLogWriter(path, meta={"session": i}) as w:
            w.write_step(StepRecord(step=i))
    log = read_runlog(path)
    assert [m["session"] for m in log.metas] == [0, 1]
    assert [s.step for s in log.steps] == [0, 1]


def test_torn_last_line_is_skipped_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLogWriter(path) as w:
        w.write_step(StepRecord(step=0, loss=1.0))
    with path.open("a") as f:
        f.write('{"kind": "step", "step": 1, "lo')
    log = read_runlog(path)
    assert [s.step for s in log.steps] == [0]
    assert log.notes and "torn last line" in log.notes[0]


def test_bad_middle_line_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"kind": "meta", "version": 1}\nnot json\n{"kind": "step", "step": 1}\n')
    with pytest.raises(InputError) as err:
        read_runlog(path)
    assert "line 2" in str(err.value) and str(path) in str(err.value)


def test_invalid_step_line_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"kind": "step", "loss": 1.0}\n')
    with pytest.raises(InputError, match="line 1"):
        read_runlog(path)
    with pytest.raises(InputError, match="run log not found"):
        read_runlog(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(InputError, match="no run-log lines"):
        read_runlog(tmp_path / "empty.jsonl")


def test_unknown_kinds_are_noted(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"kind": "meta", "version": 1}\n{"kind": "eval", "x": 1}\n')
    assert "unknown kind 'eval'" in read_runlog(path).notes[0]


def test_writer_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    w = RunLogWriter(blocker / "run.jsonl")  # parent is a file: cannot open
    assert w.error and "cannot open" in w.error
    w.write_step(StepRecord(step=0))
    w.write_finding(_finding())
    w.close()
    ok = RunLogWriter(tmp_path / "ok.jsonl")
    ok._file.close()  # the file vanishes under the writer (disk gone, fd closed)
    ok.write_step(StepRecord(step=0))
    assert ok.error is not None
    ok.close()
