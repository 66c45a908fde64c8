"""Log semantics on real excerpts (tests/fixtures/SOURCES.md, section "Logs"): restarts
as attempts, counters, Megatron lines without their loss, named eval sets."""

from __future__ import annotations

import math
from pathlib import Path

from sapper.logs import read_log
from sapper.pipeline.logs import analyze_logs

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _spans(path: Path) -> list[tuple[int, int, int, int]]:
    log = read_log(path)
    return [(a.number, a.first_step, a.last_step, a.stop - a.start) for a in log.attempts]


def _nan_steps(path: Path) -> list[int]:
    return [r.step for r in read_log(path).records if r.loss is not None and math.isnan(r.loss)]


def test_bigscience_104b_rollback_to_6900_is_a_second_attempt() -> None:
    path = LOGS / "bigscience/tr8-104B-exp1-exp2-rollback-6210.log"
    assert _spans(path) == [(1, 7000, 7220, 3), (2, 6900, 6940, 5)]
    log = read_log(path)
    assert log.records[0].eval_loss == 7.1742  # the validation line stays with iteration 7000
    (analysis,) = analyze_logs([log], None, [], [])
    assert "at step 7,220 (attempt 2 resumes from step 6,900)" in analysis.notes[0]
    assert [a["records"] for a in analysis.summary()["attempts"]] == [3, 5]


def test_bloom_resumed_seven_times_from_one_checkpoint() -> None:
    spans = _spans(LOGS / "bigscience/tr11-176B-reshaping-resumes-94768.log")
    assert [s[1] for s in spans] == [94768] * 7
    assert [s[3] for s in spans] == [2, 1, 3, 2, 2, 3, 3]


def test_six_named_eval_sets_each_judged() -> None:
    path = LOGS / "hf/trainer_state_viz-6-eval-sets.trainer_state.json"
    log = read_log(path)
    named = {name for r in log.records for name in r.extra.get("eval_losses", {})}
    assert named == {f"g{i}" for i in range(6)}
    (analysis,) = analyze_logs([log], None, [], [])
    overfit = {f.data.get("eval_set") for f in analysis.findings if f.code == "R110"}
    assert overfit == named


def test_megatron_lines_without_their_loss() -> None:
    issues = LOGS / "megatron-issues"
    assert _nan_steps(issues / "epfllm-megatron-llm-33-falcon40b-nan-3385.log") == [3385]
    # 3633 lost its loss to a NaN; 3634 was skipped (its counter says so): no loss, no NaN
    assert _nan_steps(issues / "epfllm-megatron-llm-34-bad-grad-norm-skipped-3634.log") == [3633]
    nan_counter_zero = issues / "bigscience-megatron-deepspeed-396-grad-norm-nan.log"
    assert _nan_steps(nan_counter_zero) == [5426, 5427, 5428]
    # the first ten fp16 iterations all skipped during the loss-scale search: not NaN
    start = read_log(issues / "nvidia-nccl-743-bert-fp16-start.log")
    assert [(r.step, r.skipped, r.skipped_total, r.loss) for r in start.records] == [
        (10, True, 10, None), (20, None, None, 10.05022)
    ]
    # iteration lines the terminal wrapped before their loss: not NaN either
    assert _nan_steps(LOGS / "bigscience/tr11-176B-throughput-drop-42783.log") == []


def test_early_megatron_format_without_colons() -> None:
    log = read_log(LOGS / "megatron-issues/thudm-chinese-transformer-xl-7-loss-scale-0.1.log")
    assert [r.step for r in log.records] == list(range(400, 1201, 100))
    assert math.isnan(log.records[3].loss) and log.records[4].loss_scale == 0.1
