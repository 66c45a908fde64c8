"""Restarts: a log that repeats step numbers holds several attempts, all kept."""

from __future__ import annotations

import json
import math
from pathlib import Path

from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.logs.base import StepMerger
from sapper.pipeline.logs import analyze_logs, detectors_for, merge_logs
from sapper.runtime.detectors import default_detectors


def _megatron(step: int, loss: float, scale: float = 4096.0) -> str:
    return (
        f" iteration {step:8d}/   20000 | consumed samples: {step * 96:12d} | elapsed time per "
        f"iteration (ms): 18500.0 | learning rate: 6.000E-05 | global batch size:    96 | "
        f"lm loss: {loss:.6E} | loss scale: {scale} | grad norm: 0.400 | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |"
    )


def _wobble(step: int) -> float:
    return 2.5 - 0.0002 * step + 0.01 * math.sin(step / 7.0)


def _rollback_log(tmp_path: Path) -> Path:
    """Attempt 1 runs to step 1200 with a spike at 1190; attempt 2 resumes from 1100."""
    lines = []
    for step in range(10, 1201, 10):
        loss = 8.0 if step == 1190 else 7.0 if step == 1200 else _wobble(step)
        lines.append(_megatron(step, loss))
    lines.append(" validation loss at iteration 1200 | lm loss value: 7.1E+00 | lm loss PPL: 12 |")
    lines += [_megatron(step, _wobble(step)) for step in range(1100, 1601, 10)]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_spike_before_a_rollback_is_found_and_named(tmp_path: Path) -> None:
    log = read_log(_rollback_log(tmp_path))
    assert len(log.records) == 120 + 51
    assert [(a.number, a.first_step, a.last_step, a.stop - a.start) for a in log.attempts] == [
        (1, 10, 1200, 120), (2, 1100, 1600, 51)
    ]
    assert log.records[119].eval_loss == 7.1  # the validation line stays with its iteration
    (analysis,) = analyze_logs([log], None, [], [])
    spikes = [f for f in analysis.findings if f.code == "R002"]
    assert [(f.step, f.data["attempt"]) for f in spikes][:1] == [(1190, 1)]
    assert analysis.notes[0] == (
        "rolled back at step 1,200 (attempt 2 resumes from step 1,100) after a loss spike "
        "at step 1,190 (R002)"
    )
    summary = analysis.summary()
    assert summary["interval"] == 10 and summary["gaps"] == []
    first, second = summary["attempts"]
    assert first["ended_by"]["code"] == "R002" and first["ended_by"]["step"] == 1190
    assert second == {"number": 2, "first_step": 1100, "last_step": 1600, "records": 51}


def test_each_attempt_gets_fresh_detectors(tmp_path: Path) -> None:
    """Attempt 2 replays the healthy steps; a detector carrying attempt 1's state would
    compare them with the spike and the rolled-back steps."""
    log = read_log(_rollback_log(tmp_path))
    analysis = analyze_log(log, detectors_for(None))
    later = [f for f in analysis.findings if f.data.get("attempt") == 2 and f.code == "R002"]
    assert later == []


def test_a_restart_without_trouble_is_only_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [{"step": s, "loss": _wobble(s)} for s in [*range(1, 61), *range(41, 101)]]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (analysis,) = analyze_logs([read_log(path)], None, [], [])
    assert "restarted at step 60 (attempt 2 resumes from step 41)" in analysis.notes
    assert analysis.interval == 1 and analysis.gaps == []
    assert all("ended_by" not in a for a in analysis.summary()["attempts"])


def test_stored_findings_are_kept_once(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    lines = [{"kind": "meta", "version": 1}]
    lines += [{"kind": "step", "step": s, "loss": 2.0} for s in range(1, 21)]
    lines.append({"kind": "finding", "code": "R001", "severity": "error", "check": "loss",
                  "title": "t", "message": "m", "fix": "f", "step": 12})
    lines += [{"kind": "step", "step": s, "loss": 2.0} for s in range(10, 31)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    log = read_log(path)
    assert [a.first_step for a in log.attempts] == [1, 10]
    analysis = analyze_log(log, default_detectors())
    assert [f.code for f in analysis.findings if f.code == "R001"] == ["R001"]


def test_trainer_state_and_csv_restarts(tmp_path: Path) -> None:
    state = tmp_path / "trainer_state.json"
    history = [{"step": s, "loss": 1.0, "learning_rate": 1e-4} for s in (10, 20, 30, 20, 30, 40)]
    state.write_text(json.dumps({"log_history": history, "global_step": 40}))
    log = read_log(state)
    assert [(a.first_step, a.last_step) for a in log.attempts] == [(10, 30), (20, 40)]
    table = tmp_path / "m.csv"
    table.write_text("step,loss\n1,2\n2,2\n3,2\n2,2\n3,2\n")
    assert [(a.first_step, a.last_step) for a in read_log(table).attempts] == [(1, 3), (2, 3)]


def test_tensorboard_style_merger_keeps_its_semantics() -> None:
    notes: list[str] = []
    merger = StepMerger(notes, ordered=False)
    for step in (1, 2, 3):
        merger.put(step, {"loss": 1.0})
    for step in (1, 2, 3):  # the second tag of the same steps: interleaved, not a restart
        merger.put(step, {"lr": 0.1})
    out = merger.flush()
    assert [r.step for r in out] == [1, 2, 3] and len(merger.tracker.attempts) == 1


def test_merge_joins_a_clean_resume_and_splits_a_rollback(tmp_path: Path) -> None:
    def table(name: str, steps: range) -> Path:
        path = tmp_path / name
        path.write_text("step,loss\n" + "".join(f"{s},2.0\n" for s in steps))
        return path

    a, b, c = table("a.csv", range(1, 51)), table("b.csv", range(51, 101)), table(
        "c.csv", range(81, 121)
    )
    merged = merge_logs([read_log(c), read_log(a), read_log(b)])
    assert [(x.number, x.first_step, x.last_step, x.stop - x.start) for x in merged.attempts] == [
        (1, 1, 100, 100), (2, 81, 120, 40)
    ]
    assert [r.step for r in merged.records[98:102]] == [99, 100, 81, 82]


def test_trainer_state_snapshot_of_a_resumed_run_is_a_new_attempt() -> None:
    from sapper.logs import TrainerStateParser

    def snap(entries: list[tuple[int, float]]) -> str:
        return json.dumps({"log_history": [{"step": s, "loss": v} for s, v in entries]})

    parser = TrainerStateParser()
    old = [(s, 2.0 - s / 1000) for s in range(10, 121, 10)]
    assert [r.step for r in parser.parse(snap(old))] == list(range(10, 121, 10))
    assert parser.parse(snap(old)) == []  # the same snapshot again: nothing new
    # resumed from checkpoint-100 (its history ends at 100), then logged 110, 120 again
    resumed = [*old[:10], (110, 1.5), (120, 1.4), (130, 1.3)]
    assert [(r.step, r.loss) for r in parser.parse(snap(resumed))] == [
        (110, 1.5), (120, 1.4), (130, 1.3)
    ]
    assert [(a.number, a.first_step, a.last_step) for a in parser.attempts] == [
        (1, 10, 120), (2, 110, 130)
    ]
    grown = [*resumed, (140, 1.2)]
    assert [r.step for r in parser.parse(snap(grown))] == [140]
    assert len(parser.attempts) == 2


def test_trouble_in_the_steps_thrown_away_explains_the_rollback(tmp_path: Path) -> None:
    """The spike is 300 steps before the end, but in the steps the resume logs again."""
    lines = [_megatron(s, 8.0 if s == 900 else 7.0 if s > 900 else _wobble(s))
             for s in range(10, 1201, 10)]
    lines += [_megatron(s, _wobble(s)) for s in range(800, 1001, 10)]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    (analysis,) = analyze_logs([read_log(path)], None, [], [])
    assert analysis.notes[0].startswith(
        "rolled back at step 1,200 (attempt 2 resumes from step 800) after a loss spike at "
        "step 900"
    )


def test_a_megatron_resume_that_logs_only_its_first_iteration() -> None:
    """Two iteration lines of one step are that step logged twice: two attempts."""
    from sapper.logs import MegatronParser

    parser = MegatronParser()
    lines = [_megatron(s, 2.0) for s in (100, 101, 100, 100, 101)]
    records = parser.feed(lines) + parser.finish()
    assert [r.step for r in records] == [100, 101, 100, 100, 101]
    assert [(a.first_step, a.last_step) for a in parser.attempts] == [
        (100, 101), (100, 100), (100, 101)
    ]


def test_what_a_detector_could_not_evaluate_is_carried_per_attempt(tmp_path: Path) -> None:
    from sapper.runtime.detector import Detector

    class Blind(Detector):
        rules = ()

        def __init__(self) -> None:
            self.seen = 0

        def update(self, record):  # type: ignore[no-untyped-def]
            self.seen += 1
            return []

        def unevaluated(self) -> list[str]:
            return [f"R999 test: not evaluated — {self.seen} records"]

    path = tmp_path / "m.csv"
    path.write_text("step,loss\n" + "".join(f"{s},2.0\n" for s in [1, 2, 3, 2, 3, 4, 5]))
    analysis = analyze_log(read_log(path), [Blind()])
    # attempt 2 resumes from step 2: its detector saw step 1 first, then its own four
    assert analysis.unevaluated == [
        "attempt 1: R999 test: not evaluated — 3 records",
        "attempt 2: R999 test: not evaluated — 5 records",
    ]
    assert analysis.summary()["not_evaluated"] == analysis.unevaluated
