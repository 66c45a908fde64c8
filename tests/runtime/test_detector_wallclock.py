"""Wall-clock findings (R060-R062) on a noisy machine: dips that recover stay at info, a
sustained change is a warning that says whether it recovered.

``recorded/noisy-*.csv`` are real step times of a small NumPy training loop recorded while
competing processes spun on the same CPUs (tests/fixtures/record_noisy_steps.py):
``bursts`` (1.5 s on, 1.5 s off: a neighbour's short jobs) and ``constant``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sapper.logs import read_log
from sapper.rules.model import Severity
from sapper.runtime import DetectorSet, StepRecord
from sapper.runtime.detectors import ThroughputDetector

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _records(name: str) -> list[StepRecord]:
    return read_log(LOGS / name).records


def _warnings(found) -> list[str]:
    return [f.code for f in found if f.severity != Severity.INFO]


@pytest.mark.parametrize("name", ["recorded/noisy-bursts.csv", "recorded/noisy-constant.csv"])
def test_healthy_loop_under_competing_load_stays_quiet(name: str) -> None:
    records = _records(name)
    times = sorted(r.step_time_s for r in records)
    assert times[-1] > 3 * times[len(times) // 2]  # the recording really is noisy
    found = DetectorSet([ThroughputDetector()]).run(records)
    assert _warnings(found) == []


def test_a_burst_of_slow_steps_is_only_info() -> None:
    found = DetectorSet([ThroughputDetector()]).run(_records("recorded/noisy-bursts.csv"))
    slow = [f for f in found if f.code == "R061"]
    assert slow and all(f.severity == Severity.INFO for f in slow)
    assert "not sustained yet" in slow[0].message


def test_a_sustained_slowdown_on_the_same_machine_fires() -> None:
    records = _records("recorded/noisy-bursts.csv")
    for r in records:
        if r.step >= 300:
            r.step_time_s *= 2.0  # from step 300 on, every step takes twice as long
    found = DetectorSet([ThroughputDetector()]).run(records)
    warn = [f for f in found if f.code == "R061" and f.severity == Severity.WARNING]
    assert len(warn) == 1
    assert "not recovered by the end of the log" in warn[0].message
    assert 295 <= warn[0].data["episode_start"] <= 330


def _timed(n: int, slow: range, factor: float, t: float = 2.0) -> list[StepRecord]:
    return [
        StepRecord(step=s, step_time_s=t * (factor if s in slow else 1.0), tokens=8192)
        for s in range(n)
    ]


def test_sustained_for_the_stated_duration_fires_live_and_then_recovers() -> None:
    # 2 s steps, ×3 slower from 200 to 700: after 50 records and 600 s the warning comes
    # while it lasts (a live run cannot wait for the end); the recovery is reported.
    found = DetectorSet([ThroughputDetector()]).run(_timed(1000, range(200, 700), 3.0))
    r061 = [f for f in found if f.code == "R061"]
    warn = [f for f in r061 if f.severity == Severity.WARNING]
    assert len(warn) == 1 and 250 <= warn[0].step < 700
    assert "not recovered so far" in warn[0].message
    back = [f for f in r061 if f.data.get("recovered")]
    assert back and back[0].severity == Severity.INFO and 700 <= back[0].step <= 712
    assert "recovered at step" in back[0].message


def test_a_dip_shorter_than_the_stated_duration_is_info() -> None:
    # ×3 slower for 60 records of 2 s (6 min < 10 min): a neighbour's job, not the run.
    found = DetectorSet([ThroughputDetector()]).run(_timed(600, range(200, 260), 3.0))
    assert _warnings(found) == []
    assert any(f.code == "R061" for f in found)


def test_data_wait_burst_is_info_and_a_bottleneck_is_a_warning() -> None:
    def stream(waiting: range) -> list[StepRecord]:
        return [
            StepRecord(
                step=s,
                step_time_s=0.35 if s in waiting else 0.2,
                data_time_s=0.15 if s in waiting else 0.002,
            )
            for s in range(400)
        ]

    burst = DetectorSet([ThroughputDetector()]).run(stream(range(100, 130)))
    assert _warnings(burst) == [] and any(f.code == "R062" for f in burst)
    bottleneck = DetectorSet([ThroughputDetector()]).run(stream(range(150, 400)))
    # the step also got slower (0.2 → 0.35 s): R061 says so next to R062
    assert "R062" in _warnings(bottleneck)


def test_unevaluated_without_timing_fields() -> None:
    det = ThroughputDetector()
    DetectorSet([det]).run([StepRecord(step=s, loss=2.0) for s in range(50)])
    assert [line.split(" ")[0] for line in det.unevaluated()] == ["R060-R063"]
    det = ThroughputDetector()
    DetectorSet([det]).run(_timed(40, range(0), 1.0))
    codes = [line.split(" ")[0] for line in det.unevaluated()]
    assert codes == ["R060", "R061", "R062"]


def _constant_wait(n: int = 300) -> list[StepRecord]:
    # a toy dataset slow to build: 30% of every step, from the first to the last
    return [
        StepRecord(step=s, step_time_s=0.01, data_time_s=0.003, tokens=256) for s in range(n)
    ]


def test_a_constant_data_wait_is_reported_once_at_info() -> None:
    found = DetectorSet([ThroughputDetector()]).run(_constant_wait())
    assert _warnings(found) == []
    constant = [f for f in found if f.code == "R064"]
    assert len(constant) == 1 and constant[0].severity == Severity.INFO
    assert "30% of the step time" in constant[0].message and "0.003 s" in constant[0].message


def test_a_constant_data_wait_warns_when_the_plan_says_the_loader_keeps_up() -> None:
    from sapper.plan.schema import Plan
    from sapper.runtime.detectors import default_detectors

    plan = Plan.model_validate({"data": {"loader_tokens_per_sec": 1e6}})
    dets = [d for d in default_detectors(plan) if isinstance(d, ThroughputDetector)]
    found = DetectorSet(dets).run(_constant_wait())
    assert [f.code for f in found if f.severity == Severity.WARNING] == ["R062"]
    assert "keep up" in next(f for f in found if f.code == "R062").message


def test_a_data_wait_rising_above_its_early_level_warns() -> None:
    records = _constant_wait(400)
    for r in records[200:]:  # the loader slows down: 30% → 60% of the step
        r.data_time_s, r.step_time_s = 0.0105, 0.0175
    found = DetectorSet([ThroughputDetector()]).run(records)
    warn = [f for f in found if f.code == "R062" and f.severity == Severity.WARNING]
    assert len(warn) == 1 and 195 <= warn[0].data["episode_start"] <= 225
    assert "against 30%" in warn[0].message


def test_cpu_contention_measured_as_cpu_wait_is_not_a_slowdown() -> None:
    # from step 300 on a neighbour takes half the CPU: every step twice as long, half of
    # it waiting for a CPU (what the live monitor records as cpu_wait_s)
    def stream(with_wait: bool) -> list[StepRecord]:
        out = _timed(600, range(300, 600), 2.0, t=0.01)
        for r in out[300:]:
            if with_wait:
                r.extra["cpu_wait_s"] = 0.01
        return out

    assert "R061" in _warnings(DetectorSet([ThroughputDetector()]).run(stream(False)))
    assert _warnings(DetectorSet([ThroughputDetector()]).run(stream(True))) == []


def test_an_end_no_longer_than_the_dips_it_recovered_from_is_info() -> None:
    # a ×3 dip of 120 records that recovers, then another from step 560 to the end: over
    # a quarter of the log, but not twice as long as the dip the run recovered from
    def run(end_from: int) -> list[str]:
        slow = set(range(200, 320)) | set(range(end_from, 800))
        records = [
            StepRecord(step=s, step_time_s=0.03 if s in slow else 0.01, tokens=256)
            for s in range(800)
        ]
        return _warnings(DetectorSet([ThroughputDetector()]).run(records))

    assert run(560) == []
    assert run(450) == ["R061"]  # 350 records: longer than any dip, a persisting change
