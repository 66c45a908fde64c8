"""Where the evidence of a cause began, read back from the records
(``sapper.diagnose.onset``): before the step a detector was sure, never after it."""

from __future__ import annotations

from sapper.diagnose.onset import onset_of
from sapper.logs.analysis import Analysis
from sapper.logs.base import LogData
from sapper.rules.model import Finding
from sapper.rules.registry import get_rule
from sapper.runtime.records import StepRecord


def _analysis(records: list[StepRecord]) -> Analysis:
    return Analysis(LogData("run.log", "test", records), [], 1, [], {})


def _finding(code: str, step: int) -> Finding:
    return get_rule(code).finding("planted", step=step)


def test_a_scale_decline_began_below_its_last_peak_not_the_highest() -> None:
    scales = [1024, 2048, 4096, 2048, 4096, 8192, 8192, 4096, 1024, 256, 64]
    recs = [StepRecord(step=10 * i, loss_scale=s) for i, s in enumerate(scales)]
    assert onset_of(_analysis(recs), _finding("R030", 100)) == 70


def test_a_memory_rise_began_after_its_low_point() -> None:
    memory = [2.0, 2.1, 2.0, 2.0, 2.0, 2.0, 2.1, 2.3, 2.5, 2.7, 2.9]
    recs = [StepRecord(step=i, memory_allocated_gib=m) for i, m in enumerate(memory)]
    assert onset_of(_analysis(recs), _finding("R051", 10)) == 6


def test_repeated_samples_began_at_the_first_repeat() -> None:
    hashes = [["a"], ["b"], ["c"], ["a"], ["b"], ["c"]]
    recs = [StepRecord(step=i, extra={"sample_hashes": h}) for i, h in enumerate(hashes)]
    assert onset_of(_analysis(recs), _finding("R072", 5)) == 3


def test_a_sign_the_records_do_not_trace_begins_where_it_was_found() -> None:
    recs = [StepRecord(step=i, loss=1.0) for i in range(5)]
    assert onset_of(_analysis(recs), _finding("R013", 3)) == 3
    assert onset_of(_analysis(recs), _finding("R051", 3)) == 3  # no memory in the log
