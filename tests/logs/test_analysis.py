"""The analyzer: detectors over a log, live findings merged, gaps and failures noted."""

from __future__ import annotations

from pathlib import Path

from sapper.logs import read_log
from sapper.logs.analysis import analyze_log, log_interval
from sapper.logs.base import LogData
from sapper.runtime.detector import Detector
from sapper.runtime.detectors.eval import EVAL_OVERFIT
from sapper.runtime.detectors.loss import LOSS_SPIKE
from sapper.runtime.records import StepRecord


class _Fires(Detector):
    def update(self, record: StepRecord):
        if record.loss is not None and record.loss > 5:
            return [LOSS_SPIKE.finding(f"loss {record.loss}", step=record.step)]
        return []

    def finish(self):
        return [EVAL_OVERFIT.finding("end of stream", step=None)]


class _Broken(Detector):
    def update(self, record: StepRecord):
        raise ZeroDivisionError("boom")


def test_findings_sorted_sourced_selected() -> None:
    recs = [StepRecord(step=s, loss=9.0 if s in (30, 70) else 1.0) for s in range(10, 101, 10)]
    log = LogData("run.csv", "csv", recs)
    a = analyze_log(log, [_Fires(), _Broken()])
    assert [(f.code, f.step) for f in a.findings] == [("R110", None), ("R002", 30), ("R002", 70)]
    assert all(f.source == "run.csv" for f in a.findings)
    assert a.interval == 10 and a.gaps == []
    assert any("_Broken failed" in n and "boom" in n for n in a.notes)
    only = analyze_log(log, [_Fires()], ignore=["R1"])
    assert {f.code for f in only.findings} == {"R002"}


def test_live_findings_are_kept_and_deduplicated() -> None:
    recs = [StepRecord(step=s, loss=9.0 if s == 30 else 1.0) for s in range(10, 51, 10)]
    live = [
        LOSS_SPIKE.finding("seen live", step=30),
        EVAL_OVERFIT.finding("seen live only", step=40),
    ]
    a = analyze_log(LogData("run.jsonl", "sapper", recs, findings=live), [_Fires()])
    spikes = [f for f in a.findings if f.code == "R002"]
    assert len(spikes) == 1 and spikes[0].message == "seen live"
    assert any(f.message == "seen live only" for f in a.findings)


def test_sparse_log_with_a_gap(examples: Path) -> None:
    log = read_log(examples / "megatron-gpt345m-fp16.log")
    log.records = [r for r in log.records if not 1000 < r.step < 2000]
    a = analyze_log(log, [])
    assert a.interval == 10
    assert a.gaps == [(1000, 2000)]
    assert "no records between steps 1000 and 2000" in a.notes


def test_log_interval_edge_cases() -> None:
    assert log_interval([]) == (None, [])
    assert log_interval([5]) == (None, [])
    assert log_interval([1, 2, 3, 100]) == (1, [(3, 100)])
