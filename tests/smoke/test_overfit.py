"""S001/S002: a correct step overfits one batch and targets the next token; planted bugs
(learning rate 0, labels not shifted, labels shifted twice) are caught."""

from __future__ import annotations

from smoke_planted import NotShifted, ShiftedTwice

from sapper.smoke.context import SmokeConfig, Tolerances
from sapper.smoke.runner import run_smoke


def _statuses(report) -> dict[str, str]:
    return {f.code: f.data["status"] for f in report.findings}


def test_correct_step_overfits_and_targets_next_token(llama) -> None:
    report = run_smoke(llama, checks=["overfit"])
    s001, s002 = report.findings
    assert (s001.code, s001.data["status"]) == ("S001", "pass")
    assert s001.data["final_loss"] < 0.5 * s001.data["initial_loss"]
    assert (s002.code, s002.data["status"]) == ("S002", "pass")
    assert s002.data["pairs_loss_over_ln_k"] < 0.7
    assert s002.data["keys_loss_over_ln_k"] >= 0.9


def test_zero_learning_rate_cannot_overfit(llama) -> None:
    report = run_smoke(llama, config=SmokeConfig(lr=0.0, steps=10), checks=["overfit"])
    s001 = report.findings[0]
    assert s001.data["status"] == "fail"
    assert s001.data["final_loss"] == s001.data["initial_loss"]
    assert report.exit_code() == 1


def test_labels_not_shifted_are_caught(llama) -> None:
    report = run_smoke(llama, step=NotShifted(), checks=["overfit"])
    statuses = _statuses(report)
    # the copy task is easy: the loss falls, so only the probe can tell
    assert statuses == {"S001": "pass", "S002": "fail"}
    s002 = report.findings[1]
    assert s002.data["keys_loss_over_ln_k"] < 0.5
    assert "not shifted" in s002.message


def test_labels_shifted_twice_are_caught(llama) -> None:
    quick = SmokeConfig(steps=10, tolerances=Tolerances(probe_max_steps=100))
    report = run_smoke(llama, step=ShiftedTwice(), config=quick, checks=["overfit"])
    s002 = report.findings[1]
    assert s002.data["status"] == "fail"
    assert abs(s002.data["pairs_loss_over_ln_k"] - 1.0) < 0.1
    assert "shifted twice" in s002.message
