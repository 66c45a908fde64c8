"""S012: the TrainStep contract. The default step and the documented examples keep it; each
planted step breaks one clause and the finding names that clause."""

from __future__ import annotations

import pytest
import smoke_planted as planted

from sapper.smoke.runner import run_smoke
from sapper.smoke.step import DefaultTrainStep


def _s012(factory, step):
    (s012,) = run_smoke(factory, step=step, checks=["contract"]).findings
    assert s012.code == "S012"
    return s012


def test_default_step_keeps_every_clause(llama) -> None:
    s012 = _s012(llama, DefaultTrainStep())
    assert s012.data["status"] == "pass", s012.message
    assert all(c["kept"] for c in s012.data["clauses"].values())
    assert set(s012.data["clauses"]) == {
        "returns",
        "gradients",
        "no optimizer",
        "accumulates",
        "tokens",
        "grad_scale",
        "precision",
        "wrapper",
    }


def test_frozen_parameters_are_no_breach() -> None:
    from sapper.smoke.toy import user_factory

    s012 = _s012(user_factory(planted.partly_frozen_lm), DefaultTrainStep())
    assert s012.data["status"] == "pass", s012.message


@pytest.mark.parametrize(
    ("step", "clause", "words"),
    [
        (planted.ZeroesGradsItself(), "accumulates", "zero_grad inside it"),
        (planted.StepsTheOptimizer(), "no optimizer", "changed the weights"),
        (planted.ForwardThroughModule(), "wrapper", "through model.module"),
        (planted.NoSyncEveryMicroBatch(), "wrapper", "never all-reduced"),
        (planted.ScaleNotReported(), "grad_scale", "not the factor"),
        (planted.IgnoresPrecision(), "precision", "torch.autocast"),
    ],
)
def test_each_broken_clause_is_named(llama, step, clause: str, words: str) -> None:
    s012 = _s012(llama, step)
    assert s012.data["status"] == "fail", s012.message
    assert s012.data["broken"] == [clause], s012.message
    assert words in s012.message


def test_a_hand_written_loop_breaks_what_it_forgot(llama) -> None:
    """The per-micro-batch loop of smoke_planted never opens autocast, reports tokens=0 and
    all-reduces every micro-batch: the contract names all three; its accumulation bug
    itself is S003's business."""
    s012 = _s012(llama, planted.PerMicroBatchMean())
    assert s012.data["status"] == "fail", s012.message
    assert s012.data["broken"] == ["precision"]
    assert s012.data["warnings"] == ["tokens", "no_sync"]
    assert "reported tokens=0" in s012.message


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["ZLossStep", "HFLossStep"])
def test_documented_examples_pass_every_check(llama, name: str) -> None:
    """The two worked examples of docs/train-step.md, loaded by file path as a user would."""
    from sapper.smoke.userref import import_callable

    step = import_callable(f"{EXAMPLES / 'steps.py'}:{name}", "--step")()
    report = run_smoke(llama, step=step)
    failed = {f.code: f.message for f in report.findings if f.data["status"] != "pass"}
    assert not failed, failed
    assert {f.code for f in report.findings} == {f"S{i:03d}" for i in range(1, 13)}


EXAMPLES = __import__("tests_smoke_paths").ROOT / "examples" / "smoke"
